// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/boundary.hpp, mpx/tensor.hpp and mpx/batch.hpp.
#include "support/archetypes.hpp"
#include "support/catch.hpp"

using namespace mpx;
using namespace archetypes;

namespace
{
struct Mixed
{
  BOOST_HANA_DEFINE_STRUCT(Mixed, (Tensor, a), (int, b));
};
}  // namespace

TEST_CASE("Boundaries: a tensor or a Hana struct of tensors", "[boundary][static]")
{
  STATIC_REQUIRE(TensorLike<Tensor>);
  STATIC_REQUIRE(TensorLike<const Tensor&>);
  STATIC_REQUIRE(!TensorLike<NotATensor>);
  STATIC_REQUIRE(Boundary<Tensor>);
  STATIC_REQUIRE(Boundary<Pair>);
  STATIC_REQUIRE(!Boundary<Mixed>);
  STATIC_REQUIRE(!Boundary<NotATensor>);
  STATIC_REQUIRE(!Boundary<int>);
  STATIC_REQUIRE(detail::num_members<Pair>() == 2);
}

TEST_CASE("Batch fields are looked up by name", "[batch][static]")
{
  STATIC_REQUIRE(detail::has_member<archetypes::Batch>("labels"));
  STATIC_REQUIRE(detail::has_member<archetypes::Batch>("images"));
  STATIC_REQUIRE(!detail::has_member<archetypes::Batch>("label"));
  STATIC_REQUIRE(!detail::has_member<Tensor>("labels"));
  STATIC_REQUIRE(std::is_same_v<mpx::Batch<archetypes::Batch>::type, archetypes::Batch>);
}
