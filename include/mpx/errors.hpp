// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file errors.hpp
/// The errors the runtime raises. `config_error`: what the user can fix before launching (world size,
/// devices, mismatched binaries, malformed input, a checkpoint of another pipeline). `peer_error`: what went
/// wrong between ranks (a dead or silent peer, a message that breaks the boundary type). `stage_error`: a
/// stage's own failure on this rank (its forward or loss throwing, a shape error in its backward) — this
/// rank's fault, not the peer's it was talking to.
///
/// Every message starts with `mpx: `, then where — an API call (`mpx: Trainer::step: ...`) or a place in
/// the run (`mpx: rank 1 (slot 1, replica 0), step 2, action 7 F3 of stage 1[, peer rank 0]: ...`; steps
/// and micro-batches are 0-based) — then the values, the rule and the fix.

#include <stdexcept>    // std::invalid_argument, std::runtime_error
#include <string>       // std::string
#include <string_view>  // std::string_view

namespace mpx
{

/// A configuration the run cannot start with; the message names the fix.
struct config_error : std::invalid_argument
{
  using std::invalid_argument::invalid_argument;
};

/// A failure between ranks: names rank, step, schedule action and peer.
struct peer_error : std::runtime_error
{
  using std::runtime_error::runtime_error;
};

/// A stage's own failure on this rank: names rank, step, schedule action and stage.
struct stage_error : std::runtime_error
{
  using std::runtime_error::runtime_error;
};

namespace detail
{
/// `where` as the start of a message: with the `mpx: ` prefix, added unless it is there.
inline std::string error_start(std::string_view where)
{
  return where.starts_with("mpx: ") ? std::string(where) : "mpx: " + std::string(where);
}
/// A message to nest after another's place: without its own `mpx: ` prefix.
inline std::string nested(std::string_view message)
{
  return std::string(message.starts_with("mpx: ") ? message.substr(5) : message);
}
}  // namespace detail

}  // namespace mpx
