// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file runtime/trainer_core.hpp
/// `detail::TrainerCore`: the body of `Trainer<P, Batch>` (trainer.hpp) that needs neither type, compiled
/// once under `mpx::compiled` (linkage.hpp): a step's phases after the micro-batches are on the device,
/// the optimizers, the data-parallel buckets, the loss scaler, the trace, save and load. It reads the
/// stages through `StageSetBase` and walks the schedule through `detail::ExecutorCore`, both of which the
/// typed trainer holds.

#include <mpx/linkage.hpp>                   // MPX_DECL, MPX_DEFINITIONS
#include <mpx/runtime/executor_core.hpp>     // mpx::detail::ExecutorCore
#include <mpx/runtime/grad_stats.hpp>        // mpx::StageParameters, mpx::StageNormTerms, mpx::StepReduction
#include <mpx/runtime/gradient_buckets.hpp>  // mpx::GradientBuckets
#include <mpx/runtime/options.hpp>           // mpx::TrainOptions, mpx::StepStats
#include <mpx/runtime/precision.hpp>         // mpx::LossScaler
#include <mpx/runtime/shm_links.hpp>         // mpx::ShmSum
#include <mpx/runtime/split_decision.hpp>    // mpx::SplitDecision
#include <mpx/runtime/stage_optimizers.hpp>  // mpx::StageOptimizers
#include <mpx/runtime/stage_set_base.hpp>    // mpx::StageSetBase
#include <mpx/runtime/trace.hpp>             // mpx::TraceRecorder, mpx::TraceLabel
#include <mpx/runtime/zero_gathers.hpp>      // mpx::ZeroGathers
#include <mpx/runtime/world/world.hpp>       // mpx::World

#include <chrono>    // std::chrono::steady_clock
#include <iostream>  // std::clog, std::ostream
#include <memory>    // std::unique_ptr
#include <string>    // std::string
#include <utility>   // std::exchange

namespace mpx::detail
{
/// A `config_error` naming the fix when a step is given `got` micro-batches and the pipeline declares `declared`.
MPX_DECL void check_microbatch_count(std::size_t got, int declared);

class TrainerCore
{
  using clock = std::chrono::steady_clock;

 public:
  /// The order of a step's end (see `step_order`).
  enum class StepOrder { agree_then_step, step_then_agree };

  /// `label`: the schedule's name, slots, micro-batches and expected bubble (traces print them).
  MPX_DECL TrainerCore(World& world, TrainOptions options, StageSetBase& stages, ExecutorCore& executor, TraceLabel label);
  MPX_DECL ~TrainerCore();
  TrainerCore(const TrainerCore&) = delete;
  TrainerCore& operator=(const TrainerCore&) = delete;

  /// One optimizer step over the micro-batches the executor was given (on the device).
  MPX_DECL StepStats step();

  /// The order of a step's end, the one place that says it. `agree_then_step` when the update needs the
  /// other ranks — an inf/NaN skip (`skip_nonfinite`), clipping (`clip_norm`) or a loss scaler: the ranks
  /// agree on loss, gradient norm and inf/NaN first, then each skips, clips or steps alike. Otherwise
  /// `step_then_agree`: every rank steps its optimizers as soon as its gradients are complete, then the
  /// step's statistics are all-reduced (reported exactly, not waited for before the update).
  StepOrder step_order() const
  {
    return o_.skip_nonfinite || o_.clip_norm > 0 || scaler_.enabled() ? StepOrder::agree_then_step : StepOrder::step_then_agree;
  }

  MPX_DECL void save(const std::string& root);
  MPX_DECL void load(const std::string& path);
  /// Collective over the replicas: ZeRO-3 stages' parameters whole on this rank until the next step.
  void gather_parameters() { optimizers_.gather_parameters(step_); }
  long steps_done() const { return step_; }
  std::int64_t stepped_elements(int s) const { return optimizers_.stepped_elements(s); }
  long skipped_steps() const { return scaler_.skipped(); }
  double loss_scale() const { return scaler_.scale(); }
  double expected_bubble() const { return label_.expected_bubble; }
  const SplitDecision& split_decision() const { return split_; }
  double measured_bubble() const { return last_.bubble(); }
  MPX_DECL double write_trace(const std::string& path, std::ostream& log);

 private:
  MPX_DECL ExecutorCore::Walk walk_schedule(clock::time_point t0);
  MPX_DECL void complete_gradients(clock::time_point t0);
  MPX_DECL void update_parameters(const ExecutorCore::Walk& walk, StepStats& st);
  MPX_DECL StepReduction agree_on_step(const ExecutorCore::Walk& walk, bool agree_first);
  MPX_DECL void step_optimizers(StepStats& st);
  MPX_DECL bool splits_here() const;
  MPX_DECL void call_before_optimizer();
  MPX_DECL void shed_gradients();
  MPX_DECL const ZeroShard* scattered(int s) const;

  World& w_;
  TrainOptions o_;
  TraceLabel label_;
  LossScaler scaler_;
  StageSetBase& stages_;
  StageOptimizers optimizers_;
  ExecutorCore& executor_;
  ZeroGathers gathers_;  // ZeRO-3's gathers and releases around the walk's computes
  std::unique_ptr<ShmSum> sum_;  // the end-of-step sum through shared memory when the world shares a host, else null (Gloo; shm_links.hpp)
  GradientBuckets buckets_;
  SplitDecision split_;
  TraceRecorder trace_;
  StageParameters held_;    // this rank's stages' parameters, in stage order
  StageNormTerms counted_;  // those it counts in the global gradient norm (tensor parallelism: each once)
  std::vector<std::vector<at::Tensor>> shard_counted_;  // reduce-scattered stages: the parameters counted in the norm (counted_'s left empty)
  double shed_sq_ = 0;  // sharded stages: their share of the squared norm, taken before level 2's whole gradients went
  long step_ = 0;
  long steps_run_ = 0;  // steps this trainer ran in this process (step_ counts those of a resumed checkpoint too)
  StepStats last_;
};
}  // namespace mpx::detail

#if MPX_DEFINITIONS
// ---- definitions (compiled once under MPX_SEPARATE_COMPILATION: linkage.hpp) ----
#include <mpx/errors.hpp>                   // mpx::config_error
#include <mpx/runtime/launch/faults.hpp>    // mpx::inject_fault
#include <mpx/runtime/training_state.hpp>   // mpx::save_training_state, mpx::load_training_state

namespace mpx::detail
{
MPX_DECL void check_microbatch_count(std::size_t got, int declared)
{
  if (got != std::size_t(declared))
    throw config_error("mpx: Trainer::step: got " + std::to_string(got) + " micro-batches, the pipeline declares " + std::to_string(declared) +
                       " (mpx::Microbatches<M>); slice the batch with mpx::slice_microbatches(batch, " + std::to_string(declared) + ")");
}

MPX_DECL TrainerCore::TrainerCore(World& world, TrainOptions options, StageSetBase& stages, ExecutorCore& executor, TraceLabel label)
    : w_(world), o_(std::move(options)), label_(std::move(label)), scaler_(o_.scaler), stages_(stages),
      optimizers_(stages_, o_, ShardGroup{w_.dp, w_.dp ? w_.dp->getRank() : 0, w_.replicas, w_.timeout, w_.env.rank}),
      executor_(executor), gathers_(optimizers_.shards(), executor_.actions(), o_.free_between_computes), sum_(make_world_sum(w_)), buckets_(w_.dp, w_.replicas, o_.bucket_bytes, w_.timeout),
      split_(executor_.split().schedule_splits(), o_.split_backward, o_.split_trials)
{
  for (int s = 0; s < stages_.num_stages(); ++s) {
    if (!stages_.holds(s)) continue;
    held_.push_back(stages_.parameters(s)), counted_.push_back(stages_.norm_parameters(s)), shard_counted_.emplace_back();
    if (scattered(s))  // its replicas hold averages of their owned parts only: counted from those
      for (auto& t : std::exchange(counted_.back(), {}))  // (a frozen parameter, a LoRA stage's base, is not sharded)
        if (t.param.requires_grad()) shard_counted_.back().push_back(t.param);
  }
}

MPX_DECL TrainerCore::~TrainerCore() = default;

MPX_DECL StepStats TrainerCore::step()
{
  inject_fault(w_.env, FaultPoint::step, step_);  // MPX_FAULT (tests of failure handling)
  StepStats st;
  st.loss_scale = scaler_.scale();
  executor_.choose_split(split_.split_at(steps_run_));
  const auto t0 = clock::now();
  const auto walk = walk_schedule(t0);
  st.schedule_seconds = seconds_of(clock::now() - t0);
  const bool settle_split = split_.record(steps_run_, st.schedule_seconds);
  complete_gradients(t0);
  st.lr = o_.lr(step_);
  update_parameters(walk, st);
  optimizers_.zero();
  if (settle_split) split_.decide(w_, splits_here(), std::clog);
  st.seconds = seconds_of(clock::now() - t0);
  st.compute_seconds = walk.compute_seconds;
  st.wait_seconds = walk.wait_seconds;
  last_ = st;
  ++step_;
  ++steps_run_;
  return st;
}

MPX_DECL void TrainerCore::save(const std::string& root)
{
  save_training_state(w_, root, stages_, optimizers_, {step_, scaler_.scale(), scaler_.skipped(), scaler_.good_steps()}, o_.checkpoints);
  optimizers_.release_parameters();  // ZeRO-3: gathered for the files
}

MPX_DECL void TrainerCore::load(const std::string& path)
{
  const auto t = load_training_state(w_, path, stages_, optimizers_, {step_, scaler_.scale(), 0, 0}, o_.checkpoints);
  optimizers_.release_parameters();
  step_ = t.step;
  scaler_.restore(t.loss_scale, t.skipped, t.good_steps);
}

MPX_DECL double TrainerCore::write_trace(const std::string& path, std::ostream& log)
{
  if (!o_.trace) throw config_error("mpx: Trainer::write_trace: set TrainOptions::trace = true to record the actions");
  return trace_.write(w_, path, step_ - 1, last_, label_, log);
}

/// A step's first phase: the schedule's walk, data-parallel buckets arming before each stage's last
/// backward and starting after it, ZeRO-3's gathers and releases around the computes (zero_gathers.hpp).
MPX_DECL ExecutorCore::Walk TrainerCore::walk_schedule(clock::time_point t0)
{
  ExecutorCore::AroundCall around;
  if (gathers_.any()) gathers_.begin(step_), around = [this](std::size_t k, bool before) { gathers_.around(k, before); };
  auto walk = executor_.walk(
      scaler_.scale(), step_, o_.trace ? &trace_ : nullptr,
      [this](int s) {
        if (o_.overlap_reduction) buckets_.arm(stages_.parameters(s), scattered(s));
      },
      [this](int s) { buckets_.start(stages_.parameters(s), scattered(s)); }, around);
  const auto& at = buckets_.launched_at();  // the step's bucket starts, as instants in the trace
  for (std::size_t b = 0; o_.trace && b < at.size(); ++b) trace_.mark("all-reduce bucket " + std::to_string(b) + " starts", micros_of(at[b] - t0), 0);
  return walk;
}

/// The gradients made complete: the data-parallel reduction finished, under sequence parallelism (and
/// shared key/value heads) the partial gradients summed, ZeRO-3's parameters emptied, the user's
/// `before_optimizer` called, the loss scale divided out.
MPX_DECL void TrainerCore::complete_gradients(clock::time_point t0)
{
  const auto f0 = clock::now();
  buckets_.finish();
  if (o_.trace && w_.replicas > 1) trace_.mark("wait all-reduce", micros_of(f0 - t0), micros_of(clock::now() - f0));
  for (int s = 0; s < stages_.num_stages(); ++s)
    if (stages_.holds(s)) stages_.sum_partial_gradients(s);
  optimizers_.release_parameters();  // ZeRO-3: emptied, nothing reads their shapes now (a hook sees 0 elements)
  call_before_optimizer();
  if (scaler_.enabled()) unscale(held_, scaler_.scale());
  shed_gradients();
}

/// Sharded stages count their terms of the global norm (reduce-scattered ones from the owned parts, × the
/// replica count that the step's sum divides by; all-reduced ones from the whole gradients), then ZeRO-2
/// stages keep the owned part of their gradients and drop the rest.
MPX_DECL void TrainerCore::shed_gradients()
{
  shed_sq_ = 0;
  for (int s = 0, h = 0; s < stages_.num_stages(); ++s) {
    if (!stages_.holds(s)) continue;
    const auto i = std::size_t(h++);
    if (scattered(s)) shed_sq_ += w_.replicas * optimizers_.shard(s)->owned_gradient_sq(shard_counted_[i]);
    else if (optimizers_.sharding(s) >= 2) shed_sq_ += local_grad_sq(StageNormTerms{counted_[i]});
    if (optimizers_.sharding(s) >= 2) optimizers_.gradients_in(s);
  }
}

/// Stage s's ZeRO shard when its gradients are reduce-scattered into it: sharded, and no tensor-parallel
/// sum of partial gradients (sequence parallelism, shared key/value heads) or partial norm term, which need
/// the whole averaged gradients (those stages all-reduce).
MPX_DECL const ZeroShard* TrainerCore::scattered(int s) const
{
  const ZeroShard* z = optimizers_.shard(s);
  if (!z || stages_.has_partial_gradients(s)) return nullptr;
  for (const auto& t : stages_.norm_parameters(s))
    if (t.dim >= 0) return nullptr;
  return z;
}

/// The step's statistics agreed over the world and the optimizers stepped (or the step skipped), in
/// `step_order()`.
MPX_DECL void TrainerCore::update_parameters(const ExecutorCore::Walk& walk, StepStats& st)
{
  const bool agree_first = step_order() == StepOrder::agree_then_step;
  if (!agree_first) step_optimizers(st);  // nothing in the update depends on the other ranks
  const StepReduction red = agree_on_step(walk, agree_first);
  st.loss = red.loss;
  st.grad_norm = red.grad_norm;
  if (agree_first) {
    st.skipped = scaler_.update(red.found_inf);
    if (!st.skipped) step_optimizers(st);
  }
}

/// The step's one collective: the loss once per replica (tensor-parallel rank 0 of the last slot), each
/// parameter once in the norm (after a step that came first, the norm reads what the optimizers' passes summed).
MPX_DECL StepReduction TrainerCore::agree_on_step(const ExecutorCore::Walk& walk, bool agree_first)
{
  const double sq = shed_sq_ + (agree_first ? local_grad_sq(counted_)
                                            : local_grad_sq(counted_, [this](const at::Tensor& p) { return optimizers_.stepped_grad_sq(p); }));
  auto reduction = start_reduce_step(w_, w_.tp_rank == 0 ? walk.loss_sum : at::Tensor(), sq, step_, sum_.get());
  return finish_reduce_step(w_, reduction);
}

/// Clips (when clipping is on: the global norm is known then) and steps every optimizer.
MPX_DECL void TrainerCore::step_optimizers(StepStats& st)
{
  const auto o0 = clock::now();
  clip(held_, st.grad_norm, o_.clip_norm);
  optimizers_.scale_shard_gradients(clip_factor(st.grad_norm, o_.clip_norm));  // ZeRO-2's gradients are in the shards
  optimizers_.step(st.lr, step_);
  st.optimizer_seconds = seconds_of(clock::now() - o0);
}

/// Whether some stage of this rank runs its backward split (its module marks blocks).
MPX_DECL bool TrainerCore::splits_here() const
{
  bool any = false;
  for (int s = 0; s < stages_.num_stages(); ++s) any = any || (stages_.holds(s) && executor_.split().ran_split(s));
  return any;
}

MPX_DECL void TrainerCore::call_before_optimizer()
{
  if (!o_.before_optimizer) return;
  for (int s = 0; s < stages_.num_stages(); ++s)
    if (stages_.holds(s)) o_.before_optimizer(s, step_, stages_.parameters(s));
}

}  // namespace mpx::detail
#endif  // MPX_DEFINITIONS
