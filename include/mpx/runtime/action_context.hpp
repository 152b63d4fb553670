// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file runtime/action_context.hpp
/// Where in a run an error happened, as every runtime error names it (errors.hpp): `action_context` gives
/// "mpx: rank 1 (slot 1, replica 0), step 2, action 7 F3 of stage 1, peer rank 0", and `report_failure`
/// turns an exception from one schedule action into the error the run stops with — a `peer_error` for what
/// came from the wire (located once: a receive names its own action), a `stage_error` for the stage's own
/// code, a `config_error` as it is.

#include <mpx/action.hpp>               // mpx::Action, mpx::op_name
#include <mpx/linkage.hpp>              // MPX_DECL, MPX_DEFINITIONS
#include <mpx/runtime/world/world.hpp>  // mpx::World

#include <cstddef>    // std::size_t
#include <exception>  // std::exception_ptr
#include <string>     // std::string

namespace mpx
{

/// "mpx: rank 1 (slot 1, replica 0), step 2, action 7 F3 of stage 1[, peer rank 0]" (`peer_rank` -1: none).
MPX_DECL std::string action_context(const World& w, long step, std::size_t k, Action a, int peer_rank);

/// Rethrows `failure`, an exception from action `k` (`a`), as the error the run stops with (see the file
/// comment); `context` is `action_context` with its peer, `stage_context` without.
[[noreturn]] MPX_DECL void report_failure(std::exception_ptr failure, const std::string& context, const std::string& stage_context, int stage);

}  // namespace mpx

#if MPX_DEFINITIONS
// ---- definitions (compiled once under MPX_SEPARATE_COMPILATION: linkage.hpp) ----
#include <mpx/errors.hpp>  // mpx::peer_error, mpx::stage_error, mpx::config_error, detail::nested

#include <string_view>  // std::string_view

namespace mpx
{

MPX_DECL std::string action_context(const World& w, long step, std::size_t k, Action a, int peer_rank)
{
  return "mpx: rank " + std::to_string(w.env.rank) + " (slot " + std::to_string(w.slot) + ", replica " + std::to_string(w.replica) + "), step " +
         std::to_string(step) + ", action " + std::to_string(k) + " " + op_name(a.op) + std::to_string(a.mb) + " of stage " +
         std::to_string(a.stage) + (peer_rank >= 0 ? ", peer rank " + std::to_string(peer_rank) : std::string());
}

[[noreturn]] MPX_DECL void report_failure(std::exception_ptr failure, const std::string& context, const std::string& stage_context, int stage)
{
  try {
    std::rethrow_exception(failure);
  } catch (const config_error&) {
    throw;
  } catch (const peer_error& e) {
    if (std::string_view(e.what()).starts_with("mpx: rank ")) throw;  // located already (a receive names its own action)
    throw peer_error(context + ": " + detail::nested(e.what()));
  } catch (const std::exception& e) {
    throw stage_error(stage_context + ": stage " + std::to_string(stage) + " failed: " + detail::nested(e.what()));
  }
}

}  // namespace mpx
#endif  // MPX_DEFINITIONS
