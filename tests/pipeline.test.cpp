// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/pipeline.hpp: defaults, proofs, frozen stages, declared costs (queries: pipeline_queries.test.cpp;
// boundaries and layer ranges: stage_chain.test.cpp).
#include "support/archetypes.hpp"
#include "support/catch.hpp"

#include <string_view>

using namespace mpx;
using namespace archetypes;

namespace
{
using TwoStage = Pipeline<Stage<Vision, GPU<0>, Frozen>, Stage<Text, GPU<1>, Optimizer<AdamW8bit>>>;

using FourStage = Pipeline<Stage<Vision, CPU<0>, Frozen, Reads<"images">>,                  //
                           Stage<Text, CPU<1>, Layers<0, 3>>,                                //
                           Stage<Text, CPU<2>, Layers<3, 6>>,                                //
                           Stage<Text, CPU<3>, Layers<6, to_end>, Reads<"labels">>,         //
                           mpx::Batch<archetypes::Batch>, Schedule<GPipe>, Microbatches<8>>;

using Looped = Pipeline<Stage<Block, CPU<0>>, Stage<Block, CPU<1>>, Stage<Block, CPU<0>>, Stage<Block, CPU<1>>,
                        Schedule<Interleaved1F1B>, Microbatches<4>>;

using Long = Pipeline<Stage<Block, CPU<0>>, Stage<Block, CPU<1>>, Microbatches<100000>>;  // 1F1B: a compressed table
struct FlatZBH1  // ZB-H1's table without its compressed form
{
  static constexpr std::string_view name = "flat ZB-H1";
  static constexpr bool interleaved = false;
  static constexpr bool split_backward = true;
  static constexpr Table table(const Layout& l) { return ZBH1::table(l); }
};
using Big = Pipeline<Stage<Block, CPU<0>>, Stage<Block, CPU<1>>, Schedule<FlatZBH1>, Microbatches<4096>>;
using BigRuns = Pipeline<Stage<Block, CPU<0>>, Stage<Block, CPU<1>>, Schedule<ZBH1>, Microbatches<4096>>;
}  // namespace

TEST_CASE("Compressed schedules are proved at compile time whatever m is, large flat tables at start-up", "[pipeline]")
{
  STATIC_REQUIRE(TwoStage::proved_at_compile_time);
  STATIC_REQUIRE(proof_v<TwoStage>.ok());
  STATIC_REQUIRE(proof_v<FourStage>.ok());
  STATIC_REQUIRE(proof_v<Looped>.ok());
  STATIC_REQUIRE(Long::run_form);
  STATIC_REQUIRE(Long::proved_at_compile_time);
  STATIC_REQUIRE(proof_v<Long>.ok());
  STATIC_REQUIRE(proof_v<Long>.steps == 400000);
  STATIC_REQUIRE(proof_v<Long>.simulated < 100);  // the steady state is fast-forwarded
  STATIC_REQUIRE(BigRuns::run_form);             // every built-in schedule has runs
  STATIC_REQUIRE(BigRuns::proved_at_compile_time);
  STATIC_REQUIRE(proof_v<BigRuns>.ok());
  STATIC_REQUIRE(!Big::run_form);                // a schedule with only a flat table
  STATIC_REQUIRE(!Big::proved_at_compile_time);  // 24,576 steps
  const Proof p = proof<Big>();
  CHECK(p.ok());
  CHECK(p.peak_in_flight[0] == 2);
}

TEST_CASE("The frozen table is the table", "[pipeline]")
{
  constexpr auto& f = table_v<FourStage>;
  const Table t = FourStage::make_table();
  STATIC_REQUIRE(f.num_ranks() == 4);
  REQUIRE(f.steps.size() == t.steps.size());
  for (std::size_t i = 0; i < t.steps.size(); ++i) {
    CHECK(f.steps[i].op == t.steps[i].op);
    CHECK(f.steps[i].mb == t.steps[i].mb);
    CHECK(f.steps[i].post_end == t.steps[i].post_end);
  }
  CHECK(prove(f).ok());
}

TEST_CASE("Slots may be in any order for one-stage-per-slot schedules", "[pipeline]")
{
  using Reversed = Pipeline<Stage<Block, CPU<1>>, Stage<Block, CPU<0>>, Microbatches<3>>;
  STATIC_REQUIRE(slot_of<0, Reversed>() == 1);
  STATIC_REQUIRE(proof_v<Reversed>.ok());
  const Table t = Reversed::make_table();
  CHECK(t.rank(1)[0].stage == 0);  // stage 0 runs on rank 1
}

TEST_CASE("A user table that splits some stages' backward freezes to its exact size", "[pipeline]")
{
  // stage 0 full backward, stage 1 split into I and W
  using U = Pipeline<Stage<Block, CPU<0>>, Stage<Block, CPU<1>>, Schedule<UserTable<"F0 F1 B0 B1 ; F0 I0 F1 I1 W0 W1">>,
                     Microbatches<2>>;
  STATIC_REQUIRE(U::num_steps == 10);
  STATIC_REQUIRE(proof_v<U>.ok());
  CHECK(table_v<U>.steps.size() == 10);
  CHECK(prove(table_v<U>).ok());
}

namespace
{
/// Whether any rank of P's table has a backward of stage s, or any rank sends or receives a gradient on
/// boundary b (stage b's output).
template <class P>
constexpr bool any_backward(int s)
{
  const Table t = P::make_table();
  for (int r = 0; r < t.num_ranks(); ++r)
    for (const Step& c : t.rank(r))
      if (c.stage == s && c.op != Op::F) return true;
  return false;
}
template <class P>
constexpr bool any_gradient_message(int boundary)
{
  const Table t = P::make_table();
  for (int r = 0; r < t.num_ranks(); ++r)
    for (const Action& a : expand(t, r))
      if ((a.op == Op::SendB && a.stage == boundary + 1) || (a.op == Op::RecvB && a.stage == boundary)) return true;
  return false;
}
template <class Sched, int M = 4>
using FrozenFirst = Pipeline<Stage<Block, CPU<0>, Frozen>, Stage<Block, CPU<1>>, Stage<Block, CPU<2>>, Schedule<Sched>, Microbatches<M>>;
}  // namespace

TEST_CASE("A Frozen stage with nothing trainable before it runs forward only in every built-in schedule: no backward, no gradient message, no activation in flight", "[pipeline][static][frozen]")
{
  STATIC_REQUIRE(FrozenFirst<GPipe>::forward_only_stages == 1);
  STATIC_REQUIRE(TwoStage::forward_only_stages == 1);
  STATIC_REQUIRE(FourStage::forward_only_stages == 1);
  STATIC_REQUIRE(Looped::forward_only_stages == 0);
  [&]<class... S>(detail::type_list<S...>) {
    (([] {
       using P = FrozenFirst<S>;
       STATIC_REQUIRE(P::layout.forward_only == 1);
       STATIC_REQUIRE(proof_v<P>.ok());
       STATIC_REQUIRE(!any_backward<P>(0));
       STATIC_REQUIRE(any_backward<P>(1));
       STATIC_REQUIRE(!any_gradient_message<P>(0));  // stage 1 sends nothing back to stage 0
       STATIC_REQUIRE(any_gradient_message<P>(1));
       STATIC_REQUIRE(proof_v<P>.peak_in_flight[0] == 0);  // its forwards keep nothing for a backward
       STATIC_REQUIRE(proof_v<P>.busy[0] == 4);          // four forwards of one unit
       STATIC_REQUIRE(P::num_steps == 4 + 2 * 4 * (S::split_backward ? 3 : 2));
       CHECK(table_v<P>.steps.size() == P::num_steps);
       CHECK(prove(table_v<P>).ok());
     }()),
     ...);
  }(detail::type_list<GPipe, OneFOneB, ZBH1>{});
  // interleaved: stage 0 (forward only) and stage 2 share slot 0
  using Inter = Pipeline<Stage<Block, CPU<0>, Frozen>, Stage<Block, CPU<1>>, Stage<Block, CPU<0>>, Stage<Block, CPU<1>>,
                         Schedule<Interleaved1F1B>, Microbatches<4>>;
  STATIC_REQUIRE(proof_v<Inter>.ok());
  STATIC_REQUIRE(!any_backward<Inter>(0));
  STATIC_REQUIRE(any_backward<Inter>(2));
  STATIC_REQUIRE(!any_gradient_message<Inter>(0));
  // the compressed and flat proofs agree on it, and the step is shorter than training stage 0 too
  using Trained = Pipeline<Stage<Block, CPU<0>>, Stage<Block, CPU<1>>, Stage<Block, CPU<2>>, Schedule<OneFOneB>, Microbatches<4>>;
  constexpr Proof flat = prove(FrozenFirst<OneFOneB>::make_table()), runs = prove(OneFOneB::runs(FrozenFirst<OneFOneB>::layout));
  STATIC_REQUIRE(flat.makespan == runs.makespan);
  STATIC_REQUIRE(flat.peak_in_flight[1] == runs.peak_in_flight[1]);
  STATIC_REQUIRE(proof_v<FrozenFirst<OneFOneB>>.makespan < proof_v<Trained>.makespan);
}

TEST_CASE("Leading Frozen stages all run forward only, and a Frozen stage after a trainable one still runs backward (its gradient flows through)", "[pipeline][static][frozen]")
{
  using TwoFrozen = Pipeline<Stage<Block, CPU<0>, Frozen>, Stage<Block, CPU<1>, Frozen>, Stage<Block, CPU<2>>, Microbatches<4>>;
  STATIC_REQUIRE(TwoFrozen::forward_only_stages == 2);
  STATIC_REQUIRE(!any_backward<TwoFrozen>(1));
  STATIC_REQUIRE(!any_gradient_message<TwoFrozen>(1));
  using Middle = Pipeline<Stage<Block, CPU<0>>, Stage<Block, CPU<1>, Frozen>, Stage<Block, CPU<2>>, Microbatches<4>>;
  STATIC_REQUIRE(Middle::forward_only_stages == 0);
  STATIC_REQUIRE(any_backward<Middle>(1));
  STATIC_REQUIRE(any_gradient_message<Middle>(0));  // stage 1 sends stage 0 its gradient
  STATIC_REQUIRE(proof_v<Middle>.peak_in_flight[1] > 0);
}

TEST_CASE("A user table that gives a forward-only stage a backward fails its proof", "[pipeline][frozen]")
{
  constexpr Layout l = TwoStage::layout;
  STATIC_REQUIRE(prove(detail::user_table("F0 F1 ; F0 B0 F1 B1", l)).ok());
  constexpr Proof bad = prove(detail::user_table("F0 F1 B0 B1 ; F0 B0 F1 B1", l));
  STATIC_REQUIRE(bad.verdict == Verdict::forward_only_backward);
  STATIC_REQUIRE(bad.rank == 0);
  STATIC_REQUIRE(bad.step == 2);
}

TEST_CASE("Where a stage sits on a GPU the pipeline is proved under NCCL's order too", "[pipeline][static]")
{
  STATIC_REQUIRE(TwoStage::on_gpus);
  STATIC_REQUIRE(TwoStage::nccl_order_proof.ok());
  STATIC_REQUIRE(TwoStage::nccl_order_proof.steps == TwoStage::num_steps);  // run, not assumed
  STATIC_REQUIRE(TwoStage::nccl_order_proof.makespan == proof_v<TwoStage>.makespan);
  using Gpus = Pipeline<Stage<Block, GPU<0>>, Stage<Block, GPU<1>>, Stage<Block, GPU<2>>, Schedule<ZBH1>, Microbatches<64>>;
  STATIC_REQUIRE(Gpus::nccl_order_proof.ok());
  STATIC_REQUIRE(Gpus::nccl_order_proof.steps == 3 * 3 * 64);
  // CPU ranks: Gloo's order, which implies NCCL's (the stand-in's); not run again
  STATIC_REQUIRE(!FourStage::on_gpus);
  STATIC_REQUIRE(FourStage::nccl_order_proof.steps == 0);
}
