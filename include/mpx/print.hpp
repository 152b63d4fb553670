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

template <class S>
std::string policy_list()
{
  std::string out;
  auto add = [&](std::string_view x) {
    if (!out.empty()) out += ' ';
    out += x;
  };
  if (S::frozen) add("Frozen");
  if (S::checkpointed) add("Checkpointed");
  if constexpr (!std::is_void_v<typename S::optimizer>) add("Optimizer<" + std::string(S::optimizer::name) + ">");
  if constexpr (!std::is_same_v<typename S::precision, FP32>) add("Precision<" + std::string(S::precision::name) + ">");
  if constexpr (!std::is_void_v<typename S::wire>) add("Wire<" + std::string(S::wire::name) + ">");
  if (S::tensor_parallel > 1) add("TP<" + std::to_string(S::tensor_parallel) + ">");
  if (S::has_layers)
    add("Layers<" + std::to_string(S::layer_begin) + "," + (S::layer_end == to_end ? std::string("end") : std::to_string(S::layer_end)) + ">");
  for (std::size_t f = 0; f < S::reads::size; ++f) add("Reads:" + std::string(S::reads::fields[f]));
  return out.empty() ? "-" : out;
}
}  // namespace detail

namespace detail
{
/// Each slot's declared load per micro-batch and the predicted step under the schedule (balance.hpp).
template <class P>
void print_costs(std::ostream& os)
{
  std::vector<std::int64_t> load(std::size_t(P::num_slots), 0);
  std::int64_t most = 0;
  for (int s = 0; s < P::num_stages; ++s)
    load[std::size_t(P::slots[s])] += P::stage_costs.forward[std::size_t(s)] + (P::layout.trains(s) ? P::stage_costs.backward[std::size_t(s)] : 0);
  os << "declared cost per micro-batch (forward + backward):";
  for (int q = 0; q < P::num_slots; ++q) {
    os << (q ? ", " : " ") << "slot " << q << ' ' << load[std::size_t(q)];
    most = load[std::size_t(q)] > most ? load[std::size_t(q)] : most;
  }
  os << "\npredicted step " << P::predicted.makespan << " (the busiest slot's work " << most * P::num_microbatches << "), bubble "
     << int(P::predicted.bubble() * 1000 + 0.5) / 10.0 << "%\n";
}
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

template <PipelineType P>
std::ostream& operator<<(std::ostream& os, printer<P>)
{
  using Tag = typename P::schedule;
  os << "mpx::Pipeline: " << P::num_stages << " stages on " << P::num_slots << " slots, schedule " << Tag::name << ", "
     << P::num_microbatches << " micro-batches, proved " << (P::proved_at_compile_time ? "at compile time" : "at start-up")
     << "\n";
  std::vector<std::vector<std::string>> rows{{"stage", "slot", "device", "module", "input -> output", "policies"}};
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    (rows.push_back({std::to_string(I), std::to_string(P::slots[I]),
                     std::string(device_traits<typename P::template stage<int(I)>::device>::name) + "<" +
                         std::to_string(P::slots[I]) + ">",
                     std::string(P::template stage<int(I)>::traits::name),
                     std::string(detail::type_name<typename P::template input_of<int(I)>>()) + " -> " +
                         std::string(detail::type_name<typename P::template output_of<int(I)>>()),
                     detail::policy_list<typename P::template stage<int(I)>>()}),
     ...);
  }(std::make_index_sequence<std::size_t(P::num_stages)>{});
  std::vector<std::size_t> w(rows[0].size(), 0);
  for (auto& r : rows)
    for (std::size_t c = 0; c < r.size(); ++c) w[c] = r[c].size() > w[c] ? r[c].size() : w[c];
  for (auto& r : rows) {
    os << " ";
    for (std::size_t c = 0; c < r.size(); ++c) os << ' ' << detail::pad(r[c], c + 1 < r.size() ? w[c] : 0);
    os << "\n";
  }
  const int p = P::num_slots, m = P::num_microbatches, v = P::num_chunks;
  if constexpr (P::declares_costs && P::proved_at_compile_time) detail::print_costs<P>(os);
  if constexpr (P::forward_only_stages > 0) {
    os << "forward only: stage" << (P::forward_only_stages > 1 ? "s 0-" + std::to_string(P::forward_only_stages - 1) : std::string(" 0"))
       << " (Frozen, nothing trainable before): no backward, no gradient messages, no activations kept\n";
    if (P::forward_only_stages < P::num_stages) {
      print_timeline(os, table_view<P>());
      return os;  // the published formulas assume every stage runs a backward
    }
  }
  if constexpr (std::is_same_v<Tag, GPipe> || std::is_same_v<Tag, OneFOneB>)
    os << "published bubble (p-1)/(m+p-1) = " << int(1000.0 * (p - 1) / (m + p - 1) + 0.5) / 10.0 << "%\n";
  else if constexpr (std::is_same_v<Tag, Interleaved1F1B>)
    os << "published bubble (p-1)/(v*m+p-1) = " << int(1000.0 * (p - 1) / (v * m + p - 1) + 0.5) / 10.0 << "%\n";
  else if constexpr (std::is_same_v<Tag, ZBH1>) {
    os << "published ZB-H1 bubble, at best (p-1)/(3m+p-1) = " << int(1000.0 * (p - 1) / (3 * m + p - 1) + 0.5) / 10.0 << "%\n";
    os << "split backward (I, W): by default kept only if measured faster than the whole backward in I over the first steps "
          "(TrainOptions::split_backward = measure, or always / never; the trainer says which on rank 0)\n";
  }
  print_timeline(os, table_view<P>());
  return os;
}

}  // namespace mpx

#if MPX_DEFINITIONS
// ---- definitions (compiled once under MPX_SEPARATE_COMPILATION: linkage.hpp) ----
namespace mpx
{
MPX_DECL void print_timeline(std::ostream& os, const TableView& t, int max_units) { print_timeline<TableView>(os, t, max_units); }
}  // namespace mpx
#endif
