// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/user_table.hpp: the grammar and its agreement with the built-ins.
#include "support/catch.hpp"

#include <mpx/schedule.hpp>
#include <mpx/user_table.hpp>

#include <string>

using namespace mpx;

TEST_CASE("Grammar", "[user_table]")
{
  STATIC_REQUIRE(detail::user_table_parses("F0 F1 B0 B1; F0 B0 F1 B1"));
  STATIC_REQUIRE(detail::user_table_parses("F0 F1 B0 B1\nF0 B0 F1 B1\n"));
  STATIC_REQUIRE(detail::user_table_parses("0:F0 2:F0 RB0 2:B0 0:B0 ; 1:F0 3:F0 3:B0 1:B0"));
  STATIC_REQUIRE(detail::user_table_parses("F12 I3 W3 RF4 RB12"));
  STATIC_REQUIRE(!detail::user_table_parses(""));
  STATIC_REQUIRE(!detail::user_table_parses("F"));
  STATIC_REQUIRE(!detail::user_table_parses("X0"));
  STATIC_REQUIRE(!detail::user_table_parses("RW0"));
  STATIC_REQUIRE(!detail::user_table_parses("F0x"));
  STATIC_REQUIRE(!detail::user_table_parses("a:F0"));
}

TEST_CASE("A text with the built-in 1F1B order gives the built-in table", "[user_table]")
{
  const Layout l = Layout::looped(3, 3, 4);
  const Table built = OneFOneB::table(l);
  std::string text;
  for (int r = 0; r < 3; ++r) {
    for (const Step& s : built.rank(r)) text += std::string(op_name(s.op)) + std::to_string(s.mb) + " ";
    text += ";";
  }
  const Table parsed = detail::user_table(text, l);
  REQUIRE(parsed.steps.size() == built.steps.size());
  for (std::size_t i = 0; i < built.steps.size(); ++i) {
    CAPTURE(i);
    CHECK(parsed.steps[i].op == built.steps[i].op);
    CHECK(parsed.steps[i].mb == built.steps[i].mb);
    CHECK(parsed.steps[i].post_end == built.steps[i].post_end);
  }
  for (int r = 0; r < 3; ++r) CHECK(parsed.post_begin[r] == built.post_begin[r]);
}

TEST_CASE("Explicit receive tokens post exactly where they stand", "[user_table]")
{
  const Table t = detail::user_table("F0 F1 B0 B1; RF0 F0 RF1 B0 F1 B1", Layout::looped(2, 2, 2));
  const auto r1 = expand(t, 1);
  REQUIRE(r1.size() == 8);
  CHECK(r1[0] == Action{Op::RecvF, 1, 0});
  CHECK(r1[1] == Action{Op::F, 1, 0});
  CHECK(r1[2] == Action{Op::RecvF, 1, 1});
  CHECK(r1[3] == Action{Op::B, 1, 0});
  CHECK(r1[4] == Action{Op::SendB, 1, 0});
}
