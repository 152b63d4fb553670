// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/shard_plan.hpp: ZeRO-3's gathers and releases on the built-in schedules' lists, proved at
// compile time, in both modes; a plan that breaks a rule is refused, naming the action.
#include "support/catch.hpp"

#include <mpx/schedule.hpp>
#include <mpx/shard_plan.hpp>

#include <algorithm>  // std::find
#include <string>
#include <vector>

using namespace mpx;

namespace
{
/// Every rank of `Sched` over `ranks` ranks, `stages` stages and m micro-batches, every stage at level 3.
template <class Sched>
constexpr bool plans_hold(int ranks, int stages, int m, bool free_between)
{
  const Table t = Sched::table(Layout::looped(ranks, stages, m));
  const std::vector<int> level(std::size_t(stages), 3);
  for (int r = 0; r < ranks; ++r) {
    const auto a = expand(t, r);
    if (!check_shard_plan(a, level, shard_plan(a, level, free_between)).ok) return false;
  }
  return true;
}

template <class Sched>
constexpr int gathers(int ranks, int stages, int m, int r, bool free_between)
{
  const auto a = expand(Sched::table(Layout::looped(ranks, stages, m)), r);
  return shard_plan(a, std::vector<int>(std::size_t(stages), 3), free_between).gathers;
}
}  // namespace

TEST_CASE("ZeRO-3's plans hold on every built-in schedule, kept and freed between computes", "[shard_plan]")
{
  static_assert(plans_hold<GPipe>(2, 2, 4, false) && plans_hold<GPipe>(2, 2, 4, true));
  static_assert(plans_hold<OneFOneB>(4, 4, 8, false) && plans_hold<OneFOneB>(4, 4, 8, true));
  static_assert(plans_hold<ZBH1>(4, 4, 8, false) && plans_hold<ZBH1>(4, 4, 8, true));
  static_assert(plans_hold<Interleaved1F1B>(2, 4, 4, false) && plans_hold<Interleaved1F1B>(2, 4, 4, true));
  for (int p : {2, 3, 4})
    for (int m : {1, 2, 4, 8}) {
      CAPTURE(p, m);
      for (bool f : {false, true}) {
        CHECK(plans_hold<GPipe>(p, p, m, f));
        CHECK(plans_hold<OneFOneB>(p, p, m, f));
        CHECK(plans_hold<ZBH1>(p, p, m, f));
        if (m % p == 0) CHECK(plans_hold<Interleaved1F1B>(p, 2 * p, m, f));
      }
    }
}

TEST_CASE("Kept: one gather per stage and step, posted before the first action, and freed: one per run of a stage's computes, prefetched", "[shard_plan]")
{
  // one stage per rank: the modes coincide, one gather a step
  STATIC_REQUIRE(gathers<OneFOneB>(2, 2, 4, 0, false) == 1);
  STATIC_REQUIRE(gathers<OneFOneB>(2, 2, 4, 0, true) == 1);
  STATIC_REQUIRE(gathers<ZBH1>(4, 4, 8, 3, true) == 1);
  // interleaved, 2 stages per rank: kept gathers each once; freed gathers each time the rank turns to it
  STATIC_REQUIRE(gathers<Interleaved1F1B>(2, 4, 4, 0, false) == 2);
  const Table t = Interleaved1F1B::table(Layout::looped(2, 4, 4));
  const auto a = expand(t, 0);
  const std::vector<int> level{3, 0, 3, 0};  // rank 0 holds stages 0 and 2
  const auto freed = shard_plan(a, level, true);
  int turns = 0, last = -1;
  for (const auto& x : a)
    if (is_compute(x.op) && x.stage != last) ++turns, last = x.stage;
  CHECK(freed.gathers == turns);
  CHECK(freed.gathers > 2);
  REQUIRE(freed.first == std::vector<int>{0});  // the first compute's stage, posted before the first action
  // every gather after the first is posted one compute ahead: the compute before the one that waits for it
  std::size_t prev = a.size();
  for (std::size_t k = 0; k < a.size(); ++k) {
    if (!is_compute(a[k].op)) continue;
    if (freed.at[k].wait >= 0 && prev < a.size()) {
      CAPTURE(k);
      CHECK(std::find(freed.at[prev].post.begin(), freed.at[prev].post.end(), freed.at[k].wait) != freed.at[prev].post.end());
    }
    prev = k;
  }
  // kept: both posted before the first action, each released after its last compute only
  const auto kept = shard_plan(a, level, false);
  CHECK(kept.first == std::vector<int>{0, 2});
  int releases = 0;
  for (const auto& m : kept.at) releases += m.release >= 0;
  CHECK(releases == 2);
}

TEST_CASE("A plan that computes on released parameters, waits for nothing or ends whole is refused, naming the action", "[shard_plan]")
{
  const auto a = expand(OneFOneB::table(Layout::looped(2, 2, 2)), 0);  // F0 SF0 RB0 F1 ... : stage 0's computes
  const std::vector<int> level{3, 3};
  auto plan = shard_plan(a, level, false);
  REQUIRE(check_shard_plan(a, level, plan).ok);
  std::size_t first = 0;
  while (!is_compute(a[first].op)) ++first;
  auto no_wait = plan;
  no_wait.at[first].wait = -1;
  const auto c1 = check_shard_plan(a, level, no_wait);
  CHECK_FALSE(c1.ok);
  CHECK(c1.action == first);
  CHECK(std::string(c1.why) == "a compute of a fully sharded stage without its parameters whole");
  auto never_posted = plan;
  never_posted.first.clear();
  CHECK(std::string(check_shard_plan(a, level, never_posted).why) == "a wait for a gather not posted");
  auto never_released = plan;
  for (auto& m : never_released.at) m.release = -1;
  CHECK(std::string(check_shard_plan(a, level, never_released).why) ==
        "a fully sharded stage left whole, or its gather waiting, at the step's end");
  auto twice = plan;
  twice.at[first].post.push_back(0);
  CHECK(std::string(check_shard_plan(a, level, twice).why) == "a gather posted for a stage not released");
}
