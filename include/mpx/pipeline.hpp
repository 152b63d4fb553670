// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file pipeline.hpp
/// `Pipeline<Stages..., Options...>`: one type that says where every stage lives and how a step runs.
///
/// ```
/// using Moondream = mpx::Pipeline<
///     mpx::Stage<moondream::Vision, mpx::GPU<0>, mpx::Frozen, mpx::Checkpointed>,
///     mpx::Stage<moondream::Text,   mpx::GPU<1>, mpx::Optimizer<mpx::AdamW8bit>>,
///     mpx::Schedule<mpx::OneFOneB>, mpx::Microbatches<8>>;
/// ```
/// Options: `Schedule<Tag>` (default `OneFOneB`), `Microbatches<M>` (default: the number of slots),
/// `Batch<B>` (needed when a stage `Reads` batch fields). Every rule that spans stages is checked here:
/// slots contiguous from 0, no two adjacent stages on one slot, one device kind and one tensor-parallel
/// degree per slot (a slot of degree N occupies N adjacent ranks: `tp_degree`, `first_rank`,
/// `ranks_per_replica`), boundary types that chain, `Layers` ranges that tile each module exactly once, batch fields that exist, the schedule's
/// constraints, and the schedule proof (proof.hpp).
///
/// The proof runs at compile time when it steps through at most `MPX_COMPILE_TIME_PROOF_STEPS` computes
/// one by one (default 8192: the compiler's constant evaluator costs 0.1 to 0.2 ms a step): every step of
/// a flat table, about stages² for a compressed one (runs.hpp: every built-in; 5 stages² for ZB-H1), whose
/// steady state the proof fast-forwards whatever m is. Larger ones are proved at start-up, before the first step,
/// by the same function. `Pipeline::proved_at_compile_time` says which.

#include <mpx/action.hpp>            // mpx::Layout, mpx::Table, mpx::FrozenTable
#include <mpx/balance.hpp>           // mpx::predict, mpx::StageCosts
#include <mpx/device.hpp>            // mpx::DeviceKind
#include <mpx/pipeline_args.hpp>     // mpx::detail::stages_of, option_value, ...
#include <mpx/pipeline_queries.hpp>  // mpx::PipelineType, mpx::proof, mpx::proof_v, mpx::table_v, queries
#include <mpx/proof.hpp>             // mpx::prove, mpx::Proof
#include <mpx/proof_failures.hpp>    // mpx::detail::schedule_proof_failed, nccl_order_failed
#include <mpx/run_proof.hpp>         // mpx::prove of a RunTable
#include <mpx/runs.hpp>              // mpx::RunSchedule
#include <mpx/schedule.hpp>          // mpx::Schedule, mpx::Microbatches, mpx::OneFOneB
#include <mpx/stage.hpp>             // mpx::Stage
#include <mpx/stage_chain.hpp>       // mpx::detail::StageChain
#include <mpx/user_table.hpp>        // mpx::UserTable

#include <array>        // std::array
#include <tuple>        // std::tuple, std::tuple_element_t
#include <type_traits>  // std::integral_constant, std::is_convertible_v
#include <utility>      // std::index_sequence

#ifndef MPX_COMPILE_TIME_PROOF_STEPS
#define MPX_COMPILE_TIME_PROOF_STEPS 8192
#endif

namespace mpx
{


/// A pipeline: stages plus options (see the file comment).
template <class... Args>
struct Pipeline
{
  static_assert(((detail::is_stage<Args> || detail::is_option<Args>) && ...),
                "mpx::Pipeline<...>: each argument must be an mpx::Stage<...> or an option (mpx::Schedule<...>, "
                "mpx::Microbatches<M>, mpx::Batch<B>)");
  static_assert(detail::count_if<detail::is_stage_p, Args...> >= 1, "mpx::Pipeline<...>: a pipeline needs at least one mpx::Stage<...>");
  static_assert(detail::count_if<detail::is_schedule_p, Args...> <= 1, "mpx::Pipeline<...>: give at most one mpx::Schedule<...>");
  static_assert(detail::count_if<detail::is_microbatches_p, Args...> <= 1, "mpx::Pipeline<...>: give at most one mpx::Microbatches<M>");
  static_assert(detail::count_if<detail::is_batch_p, Args...> <= 1, "mpx::Pipeline<...>: give at most one mpx::Batch<B>");

 private:
  using stage_list = typename detail::stages_of<detail::type_list<>, Args...>::type;
  using stage_indexer = typename detail::indexer_of<stage_list>::type;

 public:
  using stages = typename detail::as_tuple<stage_list>::type;
  template <int I>
  using stage = typename decltype(detail::select<std::size_t(I)>(std::declval<const stage_indexer&>()))::type;
  static constexpr int num_stages = static_cast<int>(std::tuple_size_v<stages>);

  using schedule = typename detail::schedule_of_option<typename detail::first_of<detail::is_schedule_p, void, Args...>::type>::type;
  using batch = typename detail::batch_of_option<typename detail::first_of<detail::is_batch_p, void, Args...>::type>::type;

 private:
  template <std::size_t... I>
  static constexpr std::array<int, sizeof...(I)> slots_impl(std::index_sequence<I...>) { return {stage<int(I)>::slot...}; }
  template <std::size_t... I>
  static constexpr std::array<int, sizeof...(I)> kinds_impl(std::index_sequence<I...>) { return {int(stage<int(I)>::kind)...}; }
  using seq = std::make_index_sequence<std::tuple_size_v<stages>>;

 public:
  static constexpr std::array<int, std::tuple_size_v<stages>> slots = slots_impl(seq{});
  static constexpr int num_slots = [] {
    int p = 0;
    for (int s : slots) p = s + 1 > p ? s + 1 : p;
    return p;
  }();

  // ---- Slots ----
  static_assert([] {
    for (int q = 0; q < num_slots; ++q) {
      bool used = false;
      for (int s : slots) used = used || s == q;
      if (!used) return false;
    }
    return true;
  }(), "mpx::Pipeline: device slots must be contiguous from 0 (every index 0..slots-1 used by some stage); renumber the devices");
  static_assert([] {
    for (std::size_t i = 1; i < slots.size(); ++i)
      if (slots[i] == slots[i - 1]) return false;
    return true;
  }(), "mpx::Pipeline: two adjacent stages sit on one slot; merge them into one stage or give them different devices");
  static_assert([] {
    constexpr auto kinds = kinds_impl(seq{});
    for (std::size_t i = 0; i < slots.size(); ++i)
      for (std::size_t j = 0; j < i; ++j)
        if (slots[i] == slots[j] && kinds[i] != kinds[j]) return false;
    return true;
  }(), "mpx::Pipeline: one slot holds both GPU and CPU stages; give each slot one device kind");

  // ---- Tensor parallelism: each slot's degree, the ranks of one pipeline ----
 private:
  template <std::size_t... I>
  static constexpr std::array<int, sizeof...(I)> degrees_impl(std::index_sequence<I...>) { return {stage<int(I)>::tensor_parallel...}; }
  static constexpr auto stage_degrees = degrees_impl(seq{});

 public:
  static_assert([] {
    for (std::size_t i = 0; i < slots.size(); ++i)
      for (std::size_t j = 0; j < i; ++j)
        if (slots[i] == slots[j] && stage_degrees[i] != stage_degrees[j]) return false;
    return true;
  }(), "mpx::Pipeline: the stages of one slot have different mpx::TensorParallel<N> degrees; a slot's ranks hold all "
       "its stages, so give them one degree");
  /// Per slot, its tensor-parallel degree: the number of ranks it occupies.
  static constexpr std::array<int, std::size_t(num_slots)> tp_degree = [] {
    std::array<int, std::size_t(num_slots)> d{};
    for (std::size_t i = 0; i < slots.size(); ++i) d[std::size_t(slots[i])] = stage_degrees[i];
    return d;
  }();
  /// Per slot, its first rank within one pipeline (replica): the slots' ranks are adjacent, slot by slot.
  static constexpr std::array<int, std::size_t(num_slots)> first_rank = [] {
    std::array<int, std::size_t(num_slots)> f{};
    for (int q = 1; q < num_slots; ++q) f[std::size_t(q)] = f[std::size_t(q - 1)] + tp_degree[std::size_t(q - 1)];
    return f;
  }();
  /// The ranks of one pipeline: WORLD_SIZE = replicas x this.
  static constexpr int ranks_per_replica = [] {
    int n = 0;
    for (int d : tp_degree) n += d;
    return n;
  }();
  /// The largest degree: the number of pipeline lanes (runtime/world/world.hpp).
  static constexpr int num_lanes = [] {
    int n = 1;
    for (int d : tp_degree) n = d > n ? d : n;
    return n;
  }();

  // ---- Schedule ----
  static constexpr int num_microbatches = [] {
    constexpr int m = detail::option_value<typename detail::first_of<detail::is_microbatches_p, void, Args...>::type>::value;
    return m > 0 ? m : num_slots;
  }();
  static constexpr int num_chunks = num_stages / (num_slots > 0 ? num_slots : 1);  ///< stages per slot (v)
  static_assert(schedule::interleaved || detail::any_placement<schedule>() || num_stages == num_slots,
                "mpx::Pipeline: a slot holds several stages but the schedule runs one stage per slot; use "
                "mpx::Schedule<mpx::Interleaved1F1B> or give every stage its own slot");
  static_assert(!schedule::interleaved || [] {
    for (int i = 0; i < num_stages; ++i)
      if (slots[i] != i % num_slots) return false;
    return true;
  }(), "mpx::Pipeline: mpx::Interleaved1F1B places stage i on slot i % slots (and the same number of stages on every "
       "slot); reorder the stages' devices");
  static_assert(!schedule::interleaved || num_microbatches % num_slots == 0,
                "mpx::Pipeline: mpx::Interleaved1F1B needs Microbatches to be a multiple of the slots (and at least the "
                "slots); set mpx::Microbatches<M> accordingly");

  // ---- Boundaries (stage_chain.hpp) ----
 private:
  using chain = detail::StageChain<stage_indexer, std::size_t(num_stages), batch>;

 public:
  /// What stage I receives and returns (a Layers stage's inner ranges exchange the module's hidden_type).
  template <int I>
  using input_of = typename chain::template input_of<I>;
  template <int I>
  using output_of = typename chain::template output_of<I>;
  static_assert(chain::boundaries_chain());
  static_assert(chain::layers_tile(),
                "mpx::Pipeline: the mpx::Layers<b, e> ranges of one module must tile its layers exactly once, in stage "
                "order: the first starts at 0, each starts where the previous ended (no gap, no overlap), only the last "
                "may use mpx::to_end and it ends at num_layers; and a module split into ranges cannot also be a whole stage");
  static_assert(chain::reads_exist(),
                "mpx::Pipeline: a stage Reads a batch field that the pipeline's mpx::Batch<B> does not have (or the "
                "pipeline has no mpx::Batch<B>); fix the field name or add the field or the option");

  // ---- The schedule and its proof ----
 private:
  template <std::size_t... I>
  static constexpr std::array<bool, sizeof...(I)> frozen_impl(std::index_sequence<I...>) { return {stage<int(I)>::frozen...}; }

 public:
  /// The leading `Frozen` stages: nothing before them trains, so they run forward only (no backward, no
  /// gradient message, no activations kept; action.hpp). A `Frozen` stage after a trainable one still runs
  /// its backward: the gradient must flow through it.
  static constexpr int forward_only_stages = [] {
    constexpr auto frozen = frozen_impl(seq{});
    int n = 0;
    while (n < num_stages && frozen[std::size_t(n)]) ++n;
    return n;
  }();
  /// The schedule's input: stage -> slot, micro-batches, forward-only stages.
  static constexpr Layout layout = [] {
    Layout l;
    l.ranks = num_slots;
    l.stages = num_stages;
    l.microbatches = num_microbatches;
    l.forward_only = forward_only_stages;
    for (int i = 0; i < num_stages; ++i) l.rank_of[i] = static_cast<std::uint16_t>(slots[i]);
    return l;
  }();
  /// Steps in one training step's table, all ranks together (a schedule may count them itself).
  static constexpr std::size_t num_steps = [] {
    if constexpr (requires { schedule::steps(layout); }) return schedule::steps(layout);
    else
      return std::size_t(forward_only_stages) * num_microbatches +
             std::size_t(num_stages - forward_only_stages) * num_microbatches * (schedule::split_backward ? 3 : 2);
  }();
  /// Whether the schedule has a compressed table (runs.hpp): its proof fast-forwards the steady state,
  /// so it runs at compile time whatever m is.
  static constexpr bool run_form = RunSchedule<schedule>;
  /// About how many computes the proof steps through one by one: every step of a flat table; for a
  /// compressed one, warm-up and drain (about stages², whatever m is; 5 stages² with a split backward,
  /// whose stages reach their steady pattern one after another) and the runs' pattern entries.
  static constexpr std::size_t proof_work = [] {
    if constexpr (run_form)
      return std::size_t(schedule::split_backward ? 5 : 1) * num_stages * num_stages + schedule::runs(layout).actions.size();
    else return num_steps;
  }();
  static constexpr bool proved_at_compile_time = proof_work <= MPX_COMPILE_TIME_PROOF_STEPS;

  /// The proof, run while the type is instantiated (an empty `Proof` when the table is too large: then
  /// `mpx::proof<P>()` runs it at start-up).
  static constexpr Proof compile_time_proof = [] {
    if constexpr (!proved_at_compile_time) return Proof{};
    else if constexpr (run_form) return prove(schedule::runs(layout));
    else return prove(schedule::table(layout));
  }();
  static_assert(detail::schedule_proof_failed<compile_time_proof.verdict, compile_time_proof.rank, compile_time_proof.step,
                                              compile_time_proof.action.op, compile_time_proof.action.stage,
                                              int(compile_time_proof.action.mb)>::ok);
  /// Whether some stage sits on a GPU: messages between GPU stages travel as on NCCL, a group per channel.
  static constexpr bool on_gpus = [] {
    constexpr auto kinds = kinds_impl(seq{});
    for (int k : kinds)
      if (k == int(DeviceKind::cuda)) return true;
    return false;
  }();
  /// The proof under NCCL's order with a group per channel (`Sends::never_wait`, proof.hpp): run at compile
  /// time where a stage sits on a GPU. Elsewhere (CPU ranks, the NCCL-rules stand-in) the proof above
  /// implies it — it makes every send wait for its receive, NCCL's order only removes waits — and this is
  /// an empty Proof.
  static constexpr Proof nccl_order_proof = [] {
    if constexpr (!proved_at_compile_time || !on_gpus || !compile_time_proof.ok()) return Proof{};
    else if constexpr (run_form) return prove(schedule::runs(layout), Sends::never_wait);
    else return prove(schedule::table(layout), Sends::never_wait);
  }();
  static_assert(detail::nccl_order_failed<nccl_order_proof.verdict, nccl_order_proof.rank, nccl_order_proof.action.op,
                                          nccl_order_proof.action.stage, int(nccl_order_proof.action.mb), nccl_order_proof.peer,
                                          nccl_order_proof.peer_action.op, nccl_order_proof.peer_action.stage,
                                          int(nccl_order_proof.peer_action.mb)>::ok);

  /// Builds the table (constant evaluation or run time alike).
  static constexpr Table make_table() { return schedule::table(layout); }

  // ---- Declared costs (balance.hpp) ----
 private:
  template <int I>
  static constexpr LayerCost declared_cost()
  {
    using S = stage<I>;
    const auto& all = S::traits::impl::layer_costs;
    const int n = int(all.size());
    const int b = S::has_layers ? S::layer_begin : 0, e = S::has_layers && S::layer_end != to_end ? S::layer_end : n;
    LayerCost c;
    for (int i = b; i < e && i < n; ++i) c.forward += all[std::size_t(i)].forward, c.backward += all[std::size_t(i)].backward;
    return c;
  }

 public:
  /// Whether every stage's module declares `static constexpr std::array<mpx::LayerCost, N> layer_costs`.
  static constexpr bool declares_costs = []<std::size_t... I>(std::index_sequence<I...>) {
    return (requires { stage<int(I)>::traits::impl::layer_costs; } && ...);
  }(seq{});
  /// Each stage's declared cost per micro-batch (the sum of its layers'; zero without declared costs).
  static constexpr StageCosts stage_costs = [] {
    StageCosts c;
    if constexpr (declares_costs)
      [&]<std::size_t... I>(std::index_sequence<I...>) {
        ((c.forward[I] = declared_cost<int(I)>().forward, c.backward[I] = declared_cost<int(I)>().backward), ...);
      }(seq{});
    c.split_evenly(num_stages);
    return c;
  }();
  /// The schedule's timeline under the declared costs: the predicted step (`makespan`), each slot's busy
  /// time, the bubble. Empty without declared costs, or when the proof runs at start-up.
  static constexpr Proof predicted = [] {
    if constexpr (!declares_costs || !proved_at_compile_time) return Proof{};
    else return predict<schedule>(layout, stage_costs);
  }();
};

}  // namespace mpx
