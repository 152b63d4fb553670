// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file runtime/checkpoint/phases.hpp
/// The phases of a save (save.hpp), in order, and the fault point after each. Whatever system call a crash
/// interrupts, the root keeps a complete checkpoint that `latest` names:
///
/// | phase | done when | a crash right after it leaves |
/// |---|---|---|
/// | `directory` | rank 0 made `step-N.partial/` (an earlier interrupted save of step N removed) | a partial directory, pruned by a later save |
/// | `files` | every rank wrote and fsynced its files and published their sums | the same |
/// | `manifest` | rank 0 wrote `trainer.json`, then the manifest (fsynced, renamed into place) | a partial directory that is complete inside |
/// | `renamed` | `step-N.partial` is `step-N` (an earlier copy of step N kept as `.old` until then), the root fsynced | a complete `step-N`; `latest` still names the one before |
/// | `latest` | `latest` names `step-N` (written beside, fsynced, renamed) | the new checkpoint, current |
/// | `pruned` | all but the newest `keep` complete checkpoints removed | the same |
///
/// After phase k, rank r meets the fault `save<k>:r:N` when MPX_FAULT plans it (launch/faults.hpp): the
/// tests kill a rank at every phase and check that a restarted run resumes from a complete checkpoint.

#include <mpx/runtime/launch/env.hpp>     // mpx::Env
#include <mpx/runtime/launch/faults.hpp>  // mpx::inject_fault, mpx::FaultPoint

namespace mpx::detail
{

/// A phase of a save, numbered as MPX_FAULT's `save<k>` counts them (see the file comment).
enum class SavePhase
{
  directory = 0,
  files = 1,
  manifest = 2,
  renamed = 3,
  latest = 4,
  pruned = 5,
};

/// The save of step `step` on this rank has finished phase `p`: its fault point.
inline void phase_done(const Env& env, long step, SavePhase p) { inject_fault(env, FaultPoint::save, step, int(p)); }

}  // namespace mpx::detail
