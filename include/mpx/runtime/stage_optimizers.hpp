// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file runtime/stage_optimizers.hpp
/// `StageOptimizers`: one optimizer per trainable stage this rank holds, as one object (torchtitan's
/// OptimizersContainer). Each is built over the stage's trainable parameters from its `Optimizer<O>` policy
/// (AdamW — `mpx::FusedAdamW`, LibTorch's AdamW with a one-pass CPU step — when it has none; none for a
/// `Frozen` stage or one without trainable parameters), or by
/// `TrainOptions::make_optimizer`. `step(lr)` steps every stage at lr × its `lr_scale` (where a
/// `make_optimizer` built several parameter groups, a group built at k × the first group's rate keeps that
/// k: lr × scale × k); `zero` drops the
/// gradients (the next backward's first gradient becomes the parameter's gradient as it is: no zero fill,
/// no add; the host cache makes the fresh buffer cheap); `save` / `load` write and read one stage's
/// optimizer state.

#include <mpx/optim/adamw8bit.hpp>       // mpx::AdamW8bitOptimizer
#include <mpx/optim/fused_adamw.hpp>     // mpx::FusedAdamW
#include <mpx/errors.hpp>                // mpx::config_error
#include <mpx/linkage.hpp>               // MPX_DECL, MPX_DEFINITIONS
#include <mpx/runtime/options.hpp>       // mpx::TrainOptions
#include <mpx/runtime/stage_set_base.hpp>  // mpx::StageSetBase

#include <torch/torch.h>  // torch::optim, torch::serialize

#include <memory>  // std::unique_ptr
#include <optional>  // std::optional
#include <string>  // std::string
#include <vector>  // std::vector

namespace mpx
{

class StageOptimizers
{
 public:
  /// Builds the optimizers of `stages`' stages (see the file comment).
  MPX_DECL StageOptimizers(const StageSetBase& stages, const TrainOptions& o);

  /// Whether stage s has an optimizer on this rank.
  bool has(int s) const { return optimizers_.at(std::size_t(s)) != nullptr; }
  torch::optim::Optimizer& at(int s) { return *optimizers_.at(std::size_t(s)); }

  /// Steps every stage's optimizer at `lr` × the stage's scale (× a group's rate relative to the first group's).
  void step(double lr)
  {
    for (std::size_t s = 0; s < optimizers_.size(); ++s) {
      auto& opt = optimizers_[s];
      if (!opt) continue;
      const double scale = s < lr_scale_.size() ? lr_scale_[s] : 1.0;
      auto& groups = opt->param_groups();
      for (std::size_t g = 0; g < groups.size(); ++g) groups[g].options().set_lr(lr * scale * group_share_[s].at(g));
      opt->step();
    }
  }

  /// The sum of the squares of `p`'s gradient as its optimizer's last step read it, where that step summed
  /// them on the way (a FusedAdamW's one pass); else nothing.
  std::optional<double> stepped_grad_sq(const at::Tensor& p) const
  {
    for (const auto& opt : optimizers_)
      if (const auto* fused = dynamic_cast<const FusedAdamW*>(opt.get()))
        if (auto sq = fused->stepped_grad_sq(p)) return sq;
    return std::nullopt;
  }

  /// Drops every gradient of this rank's stages (frozen ones included: a user may have set one); a
  /// parameter without a gradient counts as zero everywhere after (norm, buckets, optimizers).
  void zero()
  {
    for (auto& ps : params_)
      for (auto& p : ps)
        if (p.grad().defined()) p.mutable_grad().reset();
  }

  /// Writes stage s's optimizer state to `path` (nothing when it has none).
  void save(int s, const std::string& path)
  {
    if (!has(s)) return;
    torch::serialize::OutputArchive ar;
    optimizers_[std::size_t(s)]->save(ar);
    ar.save_to(path);
  }

  /// Reads stage s's optimizer state from `path`; an error names the file.
  void load(int s, const std::string& path)
  {
    if (!has(s)) return;
    try {
      torch::serialize::InputArchive ar;
      ar.load_from(path);
      optimizers_[std::size_t(s)]->load(ar);
    } catch (const std::exception& e) {
      throw config_error("mpx: cannot restore the optimizer state from " + path + " (" + e.what() + "); the checkpoint is incomplete or corrupt");
    }
  }

 private:
  MPX_DECL static std::unique_ptr<torch::optim::Optimizer> make(int s, const StageSetBase& stages, const TrainOptions& o);

  std::vector<double> lr_scale_;
  std::vector<std::unique_ptr<torch::optim::Optimizer>> optimizers_;
  std::vector<std::vector<double>> group_share_;  // per stage, per parameter group: its rate when built / the first group's
  std::vector<std::vector<at::Tensor>> params_;
};

}  // namespace mpx

#if MPX_DEFINITIONS
// ---- definitions (compiled once under MPX_SEPARATE_COMPILATION: linkage.hpp) ----
namespace mpx
{

MPX_DECL StageOptimizers::StageOptimizers(const StageSetBase& stages, const TrainOptions& o) : lr_scale_(o.lr_scale)
{
  optimizers_.resize(std::size_t(stages.num_stages()));
  params_.resize(std::size_t(stages.num_stages()));
  group_share_.resize(std::size_t(stages.num_stages()));
  for (int s = 0; s < stages.num_stages(); ++s) {
    if (!stages.holds(s)) continue;
    params_[std::size_t(s)] = stages.parameters(s);
    optimizers_[std::size_t(s)] = make(s, stages, o);
    if (!optimizers_[std::size_t(s)]) continue;
    const auto& groups = optimizers_[std::size_t(s)]->param_groups();
    for (const auto& g : groups) {
      const double first = groups.front().options().get_lr(), mine = g.options().get_lr();
      group_share_[std::size_t(s)].push_back(mine == first || first <= 0 ? 1.0 : mine / first);
    }
  }
}

MPX_DECL std::unique_ptr<torch::optim::Optimizer> StageOptimizers::make(int s, const StageSetBase& stages, const TrainOptions& o)
{
  const auto trainable = stages.trainable(s);
  if (trainable.empty() || stages.frozen(s)) return nullptr;
  if (o.make_optimizer)
    if (auto custom = o.make_optimizer(s, trainable)) return custom;
  const auto adamw = torch::optim::AdamWOptions(o.lr.peak).betas({o.beta1, o.beta2}).eps(o.eps).weight_decay(o.weight_decay);
  switch (stages.optimizer_kind(s)) {
    case OptimizerKind::sgd:
      return std::make_unique<torch::optim::SGD>(trainable, torch::optim::SGDOptions(o.lr.peak).momentum(o.momentum).weight_decay(o.weight_decay));
    case OptimizerKind::adamw8bit: return std::make_unique<AdamW8bitOptimizer>(trainable, adamw);
    case OptimizerKind::adamw: break;  // also the default for a trainable stage without an Optimizer policy
  }
  return std::make_unique<FusedAdamW>(trainable, adamw);
}

}  // namespace mpx
#endif  // MPX_DEFINITIONS
