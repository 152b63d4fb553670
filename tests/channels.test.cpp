// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/channels.hpp: the channel and peer arithmetic the proof and the executor share.
#include "support/catch.hpp"

#include <mpx/channels.hpp>

namespace
{
using mpx::Op;
constexpr int S = 5;
}  // namespace

static_assert(mpx::activation_channel(0) == 0 && mpx::gradient_channel(0) == 1 && mpx::activation_channel(3) == 6);
static_assert(mpx::num_channels(4) == 8);
static_assert(mpx::recv_channel(Op::F, 0, S) == -1 && mpx::send_channel(Op::F, S - 1, S) == -1);
static_assert(mpx::recv_channel(Op::B, S - 1, S) == -1 && mpx::send_channel(Op::B, 0, S) == -1);
static_assert(mpx::recv_channel(Op::W, 2, S) == -1 && mpx::send_channel(Op::W, 2, S) == -1);

TEST_CASE("What one stage's compute sends, the next stage's compute receives, on the same channel", "[channels]")
{
  for (int s = 0; s + 1 < S; ++s) {
    CAPTURE(s);
    CHECK(mpx::send_channel(Op::F, s, S) == mpx::recv_channel(Op::F, s + 1, S));  // activations forward
    CHECK(mpx::send_channel(Op::B, s + 1, S) == mpx::recv_channel(Op::B, s, S));  // gradients back
    CHECK(mpx::send_channel(Op::I, s + 1, S) == mpx::recv_channel(Op::I, s, S));
    CHECK(!mpx::is_gradient_channel(mpx::send_channel(Op::F, s, S)));
    CHECK(mpx::is_gradient_channel(mpx::send_channel(Op::B, s + 1, S)));
  }
}

TEST_CASE("A communication action's channel is its compute's, and its peer the stage at the other end", "[channels]")
{
  for (int s = 0; s < S; ++s) {
    CAPTURE(s);
    if (s > 0) {
      CHECK(mpx::channel_of(Op::RecvF, s) == mpx::recv_channel(Op::F, s, S));
      CHECK(mpx::channel_of(Op::SendB, s) == mpx::send_channel(Op::B, s, S));
      CHECK(mpx::peer_stage(Op::RecvF, s, S) == s - 1);
      CHECK(mpx::peer_stage(Op::SendB, s, S) == s - 1);
      CHECK(mpx::peer_stage(Op::F, s, S) == s - 1);
    } else {
      CHECK(mpx::peer_stage(Op::F, s, S) == -1);
    }
    if (s + 1 < S) {
      CHECK(mpx::channel_of(Op::SendF, s) == mpx::send_channel(Op::F, s, S));
      CHECK(mpx::channel_of(Op::RecvB, s) == mpx::recv_channel(Op::B, s, S));
      CHECK(mpx::peer_stage(Op::SendF, s, S) == s + 1);
      CHECK(mpx::peer_stage(Op::RecvB, s, S) == s + 1);
      CHECK(mpx::peer_stage(Op::B, s, S) == s + 1);
    }
    CHECK(mpx::peer_stage(Op::W, s, S) == -1);
  }
}

TEST_CASE("A message names the stage whose input boundary it describes", "[channels]")
{
  for (int b = 0; b + 1 < S; ++b) {
    CHECK(mpx::message_stage(mpx::activation_channel(b)) == b + 1);  // the consumer of activations
    CHECK(mpx::message_stage(mpx::gradient_channel(b)) == b + 1);    // the producer of the gradients
  }
}

TEST_CASE("The cost model: forward 1, full backward 2, each half of a split backward 1", "[channels]")
{
  CHECK(mpx::cost_of(Op::F) == 1);
  CHECK(mpx::cost_of(Op::B) == 2);
  CHECK(mpx::cost_of(Op::I) + mpx::cost_of(Op::W) == mpx::cost_of(Op::B));
  CHECK(mpx::cost_of(Op::SendF) == 0);
}
