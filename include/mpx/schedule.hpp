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
/// (runs.hpp); a pipeline then proves it at compile time whatever m is (every built-in schedule).
/// Models: GPipe, OneFOneB, Interleaved1F1B, ZBH1, UserTable<...>.
///
/// NOTE: the compiler's constant evaluator is slow per call and per step (0.1 to 0.2 ms; 25 ms to
/// value-initialise 1,000 steps): every built-in emits runs (runs.hpp), whose size does not grow with m.

#include <mpx/action.hpp>  // mpx::Step, mpx::Layout, mpx::Table
#include <mpx/runs.hpp>    // mpx::RunTable, mpx::to_table

#include <concepts>     // std::convertible_to
#include <string_view>  // std::string_view
#include <vector>       // std::vector

namespace mpx
{

/// GPipe (fill-drain): all forwards, then all backwards. Holds all m micro-batches in flight. Receives
/// are posted three receiving computes ahead: a stage's receiving computes run back to back (a later
/// stage's forwards, an earlier stage's backwards), so posted one ahead each receive would go out just
/// before the compute that waits for it, and the message's hand-shake (a Gloo send moves once its receive
/// is posted) would sit on the critical path of every micro-batch (benchmarks/results/gpipe_lookahead_vm_20261202.md).
struct GPipe
{
  static constexpr std::string_view name = "GPipe";
  static constexpr bool interleaved = false;
  static constexpr bool split_backward = false;
  static constexpr RunTable runs(const Layout& l)
  {
    detail::run_builder b(l, 3);
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
      // k .. k + p - 1 (from a multiple of p) share a chunk and carry consecutive micro-batches: one span
      for (int k = 0; k < warmup; k = (k / p + 1) * p) b.span(r, Op::F, fwd(k, r).stage, int(fwd(k, r).mb), (k / p + 1) * p < warmup ? (k / p + 1) * p - k : warmup - k);
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
      for (int k = pairs; k < total; k = (k / p + 1) * p) b.span(r, Op::B, bwd(k, r).stage, int(bwd(k, r).mb), (k / p + 1) * p < total ? (k / p + 1) * p - k : total - k);
    }
    return b.finish();
  }
  static constexpr Table table(const Layout& l) { return to_table(runs(l)); }
};

/// ZB-H1 (zero bubble, "handcrafted 1"): the backward is split into input-gradient (I) and weight-gradient
/// (W) passes, and W passes fill what would be 1F1B's bubble. The zero-bubble paper's handcrafted order:
/// stage s runs w = min(p - s, m) warm-up forwards, then for each micro-batch k its I, the W of
/// micro-batch k - s once k >= s, and the next forward while one is left; the last s W passes close the
/// step. Every stage holds at most min(p, m) micro-batches awaiting their W (1F1B's peak on stage 0).
/// Under unit costs (F = I = W) the step takes 3m + p - 1 units when m >= p: bubble (p-1)/(3m+p-1), the
/// paper's bound. Six runs per stage, whatever m is.
struct ZBH1
{
  static constexpr std::string_view name = "ZB-H1";
  static constexpr bool interleaved = false;
  static constexpr bool split_backward = true;
  static constexpr RunTable runs(const Layout& l)
  {
    detail::run_builder b(l, 1);
    const int p = l.stages, m = l.microbatches;
    for (int s = 0; s < p; ++s) {
      const int r = l.rank_of[s];
      const int w = p - s < m ? p - s : m;
      b.span(r, Op::F, s, 0, w);
      // the k-th input gradient: I(k), then W(k - s) from k = s on, then F(w + k) while w + k < m
      const int no_w = s < m ? s : m, with_f = m - w;
      const int cut[4] = {0, no_w < with_f ? no_w : with_f, no_w < with_f ? with_f : no_w, m};
      for (int q = 0; q < 3; ++q) {
        const int k = cut[q];
        if (cut[q + 1] <= k) continue;
        std::vector<RunAction> pattern{{Op::I, std::uint16_t(s), std::uint32_t(k)}};
        if (k >= s) pattern.push_back({Op::W, std::uint16_t(s), std::uint32_t(k - s)});
        if (w + k < m) pattern.push_back({Op::F, std::uint16_t(s), std::uint32_t(w + k)});
        b.repeat(r, pattern, cut[q + 1] - k);
      }
      const int tail = m - s > 0 ? m - s : 0;  // the W passes not yet run
      b.span(r, Op::W, s, tail, m - tail);
    }
    return b.finish();
  }
  static constexpr Table table(const Layout& l) { return to_table(runs(l)); }
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
