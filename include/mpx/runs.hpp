// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file runs.hpp
/// Compressed schedule tables. A `RunTable` stores each rank's program as runs: a pattern of computes
/// repeated `count` times, the micro-batch of each pattern entry advancing by its stride every
/// repetition. 1F1B on rank r is three runs (warm-up F, steady [F B], drain B) whatever m is, so a
/// table of 64 ranks x 512 micro-batches is a few hundred runs instead of 65,536 steps, and the proof
/// (`prove(const RunTable&)` in run_proof.hpp) fast-forwards the steady state instead of stepping through it.
///
/// Rules of the form (what the built-in schedules produce and the run proof relies on):
/// - an entry's stride is the number of entries of the pattern with its (op, stage); such entries carry
///   consecutive micro-batches in pattern order (so each stage's actions of one kind run in micro-batch
///   order, as in every built-in schedule);
/// - receives are posted by one rule instead of per step: a rank keeps the receives of its next
///   `lookahead` receiving computes posted (`detail::post_receives`, action.hpp).
/// `to_table` expands a `RunTable` into the flat `Table` the executor walks and `mpx::print` shows; both
/// describe the same program.
///
/// Concept `RunSchedule` — a schedule tag that also has `static constexpr RunTable runs(const Layout&)`;
/// its `table(l)` is `to_table(runs(l))`. Models: GPipe, OneFOneB, Interleaved1F1B, ZBH1.

#include <mpx/action.hpp>  // mpx::Op, mpx::Layout, mpx::Table, mpx::detail::buffer

#include <cstdint>  // std::uint32_t
#include <vector>   // std::vector

namespace mpx
{

/// One entry of a run's pattern: its compute in the run's first repetition.
struct RunAction
{
  Op op{};
  std::uint16_t stage{};
  std::uint32_t mb{};
  std::uint32_t stride{1};  ///< micro-batch advance per repetition (filled by `run_builder::finish`)
};

/// A pattern of `len` computes (`RunTable::actions[first, first + len)`) repeated `count` times.
struct Run
{
  std::uint32_t first{}, len{}, count{};
};

/// Every rank's program for one step, as runs (see the file comment).
struct RunTable
{
  Layout layout;
  int lookahead = 1;                      ///< receiving computes whose receives are kept posted ahead (>= 1)
  detail::buffer<RunAction> actions;
  detail::buffer<Run> runs;               ///< all ranks' runs, rank after rank
  detail::buffer<std::uint32_t> begin;    ///< rank r's runs are [begin[r], begin[r+1])

  constexpr int num_ranks() const { return static_cast<int>(begin.size()) - 1; }
  /// Steps of rank r (computes, as a flat table counts them).
  constexpr std::size_t steps(int r) const
  {
    std::size_t n = 0;
    for (std::uint32_t j = begin.p[r]; j < begin.p[r + 1]; ++j) n += std::size_t(runs.p[j].len) * runs.p[j].count;
    return n;
  }
  constexpr std::size_t steps() const
  {
    std::size_t n = 0;
    for (int r = 0; r < num_ranks(); ++r) n += steps(r);
    return n;
  }
};

namespace detail
{
/// Builds a `RunTable` rank by rank in any order: `put` appends one compute (merged into the previous
/// run when that run is one entry of the same op and stage whose micro-batches it continues), `span` a
/// range of micro-batches of one op, `repeat` a pattern repeated `count` times. Generators call `span`
/// and `repeat` for anything that grows with m: the constant evaluator pays for every call. The backward
/// actions of forward-only stages (`Layout::forward_only`) are dropped on the way in, so every built-in
/// schedule gives them forwards only: dropping computes nobody waits for keeps a table deadlock-free, and
/// each remaining stage keeps its order (1F1B's and ZB-H1's warm-up depend on the distance to the last stage).
struct run_builder
{
  Layout layout;
  int lookahead;
  std::vector<std::vector<RunAction>> acts;  // per rank
  std::vector<std::vector<Run>> runs;        // per rank, `first` indexing acts[r]

  constexpr run_builder(const Layout& l, int look) : layout(l), lookahead(look), acts(std::size_t(l.ranks)), runs(std::size_t(l.ranks)) {}

  constexpr void put(int r, Op op, int s, int mb)
  {
    if (!runs_here(op, s)) return;
    auto& rr = runs[std::size_t(r)];
    auto& aa = acts[std::size_t(r)];
    if (!rr.empty() && rr.back().len == 1) {
      const RunAction& a = aa[rr.back().first];
      if (a.op == op && a.stage == s && a.mb + rr.back().count == std::uint32_t(mb)) { ++rr.back().count; return; }
    }
    rr.push_back(Run{std::uint32_t(aa.size()), 1, 1});
    aa.push_back(RunAction{op, std::uint16_t(s), std::uint32_t(mb), 1});
  }
  /// Appends op on stage s for micro-batches [mb, mb + n): one run, whatever n is.
  constexpr void span(int r, Op op, int s, int mb, int n)
  {
    if (n <= 0 || !runs_here(op, s)) return;
    put(r, op, s, mb);
    runs[std::size_t(r)].back().count += std::uint32_t(n - 1);
  }
  /// Appends `pattern` (computes of the first repetition) repeated `count` times; nothing if count is 0.
  constexpr void repeat(int r, const std::vector<RunAction>& all, int count)
  {
    std::vector<RunAction> pattern;
    for (const RunAction& a : all)
      if (runs_here(a.op, a.stage)) pattern.push_back(a);
    if (count <= 0 || pattern.empty()) return;
    if (count == 1) {
      for (const RunAction& a : pattern) put(r, a.op, a.stage, int(a.mb));
      return;
    }
    auto& aa = acts[std::size_t(r)];
    runs[std::size_t(r)].push_back(Run{std::uint32_t(aa.size()), std::uint32_t(pattern.size()), std::uint32_t(count)});
    for (const RunAction& a : pattern) aa.push_back(a);
  }

  /// Whether op of stage s belongs in the table: a forward-only stage's backward does not (a generator
  /// writes the schedule as if every stage trained; what it writes for them is dropped here).
  constexpr bool runs_here(Op op, int s) const { return op == Op::F || layout.trains(s); }

  /// The table, with each entry's stride set (the count of its (op, stage) in its pattern).
  constexpr RunTable finish()
  {
    RunTable t;
    t.layout = layout;
    t.lookahead = lookahead;
    std::size_t na = 0, nr = 0;
    for (int r = 0; r < layout.ranks; ++r) na += acts[std::size_t(r)].size(), nr += runs[std::size_t(r)].size();
    t.actions = buffer<RunAction>(na);
    t.runs = buffer<Run>(nr);
    t.begin = buffer<std::uint32_t>(std::size_t(layout.ranks) + 1);
    std::uint32_t ja = 0, jr = 0;
    for (int r = 0; r < layout.ranks; ++r) {
      t.begin.p[r] = jr;
      const auto& aa = acts[std::size_t(r)];
      for (Run run : runs[std::size_t(r)]) {
        for (std::uint32_t i = 0; i < run.len; ++i) {
          RunAction a = aa[run.first + i];
          a.stride = 0;
          for (std::uint32_t j = 0; j < run.len; ++j)
            a.stride += aa[run.first + j].op == a.op && aa[run.first + j].stage == a.stage;
          t.actions.p[ja + i] = a;
        }
        run.first = ja;
        ja += run.len;
        t.runs.p[jr++] = run;
      }
    }
    t.begin.p[layout.ranks] = jr;
    return t;
  }
};
}  // namespace detail

/// The flat table of a `RunTable`: every repetition spelled out, receives posted by its lookahead rule.
constexpr Table to_table(const RunTable& rt)
{
  const Layout& l = rt.layout;
  Table t(l, rt.steps());
  std::uint32_t at = 0;
  for (int r = 0; r < l.ranks; ++r) {
    t.begin.p[r] = at;
    for (std::uint32_t j = rt.begin.p[r]; j < rt.begin.p[r + 1]; ++j) {
      const Run& run = rt.runs.p[j];
      for (std::uint32_t q = 0; q < run.count; ++q)
        for (std::uint32_t i = 0; i < run.len; ++i) {
          const RunAction& a = rt.actions.p[run.first + i];
          t.steps.p[at++] = Step{a.op, a.stage, a.mb + q * a.stride, 0};
        }
    }
  }
  t.begin.p[l.ranks] = at;
  detail::post_receives(t, rt.lookahead);
  return t;
}

/// Concept: a schedule tag with a compressed table (see the file comment).
template <class T>
concept RunSchedule = requires(const Layout& l) {
  { T::runs(l) } -> std::same_as<RunTable>;
};

}  // namespace mpx
