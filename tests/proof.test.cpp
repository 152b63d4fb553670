// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/proof.hpp: every verdict, on small hand-written tables; both ways a send may wait.
#include "support/catch.hpp"

#include <mpx/proof.hpp>
#include <mpx/user_table.hpp>

using namespace mpx;

namespace
{
Proof prove_text(std::string_view text, int ranks, int m, int stages = -1)
{
  return prove(detail::user_table(text, Layout::looped(ranks, stages < 0 ? ranks : stages, m)));
}
}  // namespace

TEST_CASE("A correct table is proved", "[proof]")
{
  const Proof p = prove_text("F0 F1 B0 B1; F0 B0 F1 B1", 2, 2);
  CHECK(p.ok());
  CHECK(p.makespan == 9);
  CHECK(p.busy[0] == 6);
}

TEST_CASE("Deadlock: a forward waits for a send that comes after a backward that waits for it", "[proof]")
{
  for (Sends sends : {Sends::wait_for_receive, Sends::never_wait}) {  // computes wait on each other: any transport
    const Proof p = prove(detail::user_table("F0 B0 F1 B1; F0 F1 B0 B1", Layout::looped(2, 2, 2)), sends);
    CHECK(p.verdict == Verdict::deadlock);
    CHECK(p.rank == 0);  // rank 0 waits for micro-batch 0's gradient from rank 1 ...
    CHECK(p.action == Action{Op::RecvB, 0, 0});
    CHECK(p.peer == 1);  // ... which waits for micro-batch 1's activation, sent after that backward
    CHECK(p.peer_action == Action{Op::RecvF, 1, 1});
  }
}

TEST_CASE("Sends that never wait (NCCL's order, a group per channel) remove the deadlocks of sends that wait for their receive", "[proof]")
{
  // ZB-H1 at 3 stages, shuffled, its receives posted late (from nccl_order.test.cpp's random tables): on
  // Gloo rank 0 waits for micro-batch 2's gradient while rank 1's send of micro-batch 3's activation waits
  // for rank 2 to post its receive; on NCCL's order with a group per channel that send does not wait
  const auto t = detail::user_table("RB0 F0 F1 F2 I0 RB1 W0 F3 I1 RB2 W1 I2 RB3 W2 I3 W3 ;"
                                    "RF0 F0 RF1 F1 RB0 I0 RF2 F2 RB1 I1 RF3 W0 F3 W1 RB2 RB3 I2 I3 W3 W2 ;"
                                    "RF0 RF1 F0 I0 F1 RF2 I1 F2 I2 W0 RF3 F3 I3 W1 W2 W3",
                                    Layout::looped(3, 3, 4));
  const Proof gloo = prove(t), nccl = prove(t, Sends::never_wait);
  CHECK(gloo.verdict == Verdict::deadlock);
  CHECK(gloo.rank == 0);
  CHECK(gloo.action == Action{Op::RecvB, 0, 2});
  CHECK(gloo.peer == 1);
  CHECK(gloo.peer_action == Action{Op::SendF, 1, 3});
  CHECK(nccl.ok());
  // where both finish, the timeline is the same (it always takes sends as asynchronous)
  const auto ok = detail::user_table("F0 F1 B0 B1; F0 B0 F1 B1", Layout::looped(2, 2, 2));
  CHECK(prove(ok).makespan == prove(ok, Sends::never_wait).makespan);
}

TEST_CASE("Receives may be posted as late as the step before their compute", "[proof]")
{
  // A step posts its receives before its sends leave, so a neighbour blocked in a send to us is always
  // released by our next compute: posting just before use is late but safe.
  CHECK(prove_text("F0 F1 RB0 B0 RB1 B1; RF0 F0 B0 RF1 F1 B1", 2, 2).ok());
  // not posted at all before the compute that consumes it: refused
  CHECK(prove_text("F0 F1 B0 RB0 B1; RF0 F0 B0 RF1 F1 B1", 2, 2).verdict == Verdict::out_of_order);
}

TEST_CASE("Unmatched messages: the receiver consumes micro-batches in another order", "[proof]")
{
  const Proof p = prove_text("F0 F1 B0 B1; F1 B1 F0 B0", 2, 2);
  CHECK(p.verdict == Verdict::unmatched_messages);
  CHECK(p.rank == 1);
}

TEST_CASE("Out of order: backward before forward, W before I, compute before its receive is posted", "[proof]")
{
  CHECK(prove_text("B0 F0; F0 B0", 2, 1).verdict == Verdict::out_of_order);
  CHECK(prove_text("F0 I0 W0; F0 W0 I0", 2, 1).verdict == Verdict::out_of_order);
  CHECK(prove_text("F0 RB0 B0; F0 B0", 2, 1).ok());
  CHECK(prove_text("F0 B0 RB0; F0 B0", 2, 1).verdict == Verdict::out_of_order);  // posted after its compute
}

TEST_CASE("Duplicate, foreign and unfinished actions", "[proof]")
{
  CHECK(prove_text("F0 F0 B0; F0 B0", 2, 1).verdict == Verdict::duplicate_action);
  CHECK(prove_text("F0 B0 1:F0; F0 B0", 2, 1).verdict == Verdict::foreign_action);  // stage 1 lives on rank 1
  CHECK(prove_text("F0 F5 B0; F0 B0", 2, 2).verdict == Verdict::foreign_action);    // micro-batch 5 >= m
  const Proof u = prove_text("F0 B0; F0 B0", 2, 2);
  CHECK(u.verdict == Verdict::unfinished_microbatch);
  CHECK(u.action.mb == 1);
  CHECK(u.action.op == Op::F);
  CHECK(prove_text("F0 I0; F0 I0 W0", 2, 1).verdict == Verdict::unfinished_microbatch);  // W0 missing on rank 0
}

TEST_CASE("Shape: rank count and stage naming must fit the layout", "[proof]")
{
  CHECK(prove_text("F0 B0; F0 B0; F0 B0", 2, 1).verdict == Verdict::bad_shape);
  // two stages on rank 0: tokens must name the stage
  CHECK(prove_text("F0 B0; F0 B0", 2, 1, 4).verdict == Verdict::bad_shape);
  CHECK(prove_text("0:F0 2:F0 2:B0 0:B0; 1:F0 3:F0 3:B0 1:B0", 2, 1, 4).ok());
}

TEST_CASE("Split and full backward are not mixed within a stage", "[proof]")
{
  CHECK(prove_text("F0 F1 B0 I1 W1; F0 B0 F1 B1", 2, 2).verdict == Verdict::unfinished_microbatch);
  CHECK(prove_text("F0 F1 I0 W0 I1 W1; F0 I0 F1 I1 W0 W1", 2, 2).ok());
}

TEST_CASE("The proof is a constant expression", "[proof][static]")
{
  constexpr Proof ok = prove(detail::user_table("F0 F1 B0 B1; F0 B0 F1 B1", Layout::looped(2, 2, 2)));
  STATIC_REQUIRE(ok.ok());
  constexpr Proof dead = prove(detail::user_table("F0 B0 F1 B1; F0 F1 B0 B1", Layout::looped(2, 2, 2)));
  STATIC_REQUIRE(dead.verdict == Verdict::deadlock);
}
