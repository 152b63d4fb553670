// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file runtime/checkpoint/local.hpp
/// Checkpoints of a model trained in one process (plain LibTorch, no pipeline), in the pipeline's format:
/// part i is written as stage i would be, under the model's global names, so such a checkpoint resumes in
/// any pipeline whose stages name their parameters globally, and `load_local_checkpoint` takes any such
/// pipeline's — tensors found by name in whatever stage, degree or replica saved them (recut.hpp).

#include <mpx/linkage.hpp>                      // MPX_DECL, MPX_DEFINITIONS
#include <mpx/runtime/checkpoint/format.hpp>    // mpx::CheckpointStage, TrainingState, CheckpointOptions
#include <mpx/runtime/world/world.hpp>          // mpx::World

#include <torch/optim/optimizer.h>  // torch::optim::Optimizer

#include <map>     // std::map
#include <string>  // std::string
#include <vector>  // std::vector

namespace mpx
{

/// One part of a model trained in one process, as a pipeline stage would hold it: its tensors under the
/// model's global names, and its optimizer (null: it does not train).
struct LocalPart
{
  std::map<std::string, at::Tensor> tensors;
  torch::optim::Optimizer* optimizer = nullptr;
};

/// Saves a model trained in one process as a checkpoint under `root` (see the file comment).
MPX_DECL void save_local_checkpoint(const std::string& root, const std::vector<LocalPart>& parts, const TrainingState& t,
                                    const CheckpointOptions& co = {});

/// Restores the checkpoint `path` names into a model trained in one process (see the file comment).
MPX_DECL TrainingState load_local_checkpoint(const std::string& path, const std::vector<LocalPart>& parts, TrainingState current = {},
                                             const CheckpointOptions& co = {});

namespace detail
{
/// A one-process model's parts as the stages of a checkpoint.
MPX_DECL std::vector<CheckpointStage> local_stages(const std::vector<LocalPart>& parts);

/// A world of one process without a launcher: its own store, no group.
MPX_DECL World local_world();
}  // namespace detail

}  // namespace mpx

#if MPX_DEFINITIONS
// ---- definitions (compiled once under MPX_SEPARATE_COMPILATION: linkage.hpp) ----
#include <mpx/errors.hpp>                   // mpx::config_error
#include <mpx/runtime/checkpoint/load.hpp>  // mpx::detail::load_checkpoint
#include <mpx/runtime/checkpoint/save.hpp>  // mpx::detail::save_checkpoint

#include <torch/csrc/distributed/c10d/HashStore.hpp>  // c10d::HashStore

namespace mpx::detail
{
MPX_DECL std::vector<CheckpointStage> local_stages(const std::vector<LocalPart>& parts)
{
  std::vector<CheckpointStage> out;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    CheckpointStage x;
    x.index = int(i), x.global_names = true, x.tensors = parts[i].tensors, x.optimizer = parts[i].optimizer;
    x.save_archive = x.load_archive = [](const std::string& f) {
      throw config_error("mpx: " + f + ": a one-process checkpoint needs an optimizer whose state mpx names (AdamW, AdamW8bit, SGD)");
    };
    out.push_back(std::move(x));
  }
  return out;
}

MPX_DECL World local_world()
{
  World w;
  w.store = c10::make_intrusive<c10d::HashStore>();
  return w;
}

}  // namespace mpx::detail

namespace mpx
{

MPX_DECL void save_local_checkpoint(const std::string& root, const std::vector<LocalPart>& parts, const TrainingState& t,
                                    const CheckpointOptions& co)
{
  auto w = detail::local_world();
  detail::save_checkpoint(w, root, detail::local_stages(parts), "one-process", int(parts.size()), t, co);
}

MPX_DECL TrainingState load_local_checkpoint(const std::string& path, const std::vector<LocalPart>& parts, TrainingState current,
                                             const CheckpointOptions& co)
{
  auto w = detail::local_world();
  return detail::load_checkpoint(w, path, detail::local_stages(parts), "one-process", current, co);
}

}  // namespace mpx
#endif  // MPX_DEFINITIONS
