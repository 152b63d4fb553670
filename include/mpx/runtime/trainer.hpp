// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file runtime/trainer.hpp
/// `mpx::Trainer<P, Batch>`: trains a declared pipeline across processes. It composes the runtime's rooms
/// and `step` reads as their sequence:
///
/// | phase | room |
/// |---|---|
/// | micro-batches to the device | `microbatches.hpp` |
/// | `walk_schedule`: the schedule's actions (buckets start as stages finish), ZB-H1 split or whole | `executor.hpp` (over `stage_set.hpp`, `backward.hpp`, `boundary_links.hpp`), `split_decision.hpp` |
/// | `complete_gradients`: the data-parallel reduction finished, partial gradients summed (sequence parallelism), unscaled | `gradient_buckets.hpp`, `stage_set.hpp` |
/// | `update_parameters`, in `step_order()`: the step's statistics (loss, norm, inf/NaN) agreed in one collective, and skip, clip, step | `grad_stats.hpp` (through shared memory on one host: `shm_links.hpp`), `stage_optimizers.hpp` |
///
/// ```
/// mpx::Trainer<Model, MyBatch> t(world, [](auto stage) { return make_stage<decltype(stage)::value>(); },
///                               input_fn, loss_fn, options);
/// mpx::StepStats st = t.step(mpx::slice_microbatches(batch, Model::num_microbatches));
/// ```

#include <mpx/pipeline.hpp>                  // mpx::PipelineType, mpx::proof
#include <mpx/errors.hpp>            // mpx::config_error
#include <mpx/runtime/executor.hpp>          // mpx::Executor
#include <mpx/runtime/launch/faults.hpp>            // mpx::inject_fault
#include <mpx/runtime/grad_stats.hpp>        // mpx::reduce_step, mpx::clip, mpx::unscale
#include <mpx/runtime/gradient_buckets.hpp>  // mpx::GradientBuckets
#include <mpx/runtime/microbatches.hpp>      // mpx::slice_microbatches, mpx::to_device
#include <mpx/runtime/options.hpp>           // mpx::TrainOptions, mpx::StepStats
#include <mpx/runtime/split_decision.hpp>    // mpx::SplitDecision
#include <mpx/runtime/precision.hpp>         // mpx::LossScaler
#include <mpx/runtime/shm_links.hpp>         // mpx::make_world_sum, mpx::ShmSum
#include <mpx/runtime/stage_optimizers.hpp>  // mpx::StageOptimizers
#include <mpx/runtime/stage_set.hpp>         // mpx::StageSet
#include <mpx/runtime/training_state.hpp>   // mpx::save_training_state, mpx::load_training_state
#include <mpx/runtime/trace.hpp>             // mpx::TraceRecorder
#include <mpx/runtime/world/world.hpp>             // mpx::World
#include <mpx/table_view.hpp>                // mpx::table_view, mpx::proof_of

#include <chrono>    // std::chrono::steady_clock
#include <iostream>  // std::cout, std::clog
#include <memory>    // std::unique_ptr
#include <string>    // std::string
#include <vector>    // std::vector

namespace mpx
{

template <PipelineType P, class Batch>
class Trainer
{
  static constexpr int N = P::num_stages;
  static constexpr int M = P::num_microbatches;
  using clock = std::chrono::steady_clock;

 public:
  using Input = typename Executor<P, Batch>::Input;
  using Output = typename Executor<P, Batch>::Output;
  using InputFn = typename Executor<P, Batch>::InputFn;  ///< Input(const Batch&): stage 0's input from a micro-batch
  using LossFn = typename Executor<P, Batch>::LossFn;    ///< at::Tensor(const Output&, const Batch&): a scalar loss

  /// Builds this rank's stages with `make(std::integral_constant<int, I>{})` (only for its own I) and their
  /// optimizers. Proves the schedule first when it was too large to prove at compile time.
  template <class Make>
  Trainer(World& world, Make&& make, InputFn input, LossFn loss, TrainOptions options = {})
      : w_(world), o_(std::move(options)), proved_(prove_at_start_up()), scaler_(o_.scaler), stages_(w_.slot, w_.device, make, o_, w_.tp),
        optimizers_(stages_, o_), executor_(w_, stages_, std::move(input), std::move(loss)), sum_(make_world_sum(w_)),
        buckets_(w_.dp, w_.replicas, o_.bucket_bytes, w_.timeout), split_(executor_.split().schedule_splits(), o_.split_backward, o_.split_trials),
        expected_bubble_(schedule_bubble())
  {
    for (int s = 0; s < N; ++s)
      if (stages_.holds(s)) held_.push_back(stages_.parameters(s)), counted_.push_back(stages_.norm_parameters(s));
  }

  /// One optimizer step over this replica's m micro-batches (on the host or this rank's device: they are
  /// moved to the device first, so the loss and the stages that read batch fields see device tensors).
  StepStats step(const std::vector<Batch>& host_microbatches)
  {
    check_count(host_microbatches);
    inject_fault(w_.env, FaultPoint::step, step_);  // MPX_FAULT (tests of failure handling)
    std::vector<Batch> moved;
    const auto& mbs = w_.device.is_cpu() ? host_microbatches : (moved = to_device(host_microbatches, w_.device));
    StepStats st;
    st.loss_scale = scaler_.scale();
    executor_.choose_split(split_.split_at(steps_run_));
    const auto t0 = clock::now();
    const auto walk = walk_schedule(mbs, t0);
    st.schedule_seconds = seconds(clock::now() - t0);
    const bool settle_split = split_.record(steps_run_, st.schedule_seconds);
    complete_gradients(t0);
    st.lr = o_.lr(step_);
    update_parameters(walk, st);
    optimizers_.zero();
    if (settle_split) split_.decide(w_, splits_here(), std::clog);
    st.seconds = seconds(clock::now() - t0);
    st.compute_seconds = walk.compute_seconds;
    st.wait_seconds = walk.wait_seconds;
    last_ = st;
    ++step_;
    ++steps_run_;
    return st;
  }

  /// The order of a step's end, the one place that says it. `agree_then_step` when the update needs the
  /// other ranks — an inf/NaN skip (`skip_nonfinite`), clipping (`clip_norm`) or a loss scaler: the ranks
  /// agree on loss, gradient norm and inf/NaN first, then each skips, clips or steps alike. Otherwise
  /// `step_then_agree`: every rank steps its optimizers as soon as its gradients are complete, then the
  /// step's statistics are all-reduced (reported exactly, not waited for before the update).
  enum class StepOrder
  {
    agree_then_step,
    step_then_agree,
  };
  StepOrder step_order() const
  {
    return o_.skip_nonfinite || o_.clip_norm > 0 || scaler_.enabled() ? StepOrder::agree_then_step : StepOrder::step_then_agree;
  }

  /// This rank's module of stage I (a `config_error` if stage I lives on another rank).
  template <int I>
  typename StageSet<P>::template module_t<I>& module() { return stages_.template module<I>(); }

  /// Saves the whole training state as a new checkpoint `root/step-<steps done>` and points `root/latest`
  /// at it, keeping the newest `TrainOptions::checkpoints.keep` (runtime/checkpoint/save.hpp). A collective: every rank calls it.
  void save(const std::string& root)
  {
    save_training_state(w_, root, stages_, optimizers_, {step_, scaler_.scale(), scaler_.skipped(), scaler_.good_steps()}, o_.checkpoints);
  }
  /// Restores what `save` wrote (the checkpoint `path/latest` names, or `path` itself when it is one):
  /// parameters, buffers, optimizer states, step count, loss scaler and random generator, each file verified.
  void load(const std::string& path)
  {
    const auto t = load_training_state(w_, path, stages_, optimizers_, {step_, scaler_.scale(), 0, 0}, o_.checkpoints);
    step_ = t.step;
    scaler_.restore(t.loss_scale, t.skipped, t.good_steps);
  }

  /// This rank's parameters of stage `s` (empty if the stage lives elsewhere), in module order.
  std::vector<at::Tensor> parameters(int s) const { return stages_.parameters(s); }
  /// Those parameters made whole: under TensorParallel<N> the cut ones gathered from the slot's ranks (a
  /// collective: each of them calls it), else copies — what the whole stage would hold.
  std::vector<at::Tensor> whole_parameters(int s) { return stages_.whole_parameters(s); }
  bool holds(int s) const { return stages_.holds(s); }
  long steps_done() const { return step_; }
  /// Steps skipped because some rank saw an inf/NaN gradient.
  long skipped_steps() const { return scaler_.skipped(); }
  double loss_scale() const { return scaler_.scale(); }
  double expected_bubble() const { return expected_bubble_; }
  /// ZB-H1: whether the walks split their backward, and what the measurement found (split_decision.hpp).
  const SplitDecision& split_decision() const { return split_; }
  /// Measured idle fraction of the last step on this rank: 1 - compute / wall (waits for data are idle).
  double measured_bubble() const { return last_.bubble(); }

  /// Writes the last step's actions of every rank as one Chrome trace and, on rank 0, prints the measured
  /// bubble (mean over ranks) next to the expected one (trace.hpp). A collective over the world; needs
  /// `TrainOptions::trace`.
  double write_trace(const std::string& path, std::ostream& log = std::cout)
  {
    if (!o_.trace) throw config_error("mpx: Trainer::write_trace: set TrainOptions::trace = true to record the actions");
    return trace_.write(w_, path, step_ - 1, last_, TraceLabel{std::string(P::schedule::name), P::num_slots, M, expected_bubble_}, log);
  }

 private:
  static double seconds(clock::duration d) { return std::chrono::duration<double>(d).count(); }
  static long us(clock::duration d) { return long(std::chrono::duration_cast<std::chrono::microseconds>(d).count()); }

  using Walk = typename Executor<P, Batch>::Walk;

  /// A step's first phase: the schedule's walk, data-parallel buckets arming before each stage's last
  /// backward and starting after it.
  Walk walk_schedule(const std::vector<Batch>& mbs, clock::time_point t0)
  {
    auto walk = executor_.walk(
        mbs, scaler_.scale(), step_, o_.trace ? &trace_ : nullptr,
        [this](int s) {
          if (o_.overlap_reduction) buckets_.arm(stages_.parameters(s));
        },
        [this](int s) { buckets_.start(stages_.parameters(s)); });
    if (o_.trace) trace_buckets(t0);
    return walk;
  }

  /// The gradients made complete: the data-parallel reduction finished, under sequence parallelism (and
  /// shared key/value heads) the partial gradients summed, the user's `before_optimizer` called, the loss
  /// scale divided out.
  void complete_gradients(clock::time_point t0)
  {
    const auto f0 = clock::now();
    buckets_.finish();
    if (o_.trace && w_.replicas > 1) trace_.mark("wait all-reduce", us(f0 - t0), us(clock::now() - f0));
    for (int s = 0; s < N; ++s)
      if (stages_.holds(s)) stages_.sum_partial_gradients(s);
    call_before_optimizer();
    if (scaler_.enabled()) unscale(held_, scaler_.scale());
  }

  /// The step's statistics agreed over the world and the optimizers stepped (or the step skipped), in
  /// `step_order()`.
  void update_parameters(const Walk& walk, StepStats& st)
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
  StepReduction agree_on_step(const Walk& walk, bool agree_first)
  {
    const double sq = agree_first ? local_grad_sq(counted_)
                                  : local_grad_sq(counted_, [this](const at::Tensor& p) { return optimizers_.stepped_grad_sq(p); });
    auto reduction = start_reduce_step(w_, w_.tp_rank == 0 ? walk.loss_sum : at::Tensor(), sq, step_, sum_.get());
    return finish_reduce_step(w_, reduction);
  }

  /// The step's bucket starts, as instants in the trace (data parallelism).
  void trace_buckets(clock::time_point t0)
  {
    const auto& at = buckets_.launched_at();
    for (std::size_t b = 0; b < at.size(); ++b) trace_.mark("all-reduce bucket " + std::to_string(b) + " starts", us(at[b] - t0), 0);
  }

  /// The schedule's expected bubble: the compile-time proof's when there is one (nothing to prove again),
  /// else the table's proved at start-up.
  static double schedule_bubble()
  {
    if constexpr (P::proved_at_compile_time) return P::compile_time_proof.bubble();
    else return proof_of(table_view<P>()).bubble();
  }

  /// The schedule proved before anything is built, when it was too large to prove at compile time (a
  /// `config_error` when the proof fails); true.
  static bool prove_at_start_up()
  {
    if constexpr (!P::proved_at_compile_time) {
      const Proof pr = proof<P>();
      if (!pr.ok())
        throw config_error(std::string("mpx: the schedule's proof failed at start-up: ") + verdict_text(pr.verdict) + " (rank " +
                           std::to_string(pr.rank) + ", step " + std::to_string(pr.step) + ")");
    }
    return true;
  }

  static void check_count(const std::vector<Batch>& mbs)
  {
    if (static_cast<int>(mbs.size()) != M)
      throw config_error("mpx: Trainer::step: got " + std::to_string(mbs.size()) + " micro-batches, the pipeline declares " +
                         std::to_string(M) + " (mpx::Microbatches<M>); slice the batch with mpx::slice_microbatches(batch, " +
                         std::to_string(M) + ")");
  }

  /// Clips (when clipping is on: the global norm is known then) and steps every optimizer.
  void step_optimizers(StepStats& st)
  {
    const auto o0 = clock::now();
    clip(held_, st.grad_norm, o_.clip_norm);
    optimizers_.step(st.lr);
    st.optimizer_seconds = seconds(clock::now() - o0);
  }

  /// Whether some stage of this rank runs its backward split (its module marks blocks).
  bool splits_here() const
  {
    for (int s = 0; s < N; ++s)
      if (stages_.holds(s) && executor_.split().ran_split(s)) return true;
    return false;
  }

  void call_before_optimizer()
  {
    if (!o_.before_optimizer) return;
    for (int s = 0; s < N; ++s)
      if (stages_.holds(s)) o_.before_optimizer(s, step_, stages_.parameters(s));
  }

  World& w_;
  TrainOptions o_;
  bool proved_;  // before the stages: the schedule is proved before anything is built
  LossScaler scaler_;
  StageSet<P> stages_;
  StageOptimizers optimizers_;
  Executor<P, Batch> executor_;
  std::unique_ptr<ShmSum> sum_;  // the end-of-step sum through shared memory when the world shares a host, else null (Gloo; shm_links.hpp)
  GradientBuckets buckets_;
  SplitDecision split_;
  TraceRecorder trace_;
  StageParameters held_;     // this rank's stages' parameters, in stage order
  StageNormTerms counted_;   // those it counts in the global gradient norm (tensor parallelism: each once)
  double expected_bubble_ = 0;
  long step_ = 0;
  long steps_run_ = 0;  // steps this trainer ran in this process (step_ counts those of a resumed checkpoint too)
  StepStats last_;
};

}  // namespace mpx
