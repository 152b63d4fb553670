// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/runtime/split_decision.hpp: which steps split under each mode, which are the measured
// trials, the choice from the slowest rank's trial walks, the collective on a one-rank world, the message;
// and the executor's side of it: a ZB-H1 walk with the split off runs the whole backward in I and nothing
// in W, and walks that switch between the two ways still give plain LibTorch's gradients. (On real ranks,
// with data-parallel replicas, the decision and parity: runtime.test.cpp.)
#include "support/rooms.hpp"

#include <mpx/runtime/split_decision.hpp>

#include <sstream>

using mpx::SplitBackward;
using mpx::SplitDecision;

TEST_CASE("Which steps split: always, never, and measure (step 0 warms up, then split and whole alternate)", "[rooms][split]")
{
  const SplitDecision always(true, SplitBackward::always, 3), never(true, SplitBackward::never, 3), measure(true, SplitBackward::measure, 3),
      no_w(false, SplitBackward::always, 3);
  for (long k = 0; k < 10; ++k) {
    CAPTURE(k);
    CHECK(always.split_at(k));
    CHECK(!never.split_at(k));
    CHECK(!no_w.split_at(k));  // a schedule without W (1F1B) has nothing to split
    CHECK(measure.split_at(k) == (k == 0 || k % 2 == 1));
    CHECK(measure.trial(k) == (k >= 1 && k <= 6));
    CHECK(!always.trial(k));
  }
  CHECK(measure.measuring());
  CHECK(!always.measuring());
  CHECK_THROWS_WITH(SplitDecision(true, SplitBackward::measure, 0), Catch::Contains("split_trials is 0") && Catch::Contains("always or never"));
}

TEST_CASE("record keeps the trial steps' walks and says when the last trial is done", "[rooms][split]")
{
  SplitDecision d(true, SplitBackward::measure, 2);
  CHECK(!d.record(0, 9.0));  // warm-up: not kept
  CHECK(!d.record(1, 1.0));
  CHECK(!d.record(2, 2.0));
  CHECK(!d.record(3, 1.0));
  CHECK(d.record(4, 2.0));   // the last trial: decide now
  CHECK(!d.record(5, 1.0));  // after the trials: not kept
}

TEST_CASE("The choice: the split iff it is clearly faster than the whole backward, step beside step", "[rooms][split]")
{
  SECTION("split faster")
  {
    SplitDecision d(true, SplitBackward::measure, 3);
    d.choose(true, {0.010, 0.012, 0.030 /* an outlier */, 0.012, 0.010, 0.011});
    CHECK(d.decided());
    CHECK(d.split());
    CHECK(d.split_seconds() == 0.010);
    CHECK(d.whole_seconds() == 0.012);
    for (long k = 7; k < 12; ++k) CHECK(d.split_at(k));
    CHECK(d.ratio() == Approx(0.010 / 0.011));  // the pairs: 0.83, 2.5 (the outlier), 0.91
    CHECK(d.message().find("split into I and W 10.00 ms, whole in I 12.00 ms, split / whole 0.909 (the split stays below 0.98): keeps the split") !=
          std::string::npos);
  }
  SECTION("within the margin: whole (1F1B's order, fewer calls)")
  {
    SplitDecision d(true, SplitBackward::measure, 3);
    d.choose(true, {0.0099, 0.0100, 0.0099, 0.0100, 0.0100, 0.0101});  // each split 1 % faster
    CHECK(d.split_seconds() < d.whole_seconds());
    CHECK(d.ratio() > 1 - mpx::split_margin);
    CHECK(!d.split());
  }
  SECTION("whole faster")
  {
    SplitDecision d(true, SplitBackward::measure, 2);
    d.choose(true, {0.014, 0.012, 0.013, 0.011});
    CHECK(!d.split());
    CHECK(d.split_seconds() == Approx(0.0135));
    for (long k = 5; k < 12; ++k) CHECK(!d.split_at(k));
    CHECK(d.message().find("runs the whole backward in I from now on") != std::string::npos);
    CHECK(d.message().find("split_backward = always") != std::string::npos);
  }
  SECTION("no rank's stage splits (no marked blocks): whole, whatever the times")
  {
    SplitDecision d(true, SplitBackward::measure, 1);
    d.choose(false, {0.001, 0.002});
    CHECK(!d.split());
  }
}

TEST_CASE("decide is a collective over the world, and rank 0 says the choice", "[rooms][split]")
{
  auto w = test::one_rank_world<rooms::P1>();
  SplitDecision d(true, SplitBackward::measure, 1);
  d.record(1, 0.004);
  REQUIRE(d.record(2, 0.005));
  std::ostringstream log;
  d.decide(w, true, log);
  CHECK(d.split());
  CHECK(log.str().find("mpx: ZB-H1's backward, measured over this run's steps 1-2") != std::string::npos);
  SplitDecision none(true, SplitBackward::measure, 1);
  none.record(1, 0.001), none.record(2, 0.005);
  std::ostringstream quiet;
  none.decide(w, false, quiet);  // nothing splits anywhere: the fallback was said already
  CHECK(!none.split());
  CHECK(quiet.str().empty());
}

TEST_CASE("A ZB-H1 walk with the split off runs the whole backward in I, and walks that switch ways keep plain LibTorch gradients", "[rooms][split][executor]")
{
  using PZb = mpx::Pipeline<mpx::Stage<tiny::Model, mpx::CPU<0>, mpx::Layers<0, 6>>, mpx::Schedule<mpx::ZBH1>, mpx::Microbatches<4>,
                            mpx::Batch<tiny::Batch>>;
  auto w = test::one_rank_world<PZb>();
  mpx::StageSet<PZb> set(0, torch::kCPU, rooms::make, {});
  mpx::Executor<PZb, tiny::Batch> ex(w, set, [](const tiny::Batch& b) { return b.tokens; }, tiny::loss);
  auto ref = rooms::make_model();
  bool ran_before = false;
  for (const bool split : {false, true, false}) {
    CAPTURE(split);
    const auto mbs = rooms::microbatches(split ? 1 : 0);
    for (auto& mb : mbs) (tiny::loss(ref->forward(mb.tokens), mb) / 4.0).backward();
    ex.choose_split(split);
    CHECK(ex.split().splitting(0) == split);
    std::vector<std::string> events;
    ex.walk(mbs, 1.0, 0, nullptr, [&](int s) { events.push_back("last " + std::to_string(s)); },
            [&](int s) { events.push_back("done " + std::to_string(s)); });
    CHECK(events == std::vector<std::string>{"last 0", "done 0"});  // before the last backward that computes weights
    CHECK(ex.split().ran_split(0) == (split || ran_before));  // known once it split
    ran_before = ex.split().ran_split(0);
    auto mine = set.parameters(0), theirs = ref->parameters();      // gradients accumulated over the walks
    for (std::size_t i = 0; i < mine.size(); ++i) CHECK(torch::allclose(mine[i].grad(), theirs[i].grad(), 1e-5, 1e-7));
  }
  CHECK(ex.split().ran_split(0));
}
