// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file runtime/training_state.hpp
/// A pipeline's training state saved and restored as a checkpoint (checkpoint/: the format, the save and
/// load protocols, the re-cut across layouts and degrees): `checkpoint_stages` presents this rank's stages
/// and optimizers as the checkpoint sees them (tensors by name, how the cut ones are cut, the optimizer),
/// and `save_training_state` / `load_training_state` are the collectives `Trainer::save` / `load` run.

#include <mpx/fingerprint.hpp>                  // mpx::fingerprint_v
#include <mpx/pipeline.hpp>                     // mpx::PipelineType
#include <mpx/runtime/checkpoint/format.hpp>    // mpx::CheckpointStage, TrainingState, CheckpointOptions
#include <mpx/runtime/checkpoint/load.hpp>      // mpx::detail::load_checkpoint
#include <mpx/runtime/checkpoint/save.hpp>      // mpx::detail::save_checkpoint
#include <mpx/runtime/stage_optimizers.hpp>     // mpx::StageOptimizers
#include <mpx/runtime/stage_set.hpp>            // mpx::StageSet
#include <mpx/runtime/world/world.hpp>          // mpx::World

#include <string>  // std::string
#include <vector>  // std::vector

namespace mpx
{

/// This rank's stages of P with their optimizers, as a checkpoint sees them.
template <PipelineType P>
std::vector<CheckpointStage> checkpoint_stages(StageSet<P>& stages, StageOptimizers& optimizers)
{
  std::vector<CheckpointStage> out;
  for (int s = 0; s < P::num_stages; ++s) {
    if (!stages.holds(s)) continue;
    CheckpointStage x;
    x.index = s, x.shard = stages.shard_suffix(), x.tp_rank = stages.tp_rank(), x.tp_size = stages.tp_size();
    x.global_names = StageSet<P>::global_names(s), x.tensors = stages.state(s), x.cuts = stages.cuts(s);
    if (optimizers.has(s)) {
      x.optimizer = &optimizers.at(s);
      x.save_archive = [&optimizers, s](const std::string& f) { optimizers.save(s, f); };
      x.load_archive = [&optimizers, s](const std::string& f) { optimizers.load(s, f); };
    }
    out.push_back(std::move(x));
  }
  return out;
}

/// Saves the training state as a new checkpoint `root/step-<t.step>` and points `root/latest` at it
/// (checkpoint/save.hpp). Every rank calls it.
template <PipelineType P>
void save_training_state(World& w, const std::string& root, StageSet<P>& stages, StageOptimizers& optimizers, const TrainingState& t,
                         const CheckpointOptions& co = {})
{
  detail::save_checkpoint(w, root, checkpoint_stages(stages, optimizers), std::to_string(fingerprint_v<P>), P::num_stages, t, co);
}

/// Restores the checkpoint `path` names (checkpoint/load.hpp) into this rank's stages, optimizers and
/// random generators, and returns the trainer's state (`current` supplies what the files do not record).
/// Every rank calls it.
template <PipelineType P>
TrainingState load_training_state(World& w, const std::string& path, StageSet<P>& stages, StageOptimizers& optimizers, TrainingState current,
                                  const CheckpointOptions& co = {})
{
  return detail::load_checkpoint(w, path, checkpoint_stages(stages, optimizers), std::to_string(fingerprint_v<P>), current, co);
}

}  // namespace mpx
