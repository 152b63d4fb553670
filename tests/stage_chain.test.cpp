// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/stage_chain.hpp: what each stage receives and returns (layer ranges exchange the module's
// hidden type), and the chain's rules evaluated directly, where a Pipeline would stop compiling: ranges
// with a gap, an overlap or a short end, a module both split and whole, a field the batch lacks.
#include "support/archetypes.hpp"
#include "support/catch.hpp"

#include <mpx/stage_chain.hpp>

using namespace mpx;
using namespace archetypes;

namespace
{
template <class B, class... S>
using chain_of = detail::StageChain<typename detail::indexer_of<detail::type_list<S...>>::type, sizeof...(S), B>;

using Ranged = chain_of<archetypes::Batch, Stage<Vision, CPU<0>, Reads<"images">>, Stage<Text, CPU<1>, Layers<0, 3>>,
                        Stage<Text, CPU<2>, Layers<3, 6>>, Stage<Text, CPU<3>, Layers<6, to_end>, Reads<"labels">>>;
}  // namespace

TEST_CASE("Layer ranges exchange the module's hidden type", "[stage_chain][static]")
{
  STATIC_REQUIRE(std::is_same_v<Ranged::output_of<0>, Pair>);
  STATIC_REQUIRE(std::is_same_v<Ranged::input_of<1>, Pair>);     // the first range takes input_type
  STATIC_REQUIRE(std::is_same_v<Ranged::output_of<1>, Tensor>);  // inner ranges pass hidden_type
  STATIC_REQUIRE(std::is_same_v<Ranged::input_of<2>, Tensor>);
  STATIC_REQUIRE(std::is_same_v<Ranged::output_of<3>, Tensor>);  // the last range returns output_type
  STATIC_REQUIRE(Ranged::is_last_range<3>());
  STATIC_REQUIRE(!Ranged::is_last_range<2>());
  STATIC_REQUIRE(Ranged::previous_range<3>() == 2);
  STATIC_REQUIRE(Ranged::previous_range<1>() == -1);
  STATIC_REQUIRE(Ranged::boundaries_chain());
  STATIC_REQUIRE(Ranged::layers_tile());
  STATIC_REQUIRE(Ranged::reads_exist());
}

TEST_CASE("Ranges must tile the module's layers exactly once, in stage order", "[stage_chain][static]")
{
  using Gap = chain_of<void, Stage<Text, CPU<0>, Layers<0, 3>>, Stage<Text, CPU<1>, Layers<4, to_end>>>;
  using Overlap = chain_of<void, Stage<Text, CPU<0>, Layers<0, 4>>, Stage<Text, CPU<1>, Layers<3, 8>>>;
  using Short = chain_of<void, Stage<Text, CPU<0>, Layers<0, 3>>, Stage<Text, CPU<1>, Layers<3, 6>>>;  // of 8
  using LateStart = chain_of<void, Stage<Text, CPU<0>, Layers<1, to_end>>>;
  using EndThenMore = chain_of<void, Stage<Text, CPU<0>, Layers<0, to_end>>, Stage<Text, CPU<1>, Layers<4, 8>>>;
  using SplitAndWhole = chain_of<void, Stage<Text, CPU<0>, Layers<0, to_end>>, Stage<Text, CPU<1>>>;
  using Exact = chain_of<void, Stage<Text, CPU<0>, Layers<0, 5>>, Stage<Text, CPU<1>, Layers<5, 8>>>;
  STATIC_REQUIRE(!Gap::layers_tile());
  STATIC_REQUIRE(!Overlap::layers_tile());
  STATIC_REQUIRE(!Short::layers_tile());
  STATIC_REQUIRE(!LateStart::layers_tile());
  STATIC_REQUIRE(!EndThenMore::layers_tile());
  STATIC_REQUIRE(!SplitAndWhole::layers_tile());
  STATIC_REQUIRE(Exact::layers_tile());
  STATIC_REQUIRE(chain_of<void, Stage<Block, CPU<0>>, Stage<Block, CPU<1>>>::layers_tile());  // no ranges
}

TEST_CASE("A field a stage Reads must be in the batch, and there must be a batch", "[stage_chain][static]")
{
  STATIC_REQUIRE(chain_of<archetypes::Batch, Stage<Vision, CPU<0>, Reads<"images">>>::reads_exist());
  STATIC_REQUIRE(!chain_of<archetypes::Batch, Stage<Vision, CPU<0>, Reads<"pixels">>>::reads_exist());
  STATIC_REQUIRE(!chain_of<void, Stage<Vision, CPU<0>, Reads<"images">>>::reads_exist());
  STATIC_REQUIRE(chain_of<void, Stage<Vision, CPU<0>>>::reads_exist());
}
