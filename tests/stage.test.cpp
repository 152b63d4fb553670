// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/stage.hpp and mpx/policy.hpp.
#include "support/archetypes.hpp"
#include "support/catch.hpp"

using namespace mpx;
using namespace archetypes;

TEST_CASE("A plain stage", "[stage][static]")
{
  using S = Stage<Vision, GPU<0>>;
  STATIC_REQUIRE(S::slot == 0);
  STATIC_REQUIRE(S::kind == DeviceKind::cuda);
  STATIC_REQUIRE(!S::frozen);
  STATIC_REQUIRE(!S::checkpointed);
  STATIC_REQUIRE(std::is_void_v<S::optimizer>);
  STATIC_REQUIRE(std::is_same_v<S::precision, FP32>);
  STATIC_REQUIRE(std::is_void_v<S::wire>);
  STATIC_REQUIRE(S::tensor_parallel == 1);
  STATIC_REQUIRE(!S::has_layers);
  STATIC_REQUIRE(S::reads::size == 0);
}

TEST_CASE("Policies are read off the stage type", "[stage][policy][static]")
{
  using S = Stage<Text, CPU<2>, Optimizer<AdamW8bit>, Checkpointed, Precision<BF16>, WireCompression<BF16>,
                  TensorParallel<3>, Layers<2, 6>, Reads<"labels", "tokens">>;
  STATIC_REQUIRE(S::slot == 2);
  STATIC_REQUIRE(S::kind == DeviceKind::cpu);
  STATIC_REQUIRE(S::checkpointed);
  STATIC_REQUIRE(std::is_same_v<S::optimizer, AdamW8bit>);
  STATIC_REQUIRE(std::is_same_v<S::precision, BF16>);
  STATIC_REQUIRE(std::is_same_v<S::wire, BF16>);
  STATIC_REQUIRE(S::tensor_parallel == 3);
  STATIC_REQUIRE(S::has_layers);
  STATIC_REQUIRE(S::layer_begin == 2);
  STATIC_REQUIRE(S::layer_end == 6);
  STATIC_REQUIRE(S::reads::size == 2);
  STATIC_REQUIRE(S::reads::fields[1] == "tokens");

  using F = Stage<Vision, GPU<1>, Frozen, Precision<FP16>>;
  STATIC_REQUIRE(F::frozen);
  STATIC_REQUIRE(std::is_same_v<F::precision, FP16>);  // fp16 is fine on a GPU
}

TEST_CASE("Policy concept", "[policy][static]")
{
  STATIC_REQUIRE(Policy<Frozen>);
  STATIC_REQUIRE(Policy<Optimizer<SGD>>);
  STATIC_REQUIRE(Policy<Layers<0, to_end>>);
  STATIC_REQUIRE(Policy<Reads<"x">>);
  STATIC_REQUIRE(!Policy<int>);
  STATIC_REQUIRE(!Policy<AdamW>);  // an optimizer tag alone is not a policy: wrap it in Optimizer<>
}
