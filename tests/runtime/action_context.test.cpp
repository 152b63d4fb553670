// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/runtime/action_context.hpp: where an error happened, and the kind of error a failure of one
// schedule action becomes.
#include "support/rooms.hpp"

TEST_CASE("An action's failure names rank, step, action and peer, as a peer or a stage error", "[rooms][action_context]")
{
  mpx::World w;
  w.env.rank = 1, w.slot = 1, w.replica = 0;
  const mpx::Action f3{mpx::Op::F, 1, 3};
  const std::string with_peer = mpx::action_context(w, 2, 7, f3, 0), without = mpx::action_context(w, 2, 7, f3, -1);
  CHECK(with_peer == "mpx: rank 1 (slot 1, replica 0), step 2, action 7 F3 of stage 1, peer rank 0");
  CHECK(without == "mpx: rank 1 (slot 1, replica 0), step 2, action 7 F3 of stage 1");
  auto failure = [](auto e) { return std::make_exception_ptr(e); };
  CHECK_THROWS_WITH(mpx::report_failure(failure(mpx::peer_error("mpx: the header is short")), with_peer, without, 1),
                    with_peer + ": the header is short");
  CHECK_THROWS_AS(mpx::report_failure(failure(mpx::peer_error("x")), with_peer, without, 1), mpx::peer_error);
  CHECK_THROWS_WITH(mpx::report_failure(failure(mpx::peer_error("mpx: rank 4 (slot 0): located")), with_peer, without, 1),
                    "mpx: rank 4 (slot 0): located");  // located already: as it is
  CHECK_THROWS_WITH(mpx::report_failure(failure(std::runtime_error("shape mismatch")), with_peer, without, 1),
                    without + ": stage 1 failed: shape mismatch");
  CHECK_THROWS_AS(mpx::report_failure(failure(std::runtime_error("x")), with_peer, without, 1), mpx::stage_error);
  CHECK_THROWS_AS(mpx::report_failure(failure(mpx::config_error("x")), with_peer, without, 1), mpx::config_error);
}
