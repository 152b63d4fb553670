// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/runtime/split_state.hpp: a stage splits only when the schedule splits, the split is chosen
// and its module marks blocks; the marks are checked once, and a stage without them is said once.
#include "support/catch.hpp"

#include <mpx/runtime/split_state.hpp>

#include <sstream>

TEST_CASE("A stage splits when the schedule splits, the split is chosen and its module marks blocks", "[split_state]")
{
  mpx::SplitState none(2, false);
  CHECK(!none.schedule_splits());
  CHECK(!none.splitting(0));  // 1F1B: nothing to split

  mpx::SplitState s(2, true);
  CHECK(s.chosen());  // chosen until the trainer says otherwise
  CHECK(s.splitting(0));
  CHECK(!s.checked(0));
  CHECK(!s.ran_split(0));
  std::ostringstream log;
  CHECK(s.check_marks(0, true, 3, "ZB-H1", log));  // stage 0 marks its blocks: it splits
  CHECK(s.ran_split(0));
  CHECK(!s.check_marks(1, false, 3, "ZB-H1", log));  // stage 1 does not: its I runs the whole backward
  CHECK(!s.splitting(1));
  CHECK(!s.ran_split(1));
  CHECK(log.str().find("mpx: rank 3, stage 1: its module marks no mpx::checkpoint_block boundaries") != std::string::npos);
  CHECK(!s.check_marks(1, true, 3, "ZB-H1", log));  // checked once: a later I does not change it
  CHECK(log.str().find("stage 1", log.str().find("stage 1") + 1) == std::string::npos);  // said once
  s.choose(false);
  CHECK(!s.splitting(0));
  CHECK(s.ran_split(0));  // what it found stays
}
