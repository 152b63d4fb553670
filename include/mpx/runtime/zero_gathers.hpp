// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file runtime/zero_gathers.hpp
/// `ZeroGathers`: a step's ZeRO-3 collectives on this rank, walked from its plan (shard_plan.hpp: the
/// gathers posted before the first action and around each compute, the waits, the releases), over the
/// stages' shards (zero_shard.hpp; `StageOptimizers::shard(s)`). The trainer calls `begin` before its walk
/// and `around` around each compute; a released stage keeps its parameters' shapes until its gradients
/// are complete (their reduction and tensor-parallel sums read them), when the trainer empties them
/// (`StageOptimizers::release_parameters`).

#include <mpx/action.hpp>                    // mpx::Action
#include <mpx/linkage.hpp>                   // MPX_DECL, MPX_DEFINITIONS
#include <mpx/runtime/zero_shard.hpp>        // mpx::ZeroShard
#include <mpx/shard_plan.hpp>                // mpx::ShardPlan, mpx::shard_plan, mpx::check_shard_plan

#include <cstddef>  // std::size_t
#include <vector>   // std::vector

namespace mpx
{

class ZeroGathers
{
 public:
  /// The plan of this rank's `actions` (its schedule's list) over the stages whose `shards[s]` is at level 3
  /// (null: unsharded); a plan that does not hold is a `config_error` (the pipeline's type proves it at
  /// compile time where it declares them).
  MPX_DECL ZeroGathers(std::vector<ZeroShard*> shards, const std::vector<Action>& actions, bool free_between);

  /// Whether some stage of this rank is at level 3.
  bool any() const { return any_; }
  const ShardPlan& plan() const { return plan_; }
  /// Before step `step`'s walk: the gathers posted ahead of its first action.
  MPX_DECL void begin(long step);
  /// Around the k-th action of the walk (a compute): its gathers posted and waited for before, its release after.
  MPX_DECL void around(std::size_t k, bool before);

 private:
  std::vector<ZeroShard*> shards_;
  ShardPlan plan_;
  bool any_ = false;
  long step_ = 0;
};

}  // namespace mpx

#if MPX_DEFINITIONS
// ---- definitions (compiled once under MPX_SEPARATE_COMPILATION: linkage.hpp) ----
#include <mpx/errors.hpp>  // mpx::config_error

#include <string>   // std::string
#include <utility>  // std::move

namespace mpx
{

MPX_DECL ZeroGathers::ZeroGathers(std::vector<ZeroShard*> shards, const std::vector<Action>& actions, bool free_between) : shards_(std::move(shards))
{
  std::vector<int> level(shards_.size(), 0);
  for (std::size_t s = 0; s < shards_.size(); ++s) level[s] = shards_[s] ? shards_[s]->level() : 0, any_ = any_ || level[s] == 3;
  for (const Action& a : actions)
    if (a.stage >= shards_.size()) throw config_error("mpx: ZeroGathers: an action of stage " + std::to_string(a.stage) + " beyond the stages given");
  if (!any_) return;
  plan_ = shard_plan(actions, level, free_between);
  if (const auto c = check_shard_plan(actions, level, plan_); !c.ok)
    throw config_error("mpx: ZeRO-3's gathers on this rank's schedule do not hold at action " + std::to_string(c.action) + ": " + c.why);
}

MPX_DECL void ZeroGathers::begin(long step)
{
  step_ = step;
  for (int s : plan_.first) shards_[std::size_t(s)]->start_gather(step);
}

MPX_DECL void ZeroGathers::around(std::size_t k, bool before)
{
  const ShardMoves& m = plan_.at.at(k);
  if (!before) {
    if (m.release >= 0) shards_[std::size_t(m.release)]->release(false);
    return;
  }
  for (int s : m.post) shards_[std::size_t(s)]->start_gather(step_);
  if (m.wait >= 0) shards_[std::size_t(m.wait)]->finish_gather();
}

}  // namespace mpx
#endif  // MPX_DEFINITIONS
