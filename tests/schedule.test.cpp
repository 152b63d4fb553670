// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/schedule.hpp: the built-in schedules, proved and measured against the published formulas.
#include "support/catch.hpp"

#include <mpx/proof.hpp>
#include <mpx/schedule.hpp>

#include <algorithm>
#include <cmath>

using namespace mpx;

namespace
{
template <class S>
Proof run(int p, int v, int m)
{
  return prove(S::table(Layout::looped(p, p * v, m)));
}
double formula(int p, int v, int m) { return double(p - 1) / double(v * m + p - 1); }
int count(const Table& t, Op op)
{
  int n = 0;
  for (std::size_t i = 0; i < t.steps.size(); ++i) n += t.steps[i].op == op;
  return n;
}
}  // namespace

TEST_CASE("GPipe and 1F1B: expected bubble is (p-1)/(m+p-1)", "[schedule]")
{
  for (int p : {2, 3, 4, 8})
    for (int m : {1, 2, 3, 4, 5, 8, 16, 32}) {
      CAPTURE(p, m);
      const Proof g = run<GPipe>(p, 1, m), f = run<OneFOneB>(p, 1, m);
      REQUIRE(g.ok());
      REQUIRE(f.ok());
      CHECK(std::abs(g.bubble() - formula(p, 1, m)) < 1e-12);
      CHECK(std::abs(f.bubble() - formula(p, 1, m)) < 1e-12);
      CHECK(g.makespan == 3 * (m + p - 1));
      CHECK(f.makespan == 3 * (m + p - 1));
    }
}

TEST_CASE("1F1B: rank r holds at most min(p - r, m) micro-batches in flight, GPipe holds m", "[schedule]")
{
  for (int p : {2, 3, 4, 8})
    for (int m : {1, 2, 3, 4, 8, 16, 32}) {
      CAPTURE(p, m);
      const Proof g = run<GPipe>(p, 1, m), f = run<OneFOneB>(p, 1, m);
      for (int r = 0; r < p; ++r) {
        CAPTURE(r);
        CHECK(f.peak_in_flight[r] == std::min(p - r, m));
        CHECK(g.peak_in_flight[r] == m);
      }
    }
}

TEST_CASE("Interleaved 1F1B: expected bubble is (p-1)/(v*m+p-1)", "[schedule]")
{
  for (int p : {2, 3, 4, 8})
    for (int v : {1, 2, 3, 4})
      for (int k : {1, 2, 3, 4}) {
        const int m = k * p;
        CAPTURE(p, v, m);
        const Proof pr = run<Interleaved1F1B>(p, v, m);
        REQUIRE(pr.ok());
        CHECK(std::abs(pr.bubble() - formula(p, v, m)) < 1e-12);
        if (v > 1) CHECK(pr.bubble() < run<OneFOneB>(p, 1, m).bubble());
      }
}

TEST_CASE("ZB-H1: split backward, bubble below 1F1B's, the paper's (p-1)/(3m+p-1) once m >= p, peak in flight within 1F1B's", "[schedule]")
{
  for (int p : {2, 3, 4, 5, 8, 16})
    for (int m : {1, 2, 3, 4, 5, 8, 16, 17, 32}) {
      CAPTURE(p, m);
      const Table t = ZBH1::table(Layout::looped(p, p, m));
      const Proof z = prove(t), f = run<OneFOneB>(p, 1, m);
      REQUIRE(z.ok());
      CHECK(count(t, Op::B) == 0);
      CHECK(count(t, Op::I) == p * m);
      CHECK(count(t, Op::W) == p * m);
      CHECK(z.bubble() < f.bubble());
      CHECK(z.bubble() >= double(p - 1) / double(3 * m + p - 1) - 1e-12);  // the zero-bubble paper's bound
      if (m >= p) CHECK(z.makespan == 3 * m + p - 1);                      // ... reached
      CHECK(z.max_in_flight() <= std::min(p, m));
    }
}

TEST_CASE("Schedules are computed at compile time", "[schedule][static]")
{
  constexpr Proof f = prove(OneFOneB::table(Layout::looped(4, 4, 8)));
  STATIC_REQUIRE(f.ok());
  STATIC_REQUIRE(f.makespan == 3 * (8 + 4 - 1));
  constexpr Proof z = prove(ZBH1::table(Layout::looped(4, 4, 8)));
  STATIC_REQUIRE(z.ok());
  STATIC_REQUIRE(z.makespan < f.makespan);
  constexpr Proof i = prove(Interleaved1F1B::table(Layout::looped(2, 4, 4)));
  STATIC_REQUIRE(i.ok());
}

TEST_CASE("A large table is proved at run time by the same function", "[schedule]")
{
  const Proof pr = run<OneFOneB>(64, 1, 512);
  REQUIRE(pr.ok());
  CHECK(std::abs(pr.bubble() - formula(64, 1, 512)) < 1e-12);
  CHECK(pr.peak_in_flight[0] == 64);
  CHECK(pr.peak_in_flight[63] == 1);
}

TEST_CASE("Receives are posted ahead of the sends that could block on the neighbour", "[schedule]")
{
  // 1F1B, 2 ranks, 2 micro-batches: rank 0 must post RB0 before it blocks in SF1, rank 1 RF1 before SB0.
  const Table t = OneFOneB::table(Layout::looped(2, 2, 2));
  const auto r0 = expand(t, 0), r1 = expand(t, 1);
  auto pos = [](const std::vector<Action>& v, Action a) { return std::find(v.begin(), v.end(), a) - v.begin(); };
  CHECK(pos(r0, {Op::RecvB, 0, 0}) < pos(r0, {Op::SendF, 0, 1}));
  CHECK(pos(r1, {Op::RecvF, 1, 1}) < pos(r1, {Op::SendB, 1, 0}));
  CHECK(r0.size() == 4 + 2 + 2);  // 4 computes, 2 sends, 2 receives
}
