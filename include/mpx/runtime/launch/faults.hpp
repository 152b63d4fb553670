// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file runtime/launch/faults.hpp
/// Faults injected for real, for the tests of failure handling (restarts, checkpoints, the launcher's
/// report). `MPX_FAULT` lists faults, comma-separated, each `kind:rank:step[:attempt]` (parsed with the
/// rest of the environment: env.hpp, `Env::faults`): global rank `rank` meets it at step `step` (the steps
/// done before it) of restart attempt `attempt` (`Env::restart_count`, default 0, so the restarted job
/// goes on). Kinds:
///
/// | kind | what happens, where |
/// |---|---|
/// | `sigkill`, `sigstop`, `sigsegv`, `abort` | the signal (abort: `std::abort`) at the start of the step |
/// | `exception` | an exception from the rank's first forward of the step: a stage failing, as any would |
/// | `save<k>` | SIGKILL in the save of that step (the steps done), after its k-th phase (checkpoint/phases.hpp) |
///
/// The runtime calls `inject_fault` at those points; with MPX_FAULT unset it costs a call and one branch.

#include <mpx/linkage.hpp>             // MPX_DECL, MPX_DEFINITIONS
#include <mpx/runtime/launch/env.hpp>  // mpx::Env, mpx::Fault

namespace mpx
{

/// Where in a step a fault can be met.
enum class FaultPoint
{
  step,     ///< the start of a step
  forward,  ///< a stage's forward
  save,     ///< a phase of a save
};

/// Meets the fault `env.faults` plans for this rank (`env.rank`), step and restart attempt at `at`, if
/// there is one (see the file comment); `phase` is the save's phase at FaultPoint::save.
MPX_DECL void inject_fault(const Env& env, FaultPoint at, long step, int phase = 0);

}  // namespace mpx

#if MPX_DEFINITIONS
// ---- definitions (compiled once under MPX_SEPARATE_COMPILATION: linkage.hpp) ----
#include <signal.h>  // raise

#include <cstdio>     // std::fprintf
#include <cstdlib>    // std::abort
#include <stdexcept>  // std::runtime_error
#include <string>     // std::string

namespace mpx
{
MPX_DECL void inject_fault(const Env& env, FaultPoint at, long step, int phase)
{
  for (const Fault& f : env.faults) {
    if (f.rank != env.rank || f.step != step || f.attempt != env.restart_count) continue;
    const bool save = f.kind.rfind("save", 0) == 0;
    if (save ? (at != FaultPoint::save || std::stoi(f.kind.substr(4)) != phase)
             : (at != (f.kind == "exception" ? FaultPoint::forward : FaultPoint::step)))
      continue;
    std::fprintf(stderr, "mpx: injecting fault %s at rank %d, step %ld (MPX_FAULT)\n", f.kind.c_str(), env.rank, step);
    std::fflush(stderr);
    if (f.kind == "exception")
      throw std::runtime_error("injected fault (MPX_FAULT=" + f.kind + ":" + std::to_string(env.rank) + ":" + std::to_string(step) + ")");
    if (f.kind == "abort") std::abort();
    ::raise(f.kind == "sigstop" ? SIGSTOP : f.kind == "sigsegv" ? SIGSEGV : SIGKILL);
  }
}

}  // namespace mpx
#endif  // MPX_DEFINITIONS
