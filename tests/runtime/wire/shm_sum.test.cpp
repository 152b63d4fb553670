// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/runtime/wire/shm_sum.hpp: ranks that are real processes (forked) sum their numbers round
// after round and every rank gets the same bits, the sum in rank order; the name is gone from /dev/shm once
// every rank has opened the segment, or the ranks that came have closed it; a wait ends in a named peer_error when a rank's process has exited (at once) or a rank
// never comes (at the timeout); misuse is a config_error; a segment whose ranks were all killed before the last
// opened it is removed as stale (wire/shm_segment.hpp). (Trainers that sum through it: runtime.test.cpp.)
#include "support/forked.hpp"
#include "support/rooms.hpp"

#include <mpx/runtime/wire/shm_sum.hpp>

#include <signal.h>    // kill, SIGKILL
#include <sys/wait.h>  // waitpid
#include <unistd.h>    // fork

#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace
{
using mpx::ShmSum;
using namespace std::chrono_literals;

std::string sum_name(const std::string& what) { return "/mpx-test-sum-" + what + "-" + std::to_string(::getpid()); }

/// Rank k's numbers in round r: values whose sum depends on the order they are added in (in rank order the
/// first is (1e16 + 1) - 1e16 = 0, not 1).
std::vector<double> numbers(int k, int r) { return {k == 0 ? 1e16 : k == 1 ? 1.0 : -1e16, double(k * 1000 + r), 0.1 * (k + 1)}; }

/// Runs `rounds` rounds as `rank` of `ranks`, calling `after_first` after the first; returns how many sums
/// were not the sum in rank order, bit for bit.
int run_rank(const std::string& name, int ranks, int rank, int rounds, const std::function<void()>& after_first = {})
{
  ShmSum sum(name, ranks, rank, 20000ms, 20us);
  int wrong = 0;
  for (int r = 0; r < rounds; ++r) {
    const auto mine = numbers(rank, r);
    sum.arrive(mine.data(), 3);
    double got[3];
    sum.finish(got, [] { return std::string("round"); });
    for (int i = 0; i < 3; ++i) {
      double want = 0;
      for (int k = 0; k < ranks; ++k) want += numbers(k, r)[std::size_t(i)];
      if (got[i] != want) ++wrong;
    }
    if (r == 0 && after_first) after_first();
  }
  return wrong;
}
}  // namespace

TEST_CASE("Processes sum through shared memory: every rank gets the rank-order sum round after round, and the name goes after round 1", "[rooms][shm]")
{
  const auto name = sum_name("order");
  const int ranks = 3, rounds = 2000;
  std::vector<pid_t> children;
  for (int rank = 1; rank < ranks; ++rank) {
    const pid_t child = ::fork();
    if (child == 0) ::_exit(run_rank(name, ranks, rank, rounds) == 0 ? 0 : 1);
    children.push_back(child);
  }
  CHECK(run_rank(name, ranks, 0, rounds, [&] {
          CHECK_FALSE(std::filesystem::exists("/dev/shm" + name));  // every rank has mapped it: nothing left behind
        }) == 0);
  for (pid_t c : children) {
    int status = -1;
    ::waitpid(c, &status, 0);
    CHECK((WIFEXITED(status) && WEXITSTATUS(status) == 0));
  }
}

TEST_CASE("A sum's wait ends with a named error: a rank whose process exited at once, a rank that never came at the timeout", "[rooms][shm]")
{
  {
    const auto name = sum_name("dead");
    ShmSum sum(name, 2, 0, 60000ms, 20us);
    const pid_t child = ::fork();
    if (child == 0) {  // rank 1: opens the segment, never arrives, exits
      { ShmSum peer(name, 2, 1, 1000ms, 20us); }
      ::_exit(0);
    }
    ::waitpid(child, nullptr, 0);
    CHECK_FALSE(std::filesystem::exists("/dev/shm" + name));  // both ranks opened it: the last one removed the name
    const double v = 1;
    double got = 0;
    sum.arrive(&v, 1);
    const auto t0 = std::chrono::steady_clock::now();
    CHECK_THROWS_WITH(sum.finish(&got, [] { return std::string("step 3's sum"); }),
                      Catch::Contains("step 3's sum: rank 1's process (pid " + std::to_string(child) + ") has exited"));
    CHECK(std::chrono::steady_clock::now() - t0 < 5s);  // not the minute's timeout
  }
  const auto silent = sum_name("silent");
  {
    ShmSum sum(silent, 3, 1, 200ms, 20us);
    const double v = 1;
    double got = 0;
    sum.arrive(&v, 1);
    CHECK_THROWS_WITH(sum.finish(&got, [] { return std::string("step 0's sum"); }), Catch::Contains("rank 0, 2 did not arrive within 200 ms"));
  }
  CHECK_FALSE(std::filesystem::exists("/dev/shm" + silent));  // closed by the only rank that came: nothing left behind
}

TEST_CASE("A sum whose ranks were killed before all opened it is removed as stale", "[rooms][shm][faults]")
{
  const auto name = sum_name("killed");
  const pid_t child = test::fork_holding([&] {  // rank 1 of 2 opens the sum and is killed before rank 0 ever comes
    return std::make_unique<mpx::ShmSum>(name, 2, 1, std::chrono::milliseconds(1000), std::chrono::microseconds(20));
  });
  REQUIRE(child > 0);
  mpx::detail::remove_stale_shm_segments();
  CHECK(std::filesystem::exists("/dev/shm" + name));  // rank 1 lives: rank 0 may still come
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  mpx::detail::remove_stale_shm_segments();  // (or a run that ctest starts meanwhile: its first local rank does the same)
  CHECK_FALSE(std::filesystem::exists("/dev/shm" + name));
}

TEST_CASE("A sum refuses misuse, naming it: too many numbers, a rank outside the world, finish before arrive", "[rooms][shm]")
{
  ShmSum sum(sum_name("misuse"), 1, 0, 1000ms, 20us);
  double v[ShmSum::max_values + 1] = {};
  CHECK_THROWS_WITH(sum.arrive(v, ShmSum::max_values + 1), Catch::Contains("a round sums at most"));
  CHECK_THROWS_WITH(sum.finish(v, [] { return std::string(); }), Catch::Contains("finish without arrive"));
  CHECK_THROWS_WITH(ShmSum(sum_name("outside"), 2, 2, 1000ms, 20us), Catch::Contains("rank 2 of 2 ranks does not exist"));
  sum.arrive(v, 2);  // a world of one: its own numbers
  v[0] = 5;
  double got[2] = {-1, -1};
  sum.finish(got, [] { return std::string(); });
  CHECK(got[0] == 0);
}
