// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file runtime/trainer.hpp
/// `mpx::Trainer<P, Batch>`: trains a declared pipeline across processes. It builds this rank's stages of P
/// (`StageSet<P>`) and the typed walk (`Executor<P, Batch>`); the rest — the phases of a step, the
/// optimizers, save and load — is `detail::TrainerCore` (trainer_core.hpp), compiled once under
/// `mpx::compiled`. It composes the runtime's rooms and a step reads as their sequence:
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

#include <mpx/errors.hpp>                   // mpx::config_error
#include <mpx/pipeline.hpp>                 // mpx::PipelineType, mpx::proof
#include <mpx/runtime/executor.hpp>         // mpx::Executor
#include <mpx/runtime/microbatches.hpp>     // mpx::slice_microbatches, mpx::to_device
#include <mpx/runtime/options.hpp>          // mpx::TrainOptions, mpx::StepStats
#include <mpx/runtime/stage_set.hpp>        // mpx::StageSet
#include <mpx/runtime/trainer_core.hpp>     // mpx::detail::TrainerCore
#include <mpx/runtime/world/world.hpp>      // mpx::World
#include <mpx/shard_plan.hpp>               // mpx::shard_plan, mpx::check_shard_plan
#include <mpx/table_view.hpp>               // mpx::table_view, mpx::proof_of

#include <algorithm>  // std::find
#include <iostream>  // std::cout
#include <string>    // std::string
#include <utility>   // std::index_sequence
#include <vector>    // std::vector

namespace mpx
{

namespace detail
{
/// Whether ZeRO-3's plans (shard_plan.hpp) hold on every slot of P's table, both modes, for the stages
/// that declare `Sharded<3>`: proved here at compile time where the table is; a larger table's plan, and one
/// that `TrainOptions::sharding = 3` asks for at run time, are checked at start-up (zero_gathers.hpp).
template <PipelineType P>
consteval bool shard_plans_hold()
{
  std::vector<int> level;
  [&]<std::size_t... I>(std::index_sequence<I...>) { (level.push_back(P::template stage<int(I)>::sharding), ...); }(
      std::make_index_sequence<std::size_t(P::num_stages)>{});
  if (std::find(level.begin(), level.end(), 3) == level.end()) return true;
  if constexpr (P::num_steps > static_table_steps) return true;
  else
    for (int r = 0; r < P::num_slots; ++r) {
      const auto a = expand(view(table_v<P>), r);
      for (bool free_between : {false, true})
        if (!check_shard_plan(a, level, shard_plan(a, level, free_between)).ok) return false;
    }
  return true;
}
}  // namespace detail

template <PipelineType P, class Batch>
class Trainer
{
  static constexpr int M = P::num_microbatches;
  static_assert(detail::shard_plans_hold<P>(), "mpx::Trainer: ZeRO-3's gathers and releases do not hold on this schedule's table (shard_plan.hpp)");

 public:
  using Input = typename Executor<P, Batch>::Input;
  using Output = typename Executor<P, Batch>::Output;
  using InputFn = typename Executor<P, Batch>::InputFn;  ///< Input(const Batch&): stage 0's input from a micro-batch
  using LossFn = typename Executor<P, Batch>::LossFn;    ///< at::Tensor(const Output&, const Batch&): a scalar loss
  using StepOrder = detail::TrainerCore::StepOrder;

  /// Builds this rank's stages with `make(std::integral_constant<int, I>{})` (only for its own I) and their
  /// optimizers. Proves the schedule first when it was too large to prove at compile time.
  template <class Make>
  Trainer(World& world, Make&& make, InputFn input, LossFn loss, TrainOptions options = {})
      : proved_(prove_at_start_up()), stages_(world.slot, world.device, make, options, world.tp),
        executor_(world, stages_, std::move(input), std::move(loss)),
        core_(world, std::move(options), stages_, executor_, TraceLabel{std::string(P::schedule::name), P::num_slots, M, schedule_bubble()}),
        device_(world.device)
  {}

  /// One optimizer step over this replica's m micro-batches (on the host or this rank's device: they are
  /// moved to the device first, so the loss and the stages that read batch fields see device tensors).
  StepStats step(const std::vector<Batch>& host_microbatches)
  {
    detail::check_microbatch_count(host_microbatches.size(), M);
    std::vector<Batch> moved;
    executor_.use(device_.is_cpu() ? host_microbatches : (moved = to_device(host_microbatches, device_)));
    return core_.step();
  }

  /// The order of a step's end (detail::TrainerCore::step_order).
  StepOrder step_order() const { return core_.step_order(); }

  /// Collective over the data-parallel replicas (every rank calls it): the parameters of `Sharded<3>`
  /// stages whole on this rank until the next step — between steps they hold 0 elements (ZeRO-3). Read a
  /// module's weights after it; save and load gather by themselves.
  void gather_parameters() { core_.gather_parameters(); }

  /// This rank's module of stage I (a `config_error` if stage I lives on another rank).
  template <int I>
  typename StageSet<P>::template module_t<I>& module() { return stages_.template module<I>(); }

  /// Saves the whole training state as a new checkpoint `root/step-<steps done>` and points `root/latest`
  /// at it, keeping the newest `TrainOptions::checkpoints.keep` (runtime/checkpoint/save.hpp). A collective: every rank calls it.
  void save(const std::string& root) { core_.save(root); }
  /// Restores what `save` wrote (the checkpoint `path/latest` names, or `path` itself when it is one):
  /// parameters, buffers, optimizer states, step count, loss scaler and random generator, each file verified.
  void load(const std::string& path) { core_.load(path); }

  /// This rank's parameters of stage `s` (empty if the stage lives elsewhere), in module order.
  std::vector<at::Tensor> parameters(int s) const { return stages_.parameters(s); }
  /// Those parameters made whole: under TensorParallel<N> the cut ones gathered from the slot's ranks (a
  /// collective: each of them calls it), else copies — what the whole stage would hold.
  std::vector<at::Tensor> whole_parameters(int s) { return stages_.whole_parameters(s); }
  bool holds(int s) const { return stages_.holds(s); }
  /// The parameter elements this rank's optimizer of stage `s` steps: under `Sharded<L>` with several
  /// replicas its ZeRO shard's (about 1/d of the stage's), else all the stage's trainable ones.
  std::int64_t stepped_elements(int s) const { return core_.stepped_elements(s); }
  long steps_done() const { return core_.steps_done(); }
  /// Steps skipped because some rank saw an inf/NaN gradient.
  long skipped_steps() const { return core_.skipped_steps(); }
  double loss_scale() const { return core_.loss_scale(); }
  double expected_bubble() const { return core_.expected_bubble(); }
  /// ZB-H1: whether the walks split their backward, and what the measurement found (split_decision.hpp).
  const SplitDecision& split_decision() const { return core_.split_decision(); }
  /// Measured idle fraction of the last step on this rank: 1 - compute / wall (waits for data are idle).
  double measured_bubble() const { return core_.measured_bubble(); }

  /// Writes the last step's actions of every rank as one Chrome trace and, on rank 0, prints the measured
  /// bubble (mean over ranks) next to the expected one (trace.hpp). A collective over the world; needs
  /// `TrainOptions::trace`.
  double write_trace(const std::string& path, std::ostream& log = std::cout) { return core_.write_trace(path, log); }

 private:
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

  bool proved_;  // first: the schedule is proved before anything is built
  StageSet<P> stages_;
  Executor<P, Batch> executor_;
  detail::TrainerCore core_;
  torch::Device device_;
};

}  // namespace mpx
