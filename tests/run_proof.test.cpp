// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/run_proof.hpp: the proof of a compressed table fast-forwards the steady state (its work does
// not grow with m) and finds each failure where the flat proof of the expanded table does.
#include "support/catch.hpp"

#include <mpx/run_proof.hpp>
#include <mpx/schedule.hpp>

using namespace mpx;

TEST_CASE("The run proof fast-forwards the steady state: its work does not grow with m", "[runs][proof]")
{
  for (int m : {256, 512, 4096}) {
    const Proof a = prove(OneFOneB::runs(Layout::looped(8, 8, m)));
    CHECK(a.ok());
    CHECK(a.steps == 8 * 2 * m);
    CHECK(a.simulated == prove(OneFOneB::runs(Layout::looped(8, 8, 256))).simulated);  // the same few hundred
    CHECK(a.simulated < 300);
  }
  const Proof big = prove(OneFOneB::runs(Layout::looped(64, 64, 512)));  // the compile-time benchmark's case
  CHECK(big.ok());
  CHECK(big.steps == 65536);
  CHECK(big.simulated < 9000);  // about 2 p²: warm-up, fill and drain
  CHECK(prove(GPipe::runs(Layout::looped(64, 64, 512))).simulated < 15000);  // 13,504: three receives posted ahead fill later
  const Proof zb = prove(ZBH1::runs(Layout::looped(64, 64, 512)));
  CHECK(zb.ok());
  CHECK(zb.steps == 64 * 3 * 512);
  CHECK(zb.simulated < 20000);  // about 4.6 p²: each stage enters its steady pattern at its own time
  CHECK(zb.simulated == prove(ZBH1::runs(Layout::looped(64, 64, 2048))).simulated);
  STATIC_REQUIRE(prove(OneFOneB::runs(Layout::looped(16, 16, 4096))).ok());  // at compile time, 131,072 steps
}

namespace
{
/// A hand-written run table of `ranks` ranks (one stage each) and m micro-batches.
struct Hand
{
  detail::run_builder b;
  Hand(int ranks, int m, int look = 1) : b(Layout::looped(ranks, ranks, m), look) {}
};
}  // namespace

TEST_CASE("Run proof failures match the flat proof's verdict and place", "[runs][proof]")
{
  auto both = [](const RunTable& rt) {
    const Proof runs = prove(rt), flat = prove(to_table(rt));
    INFO("flat: " << verdict_text(flat.verdict) << " at " << flat.rank << ":" << flat.step << ", runs: " << verdict_text(runs.verdict)
                  << " at " << runs.rank << ":" << runs.step);
    CHECK(runs.verdict == flat.verdict);
    CHECK(runs.rank == flat.rank);
    CHECK(runs.step == flat.step);
    CHECK(runs.action == flat.action);
    return runs.verdict;
  };
  {  // a correct 1F1B by hand, the steady state as a repeated pattern
    Hand h(2, 6);
    h.b.span(0, Op::F, 0, 0, 1);
    h.b.repeat(0, {{Op::F, 0, 1}, {Op::B, 0, 0}}, 5);
    h.b.put(0, Op::B, 0, 5);
    h.b.repeat(1, {{Op::F, 1, 0}, {Op::B, 1, 0}}, 6);
    CHECK(both(h.b.finish()) == Verdict::ok);
  }
  {  // the steady run repeats once too often: its last forward names micro-batch 6 of 6
    Hand h(2, 6);
    h.b.span(0, Op::F, 0, 0, 1);
    h.b.repeat(0, {{Op::F, 0, 1}, {Op::B, 0, 0}}, 6);
    h.b.repeat(1, {{Op::F, 1, 0}, {Op::B, 1, 0}}, 6);
    CHECK(both(h.b.finish()) == Verdict::foreign_action);
  }
  {  // a backward before its forward
    Hand h(2, 2);
    h.b.put(0, Op::B, 0, 0);
    h.b.span(0, Op::F, 0, 0, 2);
    h.b.put(0, Op::B, 0, 1);
    h.b.repeat(1, {{Op::F, 1, 0}, {Op::B, 1, 0}}, 2);
    CHECK(both(h.b.finish()) == Verdict::out_of_order);
  }
  {  // a forward twice
    Hand h(1, 3);
    h.b.span(0, Op::F, 0, 0, 2);
    h.b.put(0, Op::F, 0, 1);
    CHECK(both(h.b.finish()) == Verdict::duplicate_action);
  }
  {  // a stage left without its last backward
    Hand h(1, 3);
    h.b.span(0, Op::F, 0, 0, 3);
    h.b.span(0, Op::B, 0, 0, 2);
    CHECK(both(h.b.finish()) == Verdict::unfinished_microbatch);
  }
  {  // a stage on the wrong rank
    Hand h(2, 1);
    h.b.put(0, Op::F, 1, 0);
    CHECK(both(h.b.finish()) == Verdict::foreign_action);
  }
  {  // rank 0 waits for a gradient before sending its second activation; rank 1 wants that activation first
    Hand h(2, 2);
    h.b.repeat(0, {{Op::F, 0, 0}, {Op::B, 0, 0}}, 2);
    h.b.span(1, Op::F, 1, 0, 2);
    h.b.span(1, Op::B, 1, 0, 2);
    CHECK(both(h.b.finish()) == Verdict::deadlock);
  }
}

TEST_CASE("Under sends that never wait the run proof agrees with the flat proof, and still fast-forwards", "[runs][proof]")
{
  auto same = [](const RunTable& rt) {
    const Proof runs = prove(rt, Sends::never_wait), flat = prove(to_table(rt), Sends::never_wait), gloo = prove(rt);
    CHECK(runs.verdict == flat.verdict);
    CHECK(runs.makespan == flat.makespan);
    CHECK(runs.makespan == gloo.makespan);  // the timeline takes sends as asynchronous either way
    for (int r = 0; r < runs.ranks; ++r) {
      CHECK(runs.busy[r] == flat.busy[r]);
      CHECK(runs.peak_in_flight[r] == flat.peak_in_flight[r]);
    }
    return runs.ok();
  };
  for (int p : {2, 3, 4, 8})
    for (int m : {1, 2, 3, 5, 8, 16, 33}) {
      CHECK(same(GPipe::runs(Layout::looped(p, p, m))));
      CHECK(same(OneFOneB::runs(Layout::looped(p, p, m))));
      CHECK(same(ZBH1::runs(Layout::looped(p, p, m))));
      if (m % p == 0) CHECK(same(Interleaved1F1B::runs(Layout::looped(p, 2 * p, m))));
    }
  // p = 64, m = 512: the Pipeline's compile-time bar; a rank that never blocks yields after each repetition,
  // so that the steady state shows as early as under Gloo's waits
  const Proof g = prove(GPipe::runs(Layout::looped(64, 64, 512)), Sends::never_wait);
  const Proof o = prove(OneFOneB::runs(Layout::looped(64, 64, 512)), Sends::never_wait);
  const Proof z = prove(ZBH1::runs(Layout::looped(64, 64, 512)), Sends::never_wait);
  CHECK((g.ok() && o.ok() && z.ok()));
  CHECK(g.simulated < 6000);   // 4,800 (Gloo's: 13,504)
  CHECK(o.simulated < 9000);   // 8,576, as Gloo's
  CHECK(z.simulated < 15000);  // 13,056 (Gloo's: 18,816)
  CHECK(o.simulated == prove(OneFOneB::runs(Layout::looped(64, 64, 4096)), Sends::never_wait).simulated);
  STATIC_REQUIRE(prove(OneFOneB::runs(Layout::looped(16, 16, 4096)), Sends::never_wait).ok());
}
