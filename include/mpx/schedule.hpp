// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file schedule.hpp
/// The built-in schedules, as `constexpr` functions from a `Layout` to a `Table`: `GPipe`, `OneFOneB`,
/// `Interleaved1F1B` and `ZBH1`. A schedule is a tag type; `Schedule<Tag>` selects it in a `Pipeline`.
/// A user-written table is `UserTable<"...">` (user_table.hpp).
///
/// Concept `ScheduleTag` — minimal complete definition:
/// - `static constexpr std::string_view name;`
/// - `static constexpr bool interleaved;`  (several stages per rank: stage s on rank s % ranks)
/// - `static constexpr bool split_backward;`  (backward split into I and W, as ZB-H1)
/// - `static constexpr mpx::Table table(const mpx::Layout&);`
/// Optional: `static constexpr mpx::RunTable runs(const mpx::Layout&);` — the same table compressed
/// (runs.hpp); a pipeline then proves it at compile time whatever m is (GPipe, OneFOneB, Interleaved1F1B).
/// Models: GPipe, OneFOneB, Interleaved1F1B, ZBH1, UserTable<...>.
///
/// NOTE: the compiler's constant evaluator is slow per call and per step. GPipe, 1F1B and interleaved
/// 1F1B emit runs (runs.hpp), whose size does not grow with m; ZB-H1's list scheduler writes its flat
/// table through raw pointers with no helper calls in its loops.

#include <mpx/action.hpp>  // mpx::Step, mpx::Layout, mpx::Table
#include <mpx/runs.hpp>    // mpx::RunTable, mpx::to_table

#include <concepts>     // std::convertible_to
#include <string_view>  // std::string_view
#include <vector>       // std::vector

namespace mpx
{

namespace detail
{
/// A table sized for `per_stage` computes per (stage, micro-batch), ranks' slices laid out in order,
/// with `cursor[r]` pointing at rank r's next free step.
struct table_builder
{
  Table t;
  buffer<std::uint32_t> cursor;
  constexpr table_builder(const Layout& l, int per_stage)
      : t(l, std::size_t(l.stages) * l.microbatches * per_stage), cursor(std::size_t(l.ranks))
  {
    buffer<std::uint32_t> count(std::size_t(l.ranks));
    for (int s = 0; s < l.stages; ++s) count.p[l.rank_of[s]] += std::uint32_t(l.microbatches * per_stage);
    std::uint32_t at = 0;
    for (int r = 0; r < l.ranks; ++r) {
      t.begin.p[r] = at;
      cursor.p[r] = at;
      at += count.p[r];
    }
    t.begin.p[l.ranks] = at;
  }
  constexpr void put(int r, Op op, int s, int mb)
  {
    t.steps.p[cursor.p[r]++] = Step{op, std::uint16_t(s), std::uint32_t(mb), 0};
  }

  /// Sets where receives are posted (`detail::post_receives`, 1 or 2 receiving computes ahead): two
  /// neighbours that send to each other at the same moment then both find their receive posted (a Gloo
  /// send completes only when the peer has posted the matching receive).
  constexpr Table finish(int lookahead)
  {
    post_receives(t, lookahead);
    return static_cast<Table&&>(t);
  }
};
}  // namespace detail

/// GPipe (fill-drain): all forwards, then all backwards. Holds all m micro-batches in flight.
struct GPipe
{
  static constexpr std::string_view name = "GPipe";
  static constexpr bool interleaved = false;
  static constexpr bool split_backward = false;
  static constexpr RunTable runs(const Layout& l)
  {
    detail::run_builder b(l, 1);
    for (int s = 0; s < l.stages; ++s) {
      const int r = l.rank_of[s];
      b.span(r, Op::F, s, 0, l.microbatches);
      b.span(r, Op::B, s, 0, l.microbatches);
    }
    return b.finish();
  }
  static constexpr Table table(const Layout& l) { return to_table(runs(l)); }
};

/// 1F1B (PipeDream-Flush): stage s runs min(stages - s - 1, m) warm-up forwards, then alternates one
/// forward and one backward, then drains. Same bubble as GPipe, at most stages - s micro-batches in flight.
struct OneFOneB
{
  static constexpr std::string_view name = "1F1B";
  static constexpr bool interleaved = false;
  static constexpr bool split_backward = false;
  static constexpr RunTable runs(const Layout& l)
  {
    detail::run_builder b(l, 1);
    const int m = l.microbatches;
    for (int s = 0; s < l.stages; ++s) {
      const int r = l.rank_of[s];
      const int warmup = l.stages - s - 1 < m ? l.stages - s - 1 : m;
      b.span(r, Op::F, s, 0, warmup);
      b.repeat(r, {{Op::F, std::uint16_t(s), std::uint32_t(warmup)}, {Op::B, std::uint16_t(s), 0}}, m - warmup);
      b.span(r, Op::B, s, m - warmup, warmup);
    }
    return b.finish();
  }
  static constexpr Table table(const Layout& l) { return to_table(runs(l)); }
};

/// Interleaved 1F1B (Megatron's virtual pipeline): each rank holds v = stages / ranks model chunks, stage s
/// on rank s % ranks; micro-batches advance in groups of `ranks`, so m must be a multiple of ranks.
/// Bubble (p-1)/(v*m + p-1). Receives are posted two computes ahead.
struct Interleaved1F1B
{
  static constexpr std::string_view name = "Interleaved1F1B";
  static constexpr bool interleaved = true;
  static constexpr bool split_backward = false;
  static constexpr RunTable runs(const Layout& l)
  {
    detail::run_builder b(l, 2);
    const int p = l.ranks, v = l.stages / l.ranks, m = l.microbatches, total = m * v, pv = p * v;
    // virtual micro-batch k: chunk (k % pv) / p (reversed for backward), micro-batch (k / pv) * p + k % p
    auto fwd = [&](int k, int r) { return RunAction{Op::F, std::uint16_t(((k % pv) / p) * p + r), std::uint32_t((k / pv) * p + k % p)}; };
    auto bwd = [&](int k, int r) { return RunAction{Op::B, std::uint16_t((v - 1 - (k % pv) / p) * p + r), std::uint32_t((k / pv) * p + k % p)}; };
    for (int r = 0; r < p; ++r) {
      const int w = (p - r - 1) * 2 + (v - 1) * p;
      const int warmup = m == p ? total : (w < total ? w : total);
      for (int k = 0; k < warmup; ++k) b.put(r, Op::F, fwd(k, r).stage, int(fwd(k, r).mb));
      // steady state: one forward and one backward; it repeats every pv pairs (micro-batches + p), or
      // every pair when each rank holds one chunk (v = 1)
      const int len = v == 1 ? 1 : pv, pairs = total - warmup, periods = pairs / len;
      std::vector<RunAction> period;
      for (int i = 0; i < len && periods > 0; ++i) period.push_back(fwd(warmup + i, r)), period.push_back(bwd(i, r));
      b.repeat(r, period, periods);
      for (int i = periods * len; i < pairs; ++i) {
        b.put(r, Op::F, fwd(warmup + i, r).stage, int(fwd(warmup + i, r).mb));
        b.put(r, Op::B, bwd(i, r).stage, int(bwd(i, r).mb));
      }
      for (int k = pairs; k < total; ++k) b.put(r, Op::B, bwd(k, r).stage, int(bwd(k, r).mb));
    }
    return b.finish();
  }
  static constexpr Table table(const Layout& l) { return to_table(runs(l)); }
};

/// ZB-H1 (zero bubble, "handcrafted 1"): the backward is split into input-gradient (I) and weight-gradient
/// (W) passes, and W passes fill what would be 1F1B's bubble. The list comes from a list scheduler under
/// unit costs (F = I = W): a free stage runs an I when its gradient has arrived, else an F while fewer
/// than `stages` micro-batches await their W (1F1B's peak memory), else a pending W. Bubble about
/// (p-1)/(3m + p-1) — a third of 1F1B's.
struct ZBH1
{
  static constexpr std::string_view name = "ZB-H1";
  static constexpr bool interleaved = false;
  static constexpr bool split_backward = true;
  static constexpr Table table(const Layout& l)
  {
    detail::table_builder b(l, 3);
    const int S = l.stages, m = l.microbatches;
    // f_end / i_end: time the forward / input gradient of (s, mb) ends; 0 = not yet (times start at 1)
    detail::buffer<int> f_end(std::size_t(S) * m), i_end(std::size_t(S) * m);
    detail::buffer<int> nf(S), ni(S), nw(S);
    int remaining = S * m * 3;
    for (int t = 1; remaining > 0; ++t) {
      for (int s = 0; s < S; ++s) {
        const int i = ni.p[s], f = nf.p[s], r = l.rank_of[s];
        const int g = i < f ? (s + 1 == S ? f_end.p[s * m + i] : i_end.p[(s + 1) * m + i]) : 0;
        const int in = f < m ? (s == 0 ? 1 : f_end.p[(s - 1) * m + f]) : 0;
        if (g != 0 && g < t) {
          b.put(r, Op::I, s, i);
          i_end.p[s * m + i] = t;
          ++ni.p[s];
        } else if (in != 0 && in < t && f - nw.p[s] < S) {
          b.put(r, Op::F, s, f);
          f_end.p[s * m + f] = t;
          ++nf.p[s];
        } else if (nw.p[s] < i) {
          b.put(r, Op::W, s, nw.p[s]);
          ++nw.p[s];
        } else {
          continue;
        }
        --remaining;
      }
    }
    return b.finish(1);
  }
};

/// Concept: a schedule tag (see the file comment).
template <class T>
concept ScheduleTag = requires(const Layout& l) {
  { T::name } -> std::convertible_to<std::string_view>;
  { T::interleaved } -> std::convertible_to<bool>;
  { T::split_backward } -> std::convertible_to<bool>;
  { T::table(l) } -> std::same_as<Table>;
};

/// Pipeline option: which schedule runs. `Schedule<OneFOneB>` is the default.
template <class Tag>
struct Schedule
{
  static_assert(ScheduleTag<Tag>,
                "mpx::Schedule<Tag>: Tag must be a schedule such as mpx::GPipe, mpx::OneFOneB, mpx::Interleaved1F1B, "
                "mpx::ZBH1 or mpx::UserTable<\"...\">");
  using tag = Tag;
};

/// Pipeline option: micro-batches per step.
template <int M>
struct Microbatches
{
  static_assert(M >= 1, "mpx::Microbatches<M>: M must be at least 1");
  static constexpr int value = M;
};

}  // namespace mpx
