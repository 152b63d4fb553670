// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file channels.hpp
/// Where a pipeline's messages travel: the one source of channel and peer arithmetic, called by the
/// compile-time proof (proof.hpp) and by the executor (runtime/executor.hpp) alike.
///
/// Boundary b lies between stage b and stage b + 1. Each boundary has two directed channels:
/// `activation_channel(b)` = 2b carries stage b's output forward to stage b + 1, `gradient_channel(b)` =
/// 2b + 1 carries the gradient of that output back. Messages on one channel are matched first in, first
/// out. A compute receives on at most one channel and sends on at most one:
///
/// | action of stage s | receives on            | sends on               | its peer stage |
/// |---|---|---|---|
/// | F                 | activation(s - 1)      | activation(s)          | s - 1 (in), s + 1 (out) |
/// | B, I              | gradient(s)            | gradient(s - 1)        | s + 1 (in), s - 1 (out) |
/// | W                 | —                      | —                      | — |

#include <mpx/action.hpp>  // mpx::Op

namespace mpx
{

/// Directed channels of a pipeline of `stages` stages (two per boundary; the last stage's pair is unused).
constexpr int num_channels(int stages) { return 2 * stages; }
/// Stage `boundary`'s output, forward to stage boundary + 1.
constexpr int activation_channel(int boundary) { return 2 * boundary; }
/// The gradient of stage `boundary`'s output, back from stage boundary + 1.
constexpr int gradient_channel(int boundary) { return 2 * boundary + 1; }
constexpr bool is_gradient_channel(int channel) { return channel % 2 == 1; }

/// The channel compute `op` of stage `s` (of `stages`) consumes a message from; -1 when none.
constexpr int recv_channel(Op op, int s, int stages)
{
  if (op == Op::F) return s > 0 ? activation_channel(s - 1) : -1;
  if (op == Op::B || op == Op::I) return s + 1 < stages ? gradient_channel(s) : -1;
  return -1;
}

/// The channel compute `op` of stage `s` (of `stages`, the first `forward_only` of them running forward
/// only) sends its result on; -1 when none. No gradient goes back to a forward-only stage.
constexpr int send_channel(Op op, int s, int stages, int forward_only = 0)
{
  if (op == Op::F) return s + 1 < stages ? activation_channel(s) : -1;
  if (op == Op::B || op == Op::I) return s > forward_only && s > 0 ? gradient_channel(s - 1) : -1;
  return -1;
}

/// The channel of a communication action (`RecvF`, `SendF`, `RecvB`, `SendB`) of stage `s`: the channel
/// its compute receives on or sends on.
constexpr int channel_of(Op op, int s)
{
  switch (op) {
    case Op::RecvF: return activation_channel(s - 1);
    case Op::SendF: return activation_channel(s);
    case Op::RecvB: return gradient_channel(s);
    case Op::SendB: return gradient_channel(s - 1);
    default: return -1;
  }
}

/// The stage at the other end of action `op` of stage `s` (of `stages`); -1 when it talks to nobody.
/// For a compute, the stage it receives from.
constexpr int peer_stage(Op op, int s, int stages)
{
  switch (op) {
    case Op::F:
    case Op::RecvF: return s > 0 ? s - 1 : -1;
    case Op::SendF: return s + 1 < stages ? s + 1 : -1;
    case Op::B:
    case Op::I:
    case Op::RecvB: return s + 1 < stages ? s + 1 : -1;
    case Op::SendB: return s > 0 ? s - 1 : -1;
    default: return -1;
  }
}

/// The stage whose input boundary a message on `channel` describes (the wire header's stage field): the
/// consumer of activations, the producer of gradients — stage b + 1 for both channels of boundary b.
constexpr int message_stage(int channel) { return channel / 2 + 1; }

}  // namespace mpx
