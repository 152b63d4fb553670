// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/print.hpp: golden output.
#include "support/archetypes.hpp"
#include "support/catch.hpp"

#include <sstream>

using namespace mpx;
using namespace archetypes;

TEST_CASE("print renders the stage table, the bubble and each rank's timeline", "[print]")
{
  using P = Pipeline<Stage<Vision, CPU<0>, Optimizer<AdamW>>, Stage<Text, CPU<1>, Optimizer<AdamW>>, Microbatches<3>>;
  std::ostringstream os;
  os << print<P>;
  const std::string expected =
      "mpx::Pipeline: 2 stages on 2 slots, schedule 1F1B, 3 micro-batches, proved at compile time\n"
      "  stage slot device module             input -> output                        policies\n"
      "  0     0    CPU<0> archetypes::Vision archetypes::Tensor -> archetypes::Pair Optimizer<AdamW>\n"
      "  1     1    CPU<1> Text               archetypes::Pair -> archetypes::Tensor Optimizer<AdamW>\n"
      "published bubble (p-1)/(m+p-1) = 25%\n"
      "rank 0  |F0|F1|..|..|B0|B0|F2|B1|B1|..|B2|B2|\n"
      "rank 1  |..|F0|B0|B0|F1|B1|B1|F2|B2|B2|..|..|\n"
      "expected bubble 25%  (step 12 units: F 1, B 2, I 1, W 1)  peak in-flight per rank: 2 1\n";
  CHECK(os.str() == expected);
}

TEST_CASE("print shows a frozen first stage running forward only: its rank streams forwards, keeps nothing, and the step is shorter", "[print][frozen]")
{
  using P = Pipeline<Stage<Vision, CPU<0>, Frozen>, Stage<Text, CPU<1>, Optimizer<AdamW>>, Microbatches<3>>;
  std::ostringstream os;
  os << print<P>;
  const std::string expected =
      "mpx::Pipeline: 2 stages on 2 slots, schedule 1F1B, 3 micro-batches, proved at compile time\n"
      "  stage slot device module             input -> output                        policies\n"
      "  0     0    CPU<0> archetypes::Vision archetypes::Tensor -> archetypes::Pair Frozen\n"
      "  1     1    CPU<1> Text               archetypes::Pair -> archetypes::Tensor Optimizer<AdamW>\n"
      "forward only: stage 0 (Frozen, nothing trainable before): no backward, no gradient messages, no activations kept\n"
      "rank 0  |F0|F1|F2|..|..|..|..|..|..|..|\n"
      "rank 1  |..|F0|B0|B0|F1|B1|B1|F2|B2|B2|\n"
      "expected bubble 40%  (step 10 units: F 1, B 2, I 1, W 1)  peak in-flight per rank: 0 1\n";
  CHECK(os.str() == expected);
}

TEST_CASE("print_actions lists receives, computes and sends in program order", "[print]")
{
  std::ostringstream os;
  print_actions(os, OneFOneB::table(Layout::looped(2, 2, 2)), 1);
  CHECK(os.str() == "rank 1: RF0 F0 RF1 B0 SB0 F1 B1 SB1\n");
}

TEST_CASE("A failed proof prints its verdict and place", "[print]")
{
  std::ostringstream os;
  print_timeline(os, detail::user_table("F0 B0 F1 B1; F0 F1 B0 B1", Layout::looped(2, 2, 2)));
  CHECK(os.str().find("schedule proof failed: the ranks deadlock (rank ") == 0);
}
