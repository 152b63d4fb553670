// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file balance.hpp
/// The cost model and the balancer. A layer's cost per micro-batch is a `LayerCost` (forward, backward:
/// FLOPs, microseconds, any integer unit shared by all layers), declared by a module as
/// `static constexpr std::array<mpx::LayerCost, N> layer_costs` or measured (runtime/profile.hpp).
/// `predict<Schedule>(layout, costs)` runs the schedule's proof with those costs instead of the unit costs:
/// the predicted step, each slot's busy time and the bubble. `balance<Schedule>(layers, slots, m)` partitions
/// the layers into `slots` contiguous ranges that minimise the predicted step:
///
/// ```
/// constexpr auto part = mpx::balance<mpx::OneFOneB>(Toy::layer_costs, 3, 8);
/// using P = mpx::Pipeline<mpx::Stage<Toy, mpx::CPU<0>, mpx::Layers<part[0], part[1]>>,
///                         mpx::Stage<Toy, mpx::CPU<1>, mpx::Layers<part[1], part[2]>>,
///                         mpx::Stage<Toy, mpx::CPU<2>, mpx::Layers<part[2], part[3]>>, mpx::Microbatches<8>>;
/// ```
///
/// How: first the ranges that minimise the largest stage cost (forward + backward; the leading frozen
/// layers' forward only), exactly, by dynamic programming over the partitions' edges (O(slots · L²));
/// then each edge, or two neighbouring edges together, moves by one layer while the predicted step (the proof's
/// timeline) gets shorter; with
/// frozen layers in front, the same descent also starts from the partition that gives them a slot of their own
/// (a forward-only slot waits for no gradient), and the shorter of the two wins. The
/// bottleneck is what a pipeline's steady state runs at; the timeline adds warm-up and drain, which
/// favour a lighter first and last stage. `tests/balance.test.cpp` checks the result against every
/// possible partition for small pipelines.
///
/// Devices of different speeds: `speeds` gives each slot's relative speed (any unit, only ratios count; empty:
/// all equal). A slot computes a cost in cost × (fastest / its speed) time units, so the prediction is in the
/// fastest device's time and a slot half as fast gets about half the work:
///
/// ```
/// constexpr std::array<double, 3> speeds{1.0, 0.5, 1.0};  // slot 1 an older card, or a shared node
/// constexpr auto part = mpx::balance<mpx::OneFOneB>(Toy::layer_costs, 3, 8, 0, speeds);
/// ```

#include <mpx/action.hpp>    // mpx::Layout, mpx::StageCosts, mpx::LayerCost
#include <mpx/run_proof.hpp>  // mpx::prove (flat and compressed tables)
#include <mpx/schedule.hpp>  // mpx::OneFOneB, mpx::RunSchedule

#include <array>    // std::array
#include <cstdint>  // std::int64_t
#include <span>     // std::span

namespace mpx
{

/// The most slots the balancer partitions for.
inline constexpr int max_balance_slots = 64;

/// A partition of a pipeline's layers into slots: slot k holds layers [part[k], part[k + 1]); part[0] = 0, part[slots] = L.
using Partition = std::array<int, max_balance_slots + 1>;

/// The costs of each stage of a partition: the sums of its layers'. The first `frozen_layers` layers are frozen
/// with nothing trainable before them: no backward ever runs through them, wherever they sit, so their
/// backward is not counted (and a stage made of them alone runs forward only).
constexpr StageCosts stage_costs(std::span<const LayerCost> layers, const Partition& part, int slots, int frozen_layers = 0)
{
  StageCosts c;
  for (int k = 0; k < slots; ++k)
    for (int i = part[std::size_t(k)]; i < part[std::size_t(k) + 1]; ++i) {
      c.forward[std::size_t(k)] += layers[std::size_t(i)].forward;
      if (i >= frozen_layers) c.backward[std::size_t(k)] += layers[std::size_t(i)].backward;
    }
  c.split_evenly(slots);
  return c;
}

/// Whether `speeds` suits `slots` slots: empty (all equal), or one positive finite speed per slot.
constexpr bool valid_speeds(std::span<const double> speeds, int slots)
{
  if (speeds.empty()) return true;
  if (int(speeds.size()) != slots) return false;
  for (double v : speeds)
    if (!(v > 0 && v < 1e300)) return false;
  return true;
}

/// The costs of one stage per slot in time units of the fastest slot: slot k's costs × (fastest / speeds[k]),
/// rounded (the fastest slot's stay as they are; empty `speeds`: all equal, nothing changes). Needs valid_speeds.
constexpr StageCosts at_speeds(StageCosts c, int slots, std::span<const double> speeds)
{
  if (speeds.empty()) return c;
  double fastest = 0;
  for (int k = 0; k < slots; ++k) fastest = speeds[std::size_t(k)] > fastest ? speeds[std::size_t(k)] : fastest;
  for (int k = 0; k < slots; ++k) {
    const double slower = fastest / speeds[std::size_t(k)];
    c.forward[std::size_t(k)] = std::int64_t(double(c.forward[std::size_t(k)]) * slower + 0.5);
    c.backward[std::size_t(k)] = std::int64_t(double(c.backward[std::size_t(k)]) * slower + 0.5);
  }
  c.split_evenly(slots);
  return c;
}

/// The layout of a one-stage-per-slot pipeline partitioned at `part`: its forward-only stages are those wholly
/// inside the leading frozen layers.
constexpr Layout partition_layout(const Partition& part, int slots, int microbatches, int frozen_layers = 0)
{
  Layout l = Layout::looped(slots, slots, microbatches);
  while (l.forward_only < slots && part[std::size_t(l.forward_only) + 1] <= frozen_layers) ++l.forward_only;
  return l;
}

/// The proof of schedule Tag on `l` under `costs`: `makespan` is the predicted step, `busy[r]` each
/// slot's compute, `bubble()` the predicted idle fraction.
template <class Tag>
constexpr Proof predict(const Layout& l, const StageCosts& costs)
{
  if constexpr (RunSchedule<Tag>) return prove(Tag::runs(l), &costs);
  else return prove(Tag::table(l), nullptr, &costs);
}

namespace detail
{
/// The partition minimising the largest stage time (cost over its slot's speed; ties: the earliest), exactly.
constexpr Partition bottleneck_partition(std::span<const LayerCost> layers, int slots, int frozen_layers, std::span<const double> speeds = {})
{
  const int L = int(layers.size());
  buffer<std::int64_t> f(std::size_t(L) + 1), b(std::size_t(L) + 1);  // prefix sums
  for (int i = 0; i < L; ++i) {
    f[std::size_t(i) + 1] = f[std::size_t(i)] + layers[std::size_t(i)].forward;
    b[std::size_t(i) + 1] = b[std::size_t(i)] + (i < frozen_layers ? 0 : layers[std::size_t(i)].backward);  // as stage_costs
  }
  double fastest = 0;
  for (double v : speeds) fastest = v > fastest ? v : fastest;
  auto cost = [&](int i, int j, int k) {  // layers [i, j) on slot k
    const std::int64_t c = f[std::size_t(j)] - f[std::size_t(i)] + b[std::size_t(j)] - b[std::size_t(i)];
    return speeds.empty() ? c : std::int64_t(double(c) * (fastest / speeds[std::size_t(k)]) + 0.5);
  };
  // best[k][j]: the least largest cost of partitioning layers [0, j) into k stages (each non-empty)
  constexpr std::int64_t inf = std::int64_t(1) << 62;
  buffer<std::int64_t> best(std::size_t(slots + 1) * std::size_t(L + 1));
  buffer<int> from(std::size_t(slots + 1) * std::size_t(L + 1));
  auto at = [&](int k, int j) { return std::size_t(k) * std::size_t(L + 1) + std::size_t(j); };
  for (std::size_t x = 0; x < best.size(); ++x) best[x] = inf;
  best[at(0, 0)] = 0;
  for (int k = 1; k <= slots; ++k)
    for (int j = k; j <= L - (slots - k); ++j)
      for (int i = k - 1; i < j; ++i) {
        if (best[at(k - 1, i)] == inf) continue;
        const std::int64_t c = cost(i, j, k - 1);
        const std::int64_t worst = c > best[at(k - 1, i)] ? c : best[at(k - 1, i)];
        if (worst < best[at(k, j)]) best[at(k, j)] = worst, from[at(k, j)] = i;
      }
  Partition part{};
  part[std::size_t(slots)] = L;
  for (int k = slots, j = L; k > 0; --k) j = part[std::size_t(k) - 1] = from[at(k, j)];
  return part;
}
}  // namespace detail

/// The naive partition: `layers` into `slots` ranges of equal length (the first `layers % slots` one longer),
/// what a hand-written split by layer count gives; the baseline `balance` is compared against.
constexpr Partition even_partition(int layers, int slots)
{
  Partition part{};
  if (slots < 1 || slots > max_balance_slots || slots > layers) return part;
  for (int k = 0; k < slots; ++k) part[std::size_t(k) + 1] = part[std::size_t(k)] + layers / slots + (k < layers % slots ? 1 : 0);
  return part;
}

/// The proof of schedule Tag over partition `part` of `layers` (one stage per slot), each slot at its speed.
template <class Tag = OneFOneB>
constexpr Proof predict_partition(std::span<const LayerCost> layers, const Partition& part, int slots, int microbatches, int frozen_layers = 0,
                                  std::span<const double> speeds = {})
{
  return predict<Tag>(partition_layout(part, slots, microbatches, frozen_layers), at_speeds(stage_costs(layers, part, slots, frozen_layers), slots, speeds));
}

/// The partition of `layers` into `slots` contiguous non-empty ranges whose predicted step under schedule Tag
/// with m micro-batches, each slot at its speed, is shortest (see the file comment). Needs slots <= layers.size()
/// and valid_speeds(speeds, slots).
template <class Tag = OneFOneB>
constexpr Partition balance(std::span<const LayerCost> layers, int slots, int microbatches, int frozen_layers = 0, std::span<const double> speeds = {})
{
  const int L = int(layers.size());
  if (slots < 1 || slots > max_balance_slots || slots > L || !valid_speeds(speeds, slots)) return Partition{};  // part[slots] == 0: no partition
  auto step = [&](const Partition& c) { return predict_partition<Tag>(layers, c, slots, microbatches, frozen_layers, speeds).makespan; };
  auto descend = [&](Partition part) {
    std::int64_t now = step(part);
    for (bool better = true; better;) {
      better = false;
      for (int k = 1; k < slots; ++k)
        for (int width : {1, 2})  // one edge, or two neighbouring edges together (a slot's range shifted whole)
          for (int d : {-1, +1}) {
            if (k + width > slots) continue;
            Partition c = part;
            for (int e = k; e < k + width; ++e) c[std::size_t(e)] += d;
            bool fits = true;
            for (int e = k; e < k + width; ++e) fits = fits && c[std::size_t(e)] > c[std::size_t(e) - 1] && c[std::size_t(e)] < c[std::size_t(e) + 1];
            if (!fits) continue;
            if (const std::int64_t t = step(c); t < now) part = c, now = t, better = true;
          }
    }
    return part;
  };
  Partition best = descend(detail::bottleneck_partition(layers, slots, frozen_layers, speeds));
  if (frozen_layers > 0 && frozen_layers <= L - (slots - 1) && slots > 1) {
    // the frozen layers alone on the first slot, the rest partitioned at its bottleneck: a forward-only slot waits
    // for no gradient, which the bottleneck does not see (md2 at 4 slots under GPipe and ZB-H1)
    const Partition rest = detail::bottleneck_partition(layers.subspan(std::size_t(frozen_layers)), slots - 1, 0,
                                                        speeds.empty() ? speeds : speeds.subspan(1));
    Partition c{};
    for (int k = 0; k < slots; ++k) c[std::size_t(k) + 1] = frozen_layers + rest[std::size_t(k)];
    if (const Partition d = descend(c); step(d) < step(best)) best = d;
  }
  return best;
}
template <class Tag = OneFOneB, std::size_t N>
constexpr Partition balance(const std::array<LayerCost, N>& layers, int slots, int microbatches, int frozen_layers = 0,
                            std::span<const double> speeds = {})
{
  return balance<Tag>(std::span<const LayerCost>(layers.data(), N), slots, microbatches, frozen_layers, speeds);
}

}  // namespace mpx
