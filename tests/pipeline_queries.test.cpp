// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/pipeline_queries.hpp: the queries of a Pipeline type are integral constants, usable in
// static_assert; proof<P>() and table_v<P> answer for pipelines proved at compile time and at start-up.
#include "support/archetypes.hpp"
#include "support/catch.hpp"

using namespace mpx;
using namespace archetypes;

namespace
{
using Pair2 = Pipeline<Stage<Vision, GPU<0>, Frozen>, Stage<Text, GPU<1>>>;
using Ranges4 = Pipeline<Stage<Vision, CPU<0>>, Stage<Text, CPU<1>, Layers<0, 3>>, Stage<Text, CPU<2>, Layers<3, 6>>,
                         Stage<Text, CPU<3>, Layers<6, to_end>>, Schedule<GPipe>, Microbatches<8>>;
using Looped4 = Pipeline<Stage<Block, CPU<0>>, Stage<Block, CPU<1>>, Stage<Block, CPU<0>>, Stage<Block, CPU<1>>,
                         Schedule<Interleaved1F1B>, Microbatches<4>>;
}  // namespace

TEST_CASE("Queries return integral constants", "[pipeline_queries][static]")
{
  STATIC_REQUIRE(PipelineType<Pair2>);
  STATIC_REQUIRE(!PipelineType<Stage<Block, CPU<0>>>);
  STATIC_REQUIRE(decltype(num_stages<Pair2>())::value == 2);
  STATIC_REQUIRE(num_slots<Pair2>() == 2);
  STATIC_REQUIRE(num_microbatches<Pair2>() == 2);  // default: one per slot
  STATIC_REQUIRE(slot_of<1, Pair2>() == 1);
  STATIC_REQUIRE(num_stages_v<Ranges4> == 4);
  STATIC_REQUIRE(num_slots_v<Ranges4> == 4);
  STATIC_REQUIRE(num_microbatches_v<Ranges4> == 8);
  STATIC_REQUIRE(slot_of_v<3, Ranges4> == 3);
  STATIC_REQUIRE(num_chunks<Looped4>() == 2);
  STATIC_REQUIRE(std::is_same_v<decltype(stages_on_slot<0, Looped4>()), std::integer_sequence<int, 0, 2>>);
  STATIC_REQUIRE(std::is_same_v<decltype(stages_on_slot<1, Looped4>()), std::integer_sequence<int, 1, 3>>);
}

TEST_CASE("proof<P>() is the compile-time proof when there is one, and table_v<P> the table it proved", "[pipeline_queries]")
{
  STATIC_REQUIRE(Ranges4::proved_at_compile_time);
  STATIC_REQUIRE(proof<Ranges4>().makespan == proof_v<Ranges4>.makespan);
  STATIC_REQUIRE(proof_v<Looped4>.ok());
  constexpr auto& t = table_v<Ranges4>;
  CHECK(t.steps.size() == Ranges4::num_steps);
  const Proof again = prove(t);
  CHECK(again.ok());
  CHECK(again.makespan == proof_v<Ranges4>.makespan);
}
