// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file runtime/options.hpp
/// A run's configuration (`TrainOptions`) and what one step reports (`StepStats`). Configuration only: the
/// running state — the loss scale, the step count, the optimizers' moments — lives in the trainer.
///
/// Defaults, where they differ from LibTorch's own: AdamW's weight decay is 0 here (LibTorch: 0.01), so a
/// stage trains the same under AdamW and AdamW8bit unless decay is asked for; the learning rate is a
/// constant 1e-3 (`WarmupCosine{1e-3, 0, 1, 1.0}`).

#include <mpx/runtime/checkpoint/format.hpp>  // mpx::CheckpointOptions
#include <mpx/runtime/lr.hpp>         // mpx::WarmupCosine
#include <mpx/runtime/precision.hpp>  // mpx::LossScaling

#include <torch/optim/optimizer.h>  // torch::optim::Optimizer

#include <cstddef>     // std::size_t
#include <functional>  // std::function
#include <memory>      // std::unique_ptr
#include <optional>    // std::optional
#include <vector>      // std::vector

namespace mpx
{

/// Whether a schedule with a split backward (ZB-H1) runs it split into I (input gradients) and W (weight
/// gradients), or runs the whole backward in I and nothing in W (split_decision.hpp).
enum class SplitBackward
{
  measure,  ///< the first steps try both, then every rank keeps the faster (the slowest rank's walk)
  always,   ///< split wherever the stage's module marks its blocks
  never,    ///< never split
};

/// Training hyper-parameters of a run.
struct TrainOptions
{
  WarmupCosine lr{1e-3, 0, 1, 1.0};  ///< default: constant 1e-3
  /// Per-stage multipliers of the learning rate (stage s steps with lr × lr_scale[s]; missing: 1), e.g. a
  /// faster vision tower trained from scratch beside a text decoder, or a slower one being fine-tuned.
  std::vector<double> lr_scale;
  double weight_decay = 0.0;                       ///< AdamW, AdamW8bit and SGD (LibTorch's AdamW: 0.01)
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  ///< AdamW, AdamW8bit
  double momentum = 0.0;                           ///< SGD
  double clip_norm = 0.0;                          ///< global gradient-norm clipping; 0: off
  /// Skip a step whose gradients hold inf/NaN on any rank: the ranks agree before any optimizer steps (a
  /// wait for the slowest rank at every step's end). false, with no clipping and no loss scaler (which need
  /// the agreement anyway): every rank steps its optimizers as soon as its schedule is done, then
  /// all-reduces the step's statistics — reported exactly (StepStats), an inf/NaN as an infinite gradient
  /// norm, but not skipped (plain PyTorch without a GradScaler). Saves that wait on small steps
  /// (benchmarks/smallwork).
  bool skip_nonfinite = true;
  std::size_t bucket_bytes = std::size_t(25) << 20;  ///< data-parallel all-reduce bucket size
  /// Data parallelism: each bucket's all-reduce starts inside the stage's last backward of the step, as
  /// soon as its gradients are final (gradient_buckets.hpp); false: all of them after that backward.
  bool overlap_reduction = true;
  /// ZB-H1: split each backward into I and W (`always`), never, or `measure`: after the first step, the
  /// next 2 × split_trials alternate split and whole, and from then on every rank runs the split only if it
  /// was clearly faster — the median over neighbouring trials of split / whole (the slowest rank's schedule
  /// walk) below 1 − mpx::split_margin (0.98), agreed over the world and said on rank 0 (the split costs
  /// extra backward calls that, on small layers, outweigh the bubble it fills). Both ways compute the same
  /// gradients, so trials cost only time.
  SplitBackward split_backward = SplitBackward::measure;
  int split_trials = 8;
  bool trace = false;                              ///< record every action for `write_trace`
  LossScaling scaler{};                            ///< dynamic loss scaling (off by default; for fp16)
  CheckpointOptions checkpoints{};                 ///< what Trainer::save keeps and Trainer::load verifies
  /// Called on every rank after the gradients are complete (reduced over replicas, still scaled by the
  /// loss scale) and before the inf/NaN check: inspect or edit them. `params` are stage `stage`'s.
  std::function<void(int stage, long step, const std::vector<at::Tensor>& params)> before_optimizer;
  /// Run-time choices for programs that offer them as flags; each adds to what the stage policies say.
  bool checkpoint_all = false;                 ///< checkpoint every stage, as if each had mpx::Checkpointed
  bool checkpoint_blocks = false;              ///< checkpoint every stage's blocks, as if each had mpx::CheckpointBlocks
  std::optional<at::ScalarType> autocast;      ///< autocast every stage's forward (kBFloat16, kHalf) unless its policy says otherwise
  int sharding = 0;                            ///< ZeRO level 1, 2 or 3 of every trainable stage, as if each had mpx::Sharded<L>, unless its policy says one
  bool free_between_computes = false;          ///< ZeRO-3: release a stage's parameters whenever this rank's next compute is another stage's (interleaved schedules), gathered again one compute ahead (shard_plan.hpp); else whole from its first compute of a step to its last
  /// Builds stage `stage`'s optimizer over its trainable parameters instead of its Optimizer policy
  /// (return nullptr to keep the policy's); a sharded stage's over this replica's pieces of them (1-D
  /// views: runtime/zero_shard.hpp), as AdamW, AdamW8bit or SGD.
  std::function<std::unique_ptr<torch::optim::Optimizer>(int stage, const std::vector<at::Tensor>& params)> make_optimizer;
};

/// What one step measured on this rank.
struct StepStats
{
  double loss = 0;            ///< mean loss over the global batch (all replicas), on every rank
  double grad_norm = 0;       ///< global gradient norm before clipping (inf for a skipped step)
  double lr = 0;
  double seconds = 0;         ///< wall time of the step on this rank
  double compute_seconds = 0; ///< time in forward/backward on this rank, less their waits for received data
  double wait_seconds = 0;    ///< time forward/backward waited for their received activations or gradients
  double schedule_seconds = 0;  ///< time walking the schedule's actions (the rest: reductions, optimizer)
  bool skipped = false;         ///< an inf/NaN gradient on some rank: no rank stepped its optimizer
  double loss_scale = 1;        ///< the loss scale used by this step
  double optimizer_seconds = 0; ///< time in the optimizers' steps

  /// Measured idle fraction: 1 - compute / wall (waits for data are idle).
  double bubble() const { return seconds > 0 ? 1.0 - compute_seconds / seconds : 0.0; }
};

}  // namespace mpx
