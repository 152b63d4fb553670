// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file print.hpp
/// `std::cout << mpx::print<P>`: a pipeline's stage -> slot table, its forward-only stages, its schedule's
/// expected bubble and peak in-flight micro-batches, and each rank's timeline in ASCII. When in doubt, print it.
///
/// ```
/// std::cout << mpx::print<MyPipeline>;
/// mpx::print_timeline(std::cout, some_table);   // any schedule table
/// ```

#include <mpx/action.hpp>    // mpx::expand, mpx::op_name
#include <mpx/device.hpp>    // mpx::device_traits
#include <mpx/pipeline.hpp>  // mpx::PipelineType, mpx::proof
#include <mpx/proof.hpp>     // mpx::prove
#include <mpx/linkage.hpp>  // MPX_DECL, MPX_DEFINITIONS
#include <mpx/table_view.hpp>  // mpx::TableView, mpx::table_view

#include <cstdint>    // std::int64_t
#include <ostream>    // std::ostream
#include <string>     // std::string
#include <vector>     // std::vector

namespace mpx
{

namespace detail
{
inline std::string pad(std::string s, std::size_t w)
{
  if (s.size() < w) s.append(w - s.size(), ' ');
  return s;
}

/// What `print<P>` shows of one stage.
struct StageSummary
{
  int slot = 0;
  std::string_view device, module, input, output;  // "CPU" (printed with the slot: "CPU<0>"), the module's name, the boundaries' types
  bool frozen = false, checkpointed = false, has_layers = false;
  std::string_view optimizer, precision, wire;  // empty: none (FP32 for the precision)
  int tensor_parallel = 1, layer_begin = 0, layer_end = 0;  // layer_end: -1 for mpx::to_end
  std::vector<std::string_view> reads;
};

/// What `print<P>` shows of pipeline P: built by `summary<P>()`, written by `print_pipeline`, compiled once
/// under `mpx::compiled`.
struct PipelineSummary
{
  enum class Published
  {
    none,
    flat,         // GPipe, 1F1B: (p-1)/(m+p-1)
    interleaved,  // (p-1)/(v*m+p-1)
    zbh1,         // (p-1)/(3m+p-1)
  };
  int stages = 0, slots = 0, microbatches = 0, chunks = 1, forward_only = 0;
  std::string_view schedule;
  bool proved_at_compile_time = false;
  Published published = Published::none;
  std::vector<StageSummary> rows;
  bool costs = false;               // declared costs, proved at compile time: the lines below
  std::vector<std::int64_t> load;   // each slot's declared cost per micro-batch (forward + backward)
  std::int64_t predicted_makespan = 0;
  double predicted_bubble = 0;
  TableView table;
};

MPX_DECL std::ostream& print_pipeline(std::ostream& os, const PipelineSummary& p);
}  // namespace detail


/// Writes each rank's expected timeline (one column per time unit; `.` idle). A failed proof is printed
/// instead, with its location.
template <class AnyTable>
void print_timeline(std::ostream& os, const AnyTable& t, int max_units = 120)
{
  const Layout& l = t.layout;
  std::vector<std::int64_t> starts(t.steps.size(), -1);
  const Proof p = prove(t, starts.data());
  if (!p.ok()) {
    os << "schedule proof failed: " << verdict_text(p.verdict);
    if (p.rank >= 0) os << " (rank " << p.rank << ", step " << p.step << ", " << op_name(p.action.op) << p.action.mb << " of stage " << p.action.stage << ")";
    os << "\n";
    return;
  }
  std::vector<int> stages_per_rank(std::size_t(l.ranks), 0);
  for (int s = 0; s < l.stages; ++s) ++stages_per_rank[l.rank_of[s]];
  auto label = [&](const Step& c) {
    std::string x;
    if (stages_per_rank[l.rank_of[c.stage]] > 1) x += std::to_string(c.stage) + ":";
    return x + op_name(c.op) + std::to_string(c.mb);
  };
  std::size_t w = 2;
  for (std::size_t i = 0; i < t.steps.size(); ++i) {
    const std::size_t n = label(t.steps[i]).size();
    if (n > w) w = n;
  }
  const std::int64_t units = p.makespan < max_units ? p.makespan : std::int64_t(max_units);
  for (int r = 0; r < l.ranks; ++r) {
    std::vector<std::string> row(std::size_t(units), std::string(w, '.'));
    for (std::uint32_t i = t.begin[r]; i < t.begin[r + 1]; ++i) {
      const Step& c = t.steps[i];
      for (int u = 0; u < cost_of(c.op); ++u)
        if (starts[i] + u < units) row[std::size_t(starts[i] + u)] = detail::pad(label(c), w);
    }
    os << "rank " << r << (r < 10 ? "  |" : " |");
    for (auto& cell : row) os << cell << '|';
    if (p.makespan > units) os << " ... (" << p.makespan - units << " more units)";
    os << "\n";
  }
  os << "expected bubble " << int(p.bubble() * 1000 + 0.5) / 10.0 << "%  (step " << p.makespan
     << " units: F 1, B 2, I 1, W 1)  peak in-flight per rank:";
  for (int r = 0; r < l.ranks; ++r) os << ' ' << p.peak_in_flight[r];
  os << "\n";
}

/// `print_timeline` of a `TableView` (what `print<P>` shows): compiled once under `mpx::compiled`.
MPX_DECL void print_timeline(std::ostream& os, const TableView& t, int max_units = 120);

/// Writes one rank's explicit action list (computes, posted receives, sends).
template <class AnyTable>
void print_actions(std::ostream& os, const AnyTable& t, int r)
{
  os << "rank " << r << ":";
  for (const Action& a : expand(t, r)) os << ' ' << op_name(a.op) << a.mb << (t.layout.stages > t.layout.ranks ? "@" + std::to_string(a.stage) : "");
  os << "\n";
}

/// Printable description of a pipeline type: `std::cout << mpx::print<P>`.
template <PipelineType P>
struct printer
{
};
template <PipelineType P>
inline constexpr printer<P> print{};

namespace detail
{
template <class S>
StageSummary stage_summary()
{
  StageSummary x;
  x.slot = S::slot;
  x.frozen = S::frozen, x.checkpointed = S::checkpointed, x.has_layers = S::has_layers;
  if constexpr (!std::is_void_v<typename S::optimizer>) x.optimizer = S::optimizer::name;
  if constexpr (!std::is_same_v<typename S::precision, FP32>) x.precision = S::precision::name;
  if constexpr (!std::is_void_v<typename S::wire>) x.wire = S::wire::name;
  x.tensor_parallel = S::tensor_parallel;
  x.layer_begin = S::has_layers ? S::layer_begin : 0;
  x.layer_end = S::has_layers ? (S::layer_end == to_end ? -1 : S::layer_end) : 0;
  for (std::size_t f = 0; f < S::reads::size; ++f) x.reads.push_back(S::reads::fields[f]);
  return x;
}

template <PipelineType P>
PipelineSummary summary()
{
  using Tag = typename P::schedule;
  PipelineSummary p;
  p.stages = P::num_stages, p.slots = P::num_slots, p.microbatches = P::num_microbatches, p.chunks = P::num_chunks;
  p.forward_only = P::forward_only_stages;
  p.schedule = Tag::name;
  p.proved_at_compile_time = P::proved_at_compile_time;
  if constexpr (std::is_same_v<Tag, GPipe> || std::is_same_v<Tag, OneFOneB>) p.published = PipelineSummary::Published::flat;
  else if constexpr (std::is_same_v<Tag, Interleaved1F1B>) p.published = PipelineSummary::Published::interleaved;
  else if constexpr (std::is_same_v<Tag, ZBH1>) p.published = PipelineSummary::Published::zbh1;
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    (p.rows.push_back([] {
      using S = typename P::template stage<int(I)>;
      StageSummary x = stage_summary<S>();
      x.device = device_traits<typename S::device>::name;
      x.module = S::traits::name;
      x.input = type_name<typename P::template input_of<int(I)>>();
      x.output = type_name<typename P::template output_of<int(I)>>();
      return x;
    }()), ...);
  }(std::make_index_sequence<std::size_t(P::num_stages)>{});
  if constexpr (P::declares_costs && P::proved_at_compile_time) {
    p.costs = true;
    p.load.assign(std::size_t(P::num_slots), 0);
    for (int s = 0; s < P::num_stages; ++s)
      p.load[std::size_t(P::slots[s])] += P::stage_costs.forward[std::size_t(s)] + (P::layout.trains(s) ? P::stage_costs.backward[std::size_t(s)] : 0);
    p.predicted_makespan = P::predicted.makespan;
    p.predicted_bubble = P::predicted.bubble();
  }
  p.table = table_view<P>();
  return p;
}
}  // namespace detail

template <PipelineType P>
std::ostream& operator<<(std::ostream& os, printer<P>)
{
  return detail::print_pipeline(os, detail::summary<P>());
}

}  // namespace mpx

#if MPX_DEFINITIONS
// ---- definitions (compiled once under MPX_SEPARATE_COMPILATION: linkage.hpp) ----
namespace mpx
{
MPX_DECL void print_timeline(std::ostream& os, const TableView& t, int max_units) { print_timeline<TableView>(os, t, max_units); }

namespace detail
{
inline std::string policy_list(const StageSummary& s)
{
  std::string out;
  auto add = [&](std::string_view x) {
    if (!out.empty()) out += ' ';
    out += x;
  };
  if (s.frozen) add("Frozen");
  if (s.checkpointed) add("Checkpointed");
  if (!s.optimizer.empty()) add("Optimizer<" + std::string(s.optimizer) + ">");
  if (!s.precision.empty()) add("Precision<" + std::string(s.precision) + ">");
  if (!s.wire.empty()) add("Wire<" + std::string(s.wire) + ">");
  if (s.tensor_parallel > 1) add("TP<" + std::to_string(s.tensor_parallel) + ">");
  if (s.has_layers) add("Layers<" + std::to_string(s.layer_begin) + "," + (s.layer_end < 0 ? std::string("end") : std::to_string(s.layer_end)) + ">");
  for (auto f : s.reads) add("Reads:" + std::string(f));
  return out.empty() ? "-" : out;
}

/// Each slot's declared load per micro-batch and the predicted step under the schedule (balance.hpp).
inline void print_costs(std::ostream& os, const PipelineSummary& p)
{
  std::int64_t most = 0;
  os << "declared cost per micro-batch (forward + backward):";
  for (int q = 0; q < p.slots; ++q) {
    os << (q ? ", " : " ") << "slot " << q << ' ' << p.load[std::size_t(q)];
    most = p.load[std::size_t(q)] > most ? p.load[std::size_t(q)] : most;
  }
  os << "\npredicted step " << p.predicted_makespan << " (the busiest slot's work " << most * p.microbatches << "), bubble "
     << int(p.predicted_bubble * 1000 + 0.5) / 10.0 << "%\n";
}

MPX_DECL std::ostream& print_pipeline(std::ostream& os, const PipelineSummary& p)
{
  os << "mpx::Pipeline: " << p.stages << " stages on " << p.slots << " slots, schedule " << p.schedule << ", " << p.microbatches
     << " micro-batches, proved " << (p.proved_at_compile_time ? "at compile time" : "at start-up") << "\n";
  std::vector<std::vector<std::string>> rows{{"stage", "slot", "device", "module", "input -> output", "policies"}};
  for (std::size_t i = 0; i < p.rows.size(); ++i) {
    const StageSummary& s = p.rows[i];
    rows.push_back({std::to_string(i), std::to_string(s.slot), std::string(s.device) + "<" + std::to_string(s.slot) + ">", std::string(s.module),
                    std::string(s.input) + " -> " + std::string(s.output), policy_list(s)});
  }
  std::vector<std::size_t> w(rows[0].size(), 0);
  for (auto& r : rows)
    for (std::size_t c = 0; c < r.size(); ++c) w[c] = r[c].size() > w[c] ? r[c].size() : w[c];
  for (auto& r : rows) {
    os << " ";
    for (std::size_t c = 0; c < r.size(); ++c) os << ' ' << pad(r[c], c + 1 < r.size() ? w[c] : 0);
    os << "\n";
  }
  const int q = p.slots, m = p.microbatches, v = p.chunks;
  if (p.costs) print_costs(os, p);
  if (p.forward_only > 0) {
    os << "forward only: stage" << (p.forward_only > 1 ? "s 0-" + std::to_string(p.forward_only - 1) : std::string(" 0"))
       << " (Frozen, nothing trainable before): no backward, no gradient messages, no activations kept\n";
    if (p.forward_only < p.stages) {
      print_timeline(os, p.table);
      return os;  // the published formulas assume every stage runs a backward
    }
  }
  using Published = PipelineSummary::Published;
  if (p.published == Published::flat)
    os << "published bubble (p-1)/(m+p-1) = " << int(1000.0 * (q - 1) / (m + q - 1) + 0.5) / 10.0 << "%\n";
  else if (p.published == Published::interleaved)
    os << "published bubble (p-1)/(v*m+p-1) = " << int(1000.0 * (q - 1) / (v * m + q - 1) + 0.5) / 10.0 << "%\n";
  else if (p.published == Published::zbh1) {
    os << "published ZB-H1 bubble, at best (p-1)/(3m+p-1) = " << int(1000.0 * (q - 1) / (3 * m + q - 1) + 0.5) / 10.0 << "%\n";
    os << "split backward (I, W): by default kept only if measured faster than the whole backward in I over the first steps "
          "(TrainOptions::split_backward = measure, or always / never; the trainer says which on rank 0)\n";
  }
  print_timeline(os, p.table);
  return os;
}
}  // namespace detail
}  // namespace mpx
#endif
