// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/action.hpp.
#include "support/catch.hpp"

#include <mpx/action.hpp>
#include <mpx/schedule.hpp>

using namespace mpx;

TEST_CASE("Op names and kinds", "[action][static]")
{
  STATIC_REQUIRE(is_compute(Op::W));
  STATIC_REQUIRE(is_send(Op::SendB));
  STATIC_REQUIRE(is_recv(Op::RecvF));
  STATIC_REQUIRE(!is_compute(Op::RecvB));
  STATIC_REQUIRE(std::string_view(op_name(Op::RecvB)) == "RB");
  STATIC_REQUIRE(cost_of(Op::B) == 2);
  STATIC_REQUIRE(cost_of(Op::I) + cost_of(Op::W) == cost_of(Op::B));
}

TEST_CASE("expand: sends right after their compute, receives where the table posts them", "[action]")
{
  const Table t = GPipe::table(Layout::looped(3, 3, 2));
  // middle rank, GPipe posting three receiving computes ahead: RF0 RF1 RB0 F0 RB1 SF0 F1 SF1 B0 SB0 B1 SB1
  const std::vector<Action> want = {{Op::RecvF, 1, 0}, {Op::RecvF, 1, 1}, {Op::RecvB, 1, 0}, {Op::F, 1, 0},
                                    {Op::RecvB, 1, 1}, {Op::SendF, 1, 0}, {Op::F, 1, 1},     {Op::SendF, 1, 1},
                                    {Op::B, 1, 0},     {Op::SendB, 1, 0}, {Op::B, 1, 1},     {Op::SendB, 1, 1}};
  CHECK(expand(t, 1) == want);
  // each rank's steps stay in the table's contiguous slice
  CHECK(t.rank(0).size() == 4);
  CHECK(t.num_ranks() == 3);
}

TEST_CASE("Layout::looped places stage s on rank s % ranks", "[action][static]")
{
  constexpr Layout l = Layout::looped(3, 9, 1);
  STATIC_REQUIRE(l.rank_of[7] == 1);
  STATIC_REQUIRE(l.receives(Op::F, 1));
  STATIC_REQUIRE(!l.receives(Op::F, 0));
  STATIC_REQUIRE(l.receives(Op::I, 7));
  STATIC_REQUIRE(!l.receives(Op::B, 8));
}
