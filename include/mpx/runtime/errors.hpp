// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file runtime/errors.hpp
/// The two errors the runtime raises: `config_error` for what the user can fix before launching (world
/// size, devices, mismatched binaries, malformed input), `peer_error` for what went wrong between ranks
/// (a dead or silent peer, a message that breaks the boundary type). Messages state the values, the rule
/// and the fix.

#include <stdexcept>  // std::invalid_argument, std::runtime_error
#include <string>     // std::string

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

}  // namespace mpx
