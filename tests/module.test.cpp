// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/module.hpp.
#include "support/archetypes.hpp"
#include "support/catch.hpp"

using namespace mpx;
using namespace archetypes;

TEST_CASE("module_traits reads forward, declared types and holders", "[module][static]")
{
  STATIC_REQUIRE(StageModule<Vision>);
  STATIC_REQUIRE(std::is_same_v<module_traits<Vision>::input_type, Tensor>);
  STATIC_REQUIRE(std::is_same_v<module_traits<Vision>::output_type, Pair>);
  STATIC_REQUIRE(std::is_void_v<module_traits<Vision>::hidden_type>);
  STATIC_REQUIRE(module_traits<Vision>::num_layers == -1);

  STATIC_REQUIRE(StageModule<Text>);
  STATIC_REQUIRE(std::is_same_v<module_traits<Text>::input_type, Pair>);
  STATIC_REQUIRE(std::is_same_v<module_traits<Text>::hidden_type, Tensor>);
  STATIC_REQUIRE(module_traits<Text>::num_layers == 8);
  STATIC_REQUIRE(module_traits<Text>::num_heads == 6);
  STATIC_REQUIRE(module_traits<Text>::name == "Text");

  STATIC_REQUIRE(StageModule<BlockHolder>);  // looks through ContainedType, const& argument decayed
  STATIC_REQUIRE(std::is_same_v<module_traits<BlockHolder>::input_type, Tensor>);
  STATIC_REQUIRE(module_traits<Block>::name.find("Block") != std::string_view::npos);

  STATIC_REQUIRE(!StageModule<NotAModule>);
  STATIC_REQUIRE(!StageModule<int>);
}
