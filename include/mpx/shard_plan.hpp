// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file shard_plan.hpp
/// ZeRO-3's data-parallel collectives placed on one rank's program (`expand`: its actions in order): where
/// each fully sharded stage's parameters are gathered — the all-gather posted, later waited for — and where
/// their memory is released. A function of the action list alone, so every replica of a slot, running the
/// same list, posts the same gathers in the same order: NCCL's rule for the data-parallel communicator. No
/// replica waits for another except in these collectives (and the buckets' reduction, posted at each
/// stage's last backward, in the same order everywhere), so the copies of a proven schedule meet at
/// them as one would run alone.
///
/// Two modes (`free_between`):
/// - kept (the default): every sharded stage's gather is posted before the first action (prefetched: it
///   travels while the rank waits for its first input or computes another stage), waited for before the
///   stage's first compute, and the stage is released after its last compute of the step (under
///   pipelining its parameters stay whole across the step's micro-batches, as torchtitan keeps FSDP's);
/// - free between computes: a stage is also released after a compute whenever the rank's next compute is
///   another stage's (interleaved schedules), and its gather for its next compute is posted one compute
///   ahead: its memory is free while the other stage computes. With one stage per rank the two coincide
///   (the same parameters compute next: freeing them would save nothing at the compute's peak).
///
/// `check_shard_plan` proves a plan against its list by walking it: every compute of a sharded stage runs
/// with the stage whole (its gather waited for and no release since); a gather is posted only for a
/// released stage and waited for once, after it was posted; every sharded stage ends the step released.
/// `Trainer` asserts it at compile time for each slot of a pipeline declaring `Sharded<3>`, and at start-up
/// for the plan it walks.

#include <mpx/action.hpp>  // mpx::Action, mpx::is_compute

#include <cstddef>  // std::size_t
#include <span>     // std::span
#include <vector>   // std::vector

namespace mpx
{

/// What the rank does about ZeRO-3 around one action of its list.
struct ShardMoves
{
  std::vector<int> post;  ///< stages whose gathers it posts before the action, in this order
  int wait = -1;          ///< the stage whose gather it waits for before the action (-1: none)
  int release = -1;       ///< the stage whose memory it releases after the action (-1: none)
};

/// A rank's ZeRO-3 plan for one step.
struct ShardPlan
{
  std::vector<int> first;       ///< gathers posted before the first action, in this order
  std::vector<ShardMoves> at;   ///< per action of the list
  int gathers = 0;              ///< all-gathers per step
};

/// What `check_shard_plan` concluded: ok, or the action (its index in the list) where the plan fails and why.
struct ShardPlanCheck
{
  bool ok = true;
  std::size_t action = 0;
  const char* why = "";
};

namespace detail
{
constexpr bool fully_sharded(const std::vector<int>& level, int s) { return s >= 0 && std::size_t(s) < level.size() && level[std::size_t(s)] == 3; }
}  // namespace detail

/// The plan for a rank's `actions`, where `level[s]` is stage s's ZeRO level (3: its parameters sharded).
constexpr ShardPlan shard_plan(std::span<const Action> actions, const std::vector<int>& level, bool free_between)
{
  enum State { released, posted, whole };
  ShardPlan p;
  p.at.resize(actions.size());
  std::vector<std::size_t> computes, last(level.size(), actions.size());
  for (std::size_t k = 0; k < actions.size(); ++k)
    if (is_compute(actions[k].op)) computes.push_back(k), last[actions[k].stage] = k;
  std::vector<State> st(level.size(), released);
  auto post = [&](std::vector<int>& where, int s) { where.push_back(s), st[std::size_t(s)] = posted, ++p.gathers; };
  for (int s = 0; std::size_t(s) < level.size() && !free_between; ++s)
    if (detail::fully_sharded(level, s) && last[std::size_t(s)] < actions.size()) post(p.first, s);
  if (free_between && !computes.empty() && detail::fully_sharded(level, actions[computes[0]].stage)) post(p.first, actions[computes[0]].stage);
  for (std::size_t i = 0; i < computes.size(); ++i) {
    const std::size_t k = computes[i];
    const int s = actions[k].stage, next = i + 1 < computes.size() ? int(actions[computes[i + 1]].stage) : -1;
    auto& m = p.at[k];
    if (detail::fully_sharded(level, s)) {
      if (st[std::size_t(s)] == released) post(m.post, s);  // not prefetched
      if (st[std::size_t(s)] == posted) m.wait = s, st[std::size_t(s)] = whole;
    }
    if (free_between && detail::fully_sharded(level, next) && st[std::size_t(next)] == released) post(m.post, next);  // prefetch
    if (detail::fully_sharded(level, s) && (k == last[std::size_t(s)] || (free_between && next != s)))
      m.release = s, st[std::size_t(s)] = released;
  }
  return p;
}

/// Proves `plan` against `actions` and `level` (see the file comment).
constexpr ShardPlanCheck check_shard_plan(std::span<const Action> actions, const std::vector<int>& level, const ShardPlan& plan)
{
  enum State { released, posted, whole };
  std::vector<State> st(level.size(), released);
  auto fail = [](std::size_t k, const char* why) { return ShardPlanCheck{false, k, why}; };
  if (plan.at.size() != actions.size()) return fail(0, "the plan is not for this list of actions");
  for (int s : plan.first)
    if (!detail::fully_sharded(level, s) || st[std::size_t(s)] != released) return fail(0, "a gather posted before the first action for a stage not released");
    else st[std::size_t(s)] = posted;
  for (std::size_t k = 0; k < actions.size(); ++k) {
    const auto& m = plan.at[k];
    for (int s : m.post)
      if (!detail::fully_sharded(level, s) || st[std::size_t(s)] != released) return fail(k, "a gather posted for a stage not released");
      else st[std::size_t(s)] = posted;
    if (m.wait >= 0 && (!detail::fully_sharded(level, m.wait) || st[std::size_t(m.wait)] != posted)) return fail(k, "a wait for a gather not posted");
    if (m.wait >= 0) st[std::size_t(m.wait)] = whole;
    const int s = actions[k].stage;
    if (is_compute(actions[k].op) && detail::fully_sharded(level, s) && st[std::size_t(s)] != whole)
      return fail(k, "a compute of a fully sharded stage without its parameters whole");
    if (m.release >= 0 && st[std::size_t(m.release)] != whole) return fail(k, "a release of a stage that is not whole");
    if (m.release >= 0) st[std::size_t(m.release)] = released;
  }
  for (std::size_t s = 0; s < st.size(); ++s)
    if (st[s] != released) return fail(actions.size(), "a fully sharded stage left whole, or its gather waiting, at the step's end");
  return {};
}

}  // namespace mpx
