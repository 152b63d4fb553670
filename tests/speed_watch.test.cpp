// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/speed_watch.hpp: a slot behind the plan for `patience` steps in a row is named, its measured speed is
// what the seconds say, noise within the tolerance and a single slow step are not stragglers, bad input is named.
#include "support/catch.hpp"

#include <mpx/speed_watch.hpp>

using namespace mpx;

TEST_CASE("A slot that computes at half its assumed speed for three steps is the straggler, at 0.5x", "[speed_watch]")
{
  SpeedWatch w({6.0, 3.0});  // slot 0 predicted twice slot 1's compute, equal speeds assumed
  CHECK_FALSE(w.observe({9.0, 1.0}));  // the warm-up step is not judged
  CHECK_FALSE(w.observe({2.0, 1.0}));  // as planned: 2/6 = 1/3 per unit on both
  CHECK(w.straggler() == -1);
  CHECK_FALSE(w.observe({4.0, 1.0}));  // slot 0 at half speed: 2/3 per unit against 1/3
  CHECK_FALSE(w.observe({4.0, 1.0}));
  CHECK(w.straggler() == -1);
  CHECK(w.observe({4.0, 1.0}));  // the third step in a row confirms it
  CHECK(w.straggler() == 0);
  const auto m = w.measured();
  REQUIRE(m.size() == 2);
  CHECK(m[0] == Approx(0.5));
  CHECK(m[1] == Approx(1.0));
  CHECK_FALSE(w.observe({4.0, 1.0}));  // confirmed once: still the straggler, not announced again
  CHECK(w.straggler() == 0);
  CHECK(w.describe().find("slot 0 computes at 0.50x the speed the plan assumed") != std::string::npos);
  CHECK(w.describe().find("measured speeds 0.5, 1") != std::string::npos);
  CHECK_FALSE(w.observe({2.0, 1.0}));  // back to speed: no straggler any more
  CHECK(w.straggler() == -1);
}

TEST_CASE("Speeds assumed by the plan: a slot as slow as assumed is not behind, and measured speeds scale from the assumed", "[speed_watch]")
{
  // the plan put less work on slot 1 because it assumed it half as fast: predicted compute in the fastest slot's time
  SpeedWatch w({4.0, 4.0}, {1.0, 0.5});
  for (int i = 0; i < 5; ++i) CHECK_FALSE(w.observe({2.0, 2.0}));
  CHECK(w.straggler() == -1);
  CHECK(w.measured() == std::vector<double>{1.0, 0.5});  // none behind: what the plan assumed
  // slot 1 recovers its full speed: slot 0 is now the slower per unit, by 2x; its measured speed relative is 0.5 of slot 1's 1.0
  SpeedWatch r({4.0, 4.0}, {1.0, 0.5});
  r.observe({2.0, 2.0});
  for (int i = 0; i < 3; ++i) r.observe({2.0, 1.0});
  CHECK(r.straggler() == 0);
  CHECK(r.measured()[0] == Approx(1.0));
  CHECK(r.measured()[1] == Approx(1.0));
}

TEST_CASE("Noise within the tolerance and a slow step that does not persist are not stragglers", "[speed_watch]")
{
  SpeedWatch w({1.0, 1.0, 1.0}, {}, SpeedWatchOptions{.tolerance = 0.25, .patience = 3, .warmup = 0});
  CHECK_FALSE(w.observe({1.2, 1.0, 1.1}));  // 20 % apart: within
  CHECK_FALSE(w.observe({2.0, 1.0, 1.0}));  // behind once
  CHECK_FALSE(w.observe({1.0, 1.0, 1.0}));  // and not again: the streak ends
  CHECK_FALSE(w.observe({2.0, 1.0, 1.0}));
  CHECK_FALSE(w.observe({1.0, 2.0, 1.0}));  // another slot behind: a new streak
  CHECK_FALSE(w.observe({1.0, 2.0, 1.0}));
  CHECK(w.straggler() == -1);
  CHECK(w.observe({1.0, 2.0, 1.0}));
  CHECK(w.straggler() == 1);
}

TEST_CASE("A watch with no slots, mismatched speeds, or seconds for other slots is refused by name", "[speed_watch]")
{
  CHECK_THROWS_WITH(SpeedWatch({}), Catch::Contains("no slots"));
  CHECK_THROWS_WITH(SpeedWatch({1.0, 1.0}, {1.0}), Catch::Contains("give one per slot"));
  CHECK_THROWS_WITH(SpeedWatch({1.0, 0.0}), Catch::Contains("slot 1"));
  SpeedWatch w({1.0, 1.0});
  CHECK_THROWS_WITH(w.observe({1.0}), Catch::Contains("1 slots' seconds for 2 slots"));
}
