// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/pipeline.hpp: queries, defaults, boundaries of layer ranges, proofs.
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

TEST_CASE("Queries return integral constants", "[pipeline][static]")
{
  STATIC_REQUIRE(decltype(num_stages<TwoStage>())::value == 2);
  STATIC_REQUIRE(num_slots<TwoStage>() == 2);
  STATIC_REQUIRE(num_microbatches<TwoStage>() == 2);  // default: one per slot
  STATIC_REQUIRE(std::is_same_v<TwoStage::schedule, OneFOneB>);  // default schedule
  STATIC_REQUIRE(slot_of<1, TwoStage>() == 1);
  STATIC_REQUIRE(num_stages_v<FourStage> == 4);
  STATIC_REQUIRE(num_microbatches_v<FourStage> == 8);
  STATIC_REQUIRE(slot_of_v<3, FourStage> == 3);
  STATIC_REQUIRE(num_chunks<Looped>() == 2);
  STATIC_REQUIRE(std::is_same_v<decltype(stages_on_slot<0, Looped>()), std::integer_sequence<int, 0, 2>>);
  STATIC_REQUIRE(std::is_same_v<decltype(stages_on_slot<1, Looped>()), std::integer_sequence<int, 1, 3>>);
}

TEST_CASE("Layer ranges exchange the module's hidden type", "[pipeline][static]")
{
  STATIC_REQUIRE(std::is_same_v<FourStage::input_of<1>, Pair>);     // first range takes input_type
  STATIC_REQUIRE(std::is_same_v<FourStage::output_of<1>, Tensor>);  // inner ranges pass hidden_type
  STATIC_REQUIRE(std::is_same_v<FourStage::input_of<2>, Tensor>);
  STATIC_REQUIRE(std::is_same_v<FourStage::output_of<3>, Tensor>);  // last range returns output_type
  STATIC_REQUIRE(std::is_same_v<FourStage::output_of<0>, Pair>);
}

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
