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
/// optimizer state. A `Sharded<L>` stage (or every trainable stage under `TrainOptions::sharding`) with
/// several replicas steps this replica's shard of its parameters (runtime/zero_shard.hpp; `make_optimizer`
/// is then given the shard's pieces and must build AdamW, AdamW8bit or SGD): `gradients_in` takes the owned gradients (levels 2, 3 before the step's end,
/// level 1 in `step`), `step` then all-gathers the updated parameters (level 3: before the stage's computes,
/// runtime/zero_gathers.hpp); checkpoints see the whole state (zero_state.hpp)
/// through `checkpointed(s)` between `gather_state` (a collective) or `prepare_state`, and `drop_state` or `take_state`.

#include <mpx/optim/adamw8bit.hpp>       // mpx::AdamW8bitOptimizer
#include <mpx/optim/fused_adamw.hpp>     // mpx::FusedAdamW
#include <mpx/errors.hpp>                // mpx::config_error
#include <mpx/linkage.hpp>               // MPX_DECL, MPX_DEFINITIONS
#include <mpx/runtime/options.hpp>       // mpx::TrainOptions
#include <mpx/runtime/stage_set_base.hpp>  // mpx::StageSetBase
#include <mpx/runtime/zero_shard.hpp>      // mpx::ZeroShard, mpx::ShardGroup
#include <mpx/runtime/zero_state.hpp>      // mpx::gather_state, mpx::scatter_state
#include <mpx/optim/moments.hpp>          // mpx::detail::moment_names, same_kind

#include <torch/torch.h>  // torch::optim, torch::serialize

#include <cstdint>  // std::int64_t
#include <memory>  // std::unique_ptr
#include <optional>  // std::optional
#include <string>  // std::string
#include <vector>  // std::vector

namespace mpx
{

class StageOptimizers
{
 public:
  /// Builds the optimizers of `stages`' stages (see the file comment); `Sharded<L>` stages are sharded over `g`.
  MPX_DECL StageOptimizers(const StageSetBase& stages, const TrainOptions& o, ShardGroup g = {});

  /// Whether stage s has an optimizer on this rank.
  bool has(int s) const { return optimizers_.at(std::size_t(s)) != nullptr; }
  torch::optim::Optimizer& at(int s) { return *optimizers_.at(std::size_t(s)); }

  /// Steps every stage's optimizer at `lr` × the stage's scale (× a group's rate relative to the first group's);
  /// sharded stages then all-gather their parameters (`step` names the step in errors).
  MPX_DECL void step(double lr, long step = 0);

  /// The parameter elements stage s's optimizer steps on this rank: its ZeRO shard's when sharded, else all
  /// its trainable ones (0 without an optimizer).
  std::int64_t stepped_elements(int s) const
  {
    std::int64_t n = 0;
    if (const auto& opt = optimizers_.at(std::size_t(s)))
      for (const auto& g : opt->param_groups())
        for (const auto& p : g.params()) n += p.numel();
    return n;
  }

  /// Stage s's ZeRO level on this rank (0: unsharded, or one replica).
  int sharding(int s) const { return shards_.at(std::size_t(s)) ? shards_[std::size_t(s)]->level() : 0; }
  /// Stage s's ZeRO shard on this rank (null: unsharded, or one replica).
  const ZeroShard* shard(int s) const { return shards_.at(std::size_t(s)).get(); }
  /// A sharded stage's owned gradients into its shard (levels 2, 3: the whole gradients dropped).
  void gradients_in(int s) { shards_.at(std::size_t(s))->gradients_in(); }
  /// Every stage's shard, by stage (null: unsharded).
  std::vector<ZeroShard*> shards()
  {
    std::vector<ZeroShard*> out;
    for (auto& z : shards_) out.push_back(z.get());
    return out;
  }
  /// Level 3, collectives over the replicas in stage order: every stage's parameters made whole (until the
  /// next step; runtime/zero_gathers.hpp gathers them during a step), or released and emptied.
  MPX_DECL void gather_parameters(long step);
  MPX_DECL void release_parameters();
  /// Scales the sharded stages' gradients that are in their shards (clipping).
  void scale_shard_gradients(double c)
  {
    for (auto& z : shards_)
      if (z) z->scale_gradients(c);
  }

  /// Collective over the replicas: the whole optimizer state of every sharded stage, for a checkpoint.
  MPX_DECL void gather_state();
  /// Empty unsharded optimizers for a checkpoint to load into (`release_state` then shards what it loaded).
  MPX_DECL void prepare_state();
  /// After a load: this replica's share of what `prepare_state`'s optimizers hold into the shards; drops them.
  MPX_DECL void take_state();
  /// After a save: drops what `gather_state` built.
  void drop_state()
  {
    for (auto& w : whole_) w.reset();
  }
  /// Stage s's optimizer as a checkpoint sees it: the unsharded one `gather_state` or `prepare_state` built, or the stage's.
  torch::optim::Optimizer& checkpointed(int s) { return whole_.at(std::size_t(s)) ? *whole_[std::size_t(s)] : at(s); }

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
    for (auto& z : shards_)
      if (z) z->zero();
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
  MPX_DECL static std::unique_ptr<torch::optim::Optimizer> make(OptimizerKind kind, const std::vector<at::Tensor>& params, const TrainOptions& o);

  std::vector<double> lr_scale_;
  std::vector<std::unique_ptr<ZeroShard>> shards_;                    // per stage: its shard (null: unsharded)
  std::vector<std::unique_ptr<torch::optim::Optimizer>> whole_;       // per sharded stage, while a checkpoint needs it
  std::vector<std::vector<at::Tensor>> trainable_;
  std::vector<std::unique_ptr<torch::optim::Optimizer>> optimizers_;
  std::vector<std::vector<double>> group_share_;  // per stage, per parameter group: its rate when built / the first group's
  std::vector<std::vector<at::Tensor>> params_;
};

}  // namespace mpx

#if MPX_DEFINITIONS
// ---- definitions (compiled once under MPX_SEPARATE_COMPILATION: linkage.hpp) ----
namespace mpx
{

MPX_DECL StageOptimizers::StageOptimizers(const StageSetBase& stages, const TrainOptions& o, ShardGroup g) : lr_scale_(o.lr_scale)
{
  if (o.sharding < 0 || o.sharding > 3)
    throw config_error("mpx: TrainOptions::sharding = " + std::to_string(o.sharding) + ": use 0 (as the stages declare), 1, 2 or 3 (ZeRO levels)");
  const auto n = std::size_t(stages.num_stages());
  optimizers_.resize(n), params_.resize(n), group_share_.resize(n), shards_.resize(n), whole_.resize(n), trainable_.resize(n);
  for (int s = 0; s < stages.num_stages(); ++s) {
    if (!stages.holds(s)) continue;
    const auto i = std::size_t(s);
    params_[i] = stages.parameters(s);
    trainable_[i] = stages.trainable(s);
    const OptimizerKind kind = stages.optimizer_kind(s);
    if (trainable_[i].empty() || stages.frozen(s)) continue;
    const int level = stages.sharding(s) > 0 ? stages.sharding(s) : o.sharding;
    if (level > 0 && g.replicas > 1) {  // the optimizer steps this replica's pieces
      shards_[i] = std::make_unique<ZeroShard>(trainable_[i], level, g);
      auto custom = o.make_optimizer ? o.make_optimizer(s, shards_[i]->pieces()) : nullptr;
      optimizers_[i] = custom ? std::move(custom) : make(kind, shards_[i]->pieces(), o);
      detail::moment_names(*optimizers_[i]);  // a kind whose state can be cut into shards, or a config_error now
    } else {
      auto custom = o.make_optimizer ? o.make_optimizer(s, trainable_[i]) : nullptr;
      optimizers_[i] = custom ? std::move(custom) : make(kind, trainable_[i], o);
    }
    const auto& groups = optimizers_[i]->param_groups();
    for (const auto& gr : groups) {
      const double first = groups.front().options().get_lr(), mine = gr.options().get_lr();
      group_share_[i].push_back(mine == first || first <= 0 ? 1.0 : mine / first);
    }
  }
}

MPX_DECL std::unique_ptr<torch::optim::Optimizer> StageOptimizers::make(OptimizerKind kind, const std::vector<at::Tensor>& params, const TrainOptions& o)
{
  const auto adamw = torch::optim::AdamWOptions(o.lr.peak).betas({o.beta1, o.beta2}).eps(o.eps).weight_decay(o.weight_decay);
  switch (kind) {
    case OptimizerKind::sgd:
      return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(o.lr.peak).momentum(o.momentum).weight_decay(o.weight_decay));
    case OptimizerKind::adamw8bit: return std::make_unique<AdamW8bitOptimizer>(params, adamw);
    case OptimizerKind::adamw: break;  // also the default for a trainable stage without an Optimizer policy
  }
  return std::make_unique<FusedAdamW>(params, adamw);
}

MPX_DECL void StageOptimizers::step(double lr, long step)
{
  for (std::size_t s = 0; s < optimizers_.size(); ++s) {
    auto& opt = optimizers_[s];
    if (!opt) continue;
    const double scale = s < lr_scale_.size() ? lr_scale_[s] : 1.0;
    auto& groups = opt->param_groups();
    for (std::size_t g = 0; g < groups.size(); ++g) groups[g].options().set_lr(lr * scale * group_share_[s].at(g));
    if (shards_[s] && shards_[s]->level() == 1) shards_[s]->gradients_in();
    opt->step();
  }
  for (auto& z : shards_)  // level 3 gathers before the next step's computes
    if (z && z->level() < 3) z->start_gather(step);
  for (auto& z : shards_)
    if (z && z->level() < 3) z->finish_gather();
}

MPX_DECL void StageOptimizers::gather_parameters(long step)
{
  for (auto& z : shards_)
    if (z && z->level() == 3) z->start_gather(step);
  for (auto& z : shards_)
    if (z && z->level() == 3) z->finish_gather();
}

MPX_DECL void StageOptimizers::release_parameters()
{
  for (auto& z : shards_)
    if (z) z->release(true);
}

MPX_DECL void StageOptimizers::prepare_state()
{
  gather_parameters(-1);  // level 3: the parameters whole, to be saved or loaded into
  for (std::size_t s = 0; s < shards_.size(); ++s)
    if (shards_[s]) whole_[s] = detail::same_kind(*optimizers_[s], trainable_[s]);
}

MPX_DECL void StageOptimizers::gather_state()
{
  prepare_state();
  for (std::size_t s = 0; s < shards_.size(); ++s)
    if (shards_[s]) mpx::gather_state(*shards_[s], *optimizers_[s], *whole_[s]);
}

MPX_DECL void StageOptimizers::take_state()
{
  for (std::size_t s = 0; s < shards_.size(); ++s)
    if (whole_[s]) mpx::scatter_state(*shards_[s], *whole_[s], *optimizers_[s]), whole_[s].reset();
  for (auto& z : shards_)
    if (z) z->keep_owned();  // level 3: the loaded parameters' owned part into the shard
}

}  // namespace mpx
#endif  // MPX_DEFINITIONS
