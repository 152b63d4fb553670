// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file runtime/training_state.hpp
/// A pipeline's training state saved and restored as a checkpoint (checkpoint/: the format, the save and
/// load protocols, the re-cut across layouts and degrees): `checkpoint_stages` presents this rank's stages
/// and optimizers as the checkpoint sees them (tensors by name, how the cut ones are cut, the optimizer),
/// and `save_training_state` / `load_training_state` are the collectives `Trainer::save` / `load` run.

#include <mpx/linkage.hpp>                      // MPX_DECL, MPX_DEFINITIONS
#include <mpx/runtime/checkpoint/format.hpp>    // mpx::CheckpointStage, TrainingState, CheckpointOptions
#include <mpx/runtime/checkpoint/load.hpp>      // mpx::detail::load_checkpoint
#include <mpx/runtime/checkpoint/save.hpp>      // mpx::detail::save_checkpoint
#include <mpx/runtime/stage_optimizers.hpp>     // mpx::StageOptimizers
#include <mpx/runtime/stage_set_base.hpp>       // mpx::StageSetBase
#include <mpx/runtime/world/world.hpp>          // mpx::World

#include <string>  // std::string
#include <vector>  // std::vector

namespace mpx
{

/// This rank's stages with their optimizers, as a checkpoint sees them.
MPX_DECL std::vector<CheckpointStage> checkpoint_stages(StageSetBase& stages, StageOptimizers& optimizers);

/// Saves the training state as a new checkpoint `root/step-<t.step>` and points `root/latest` at it
/// (checkpoint/save.hpp). Every rank calls it.
MPX_DECL void save_training_state(World& w, const std::string& root, StageSetBase& stages, StageOptimizers& optimizers, const TrainingState& t,
                                  const CheckpointOptions& co = {});

/// Restores the checkpoint `path` names (checkpoint/load.hpp) into this rank's stages, optimizers and
/// random generators, and returns the trainer's state (`current` supplies what the files do not record).
/// Every rank calls it.
MPX_DECL TrainingState load_training_state(World& w, const std::string& path, StageSetBase& stages, StageOptimizers& optimizers,
                                           TrainingState current, const CheckpointOptions& co = {});

}  // namespace mpx

#if MPX_DEFINITIONS
// ---- definitions (compiled once under MPX_SEPARATE_COMPILATION: linkage.hpp) ----
namespace mpx
{

MPX_DECL std::vector<CheckpointStage> checkpoint_stages(StageSetBase& stages, StageOptimizers& optimizers)
{
  std::vector<CheckpointStage> out;
  for (int s = 0; s < stages.num_stages(); ++s) {
    if (!stages.holds(s)) continue;
    CheckpointStage x;
    x.index = s, x.shard = stages.shard_suffix(), x.tp_rank = stages.tp_rank(), x.tp_size = stages.tp_size();
    x.global_names = stages.global_names(s), x.tensors = stages.state(s), x.cuts = stages.cuts(s);
    if (optimizers.has(s)) {
      x.optimizer = &optimizers.checkpointed(s);  // a sharded stage's: the whole state (save_ and load_training_state)
      x.save_archive = [&optimizers, s](const std::string& f) { optimizers.save(s, f); };
      x.load_archive = [&optimizers, s](const std::string& f) { optimizers.load(s, f); };
    }
    out.push_back(std::move(x));
  }
  return out;
}

MPX_DECL void save_training_state(World& w, const std::string& root, StageSetBase& stages, StageOptimizers& optimizers, const TrainingState& t,
                                  const CheckpointOptions& co)
{
  optimizers.gather_state();  // sharded stages: the whole state, by parameter name (a collective over the replicas)
  try {
    detail::save_checkpoint(w, root, checkpoint_stages(stages, optimizers), stages.fingerprint(), stages.num_stages(), t, co);
  } catch (...) {
    optimizers.drop_state();
    throw;
  }
  optimizers.drop_state();
}

MPX_DECL TrainingState load_training_state(World& w, const std::string& path, StageSetBase& stages, StageOptimizers& optimizers,
                                           TrainingState current, const CheckpointOptions& co)
{
  optimizers.prepare_state();  // sharded stages: the whole state loads into unsharded optimizers, then each replica takes its share
  try {
    current = detail::load_checkpoint(w, path, checkpoint_stages(stages, optimizers), stages.fingerprint(), current, co);
  } catch (...) {
    optimizers.drop_state();
    throw;
  }
  optimizers.take_state();
  return current;
}

}  // namespace mpx
#endif  // MPX_DEFINITIONS
