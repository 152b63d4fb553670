// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/shape.hpp: a tensor type declares its boundary shape through tensor_traits<T>::dims.
#include "support/archetypes.hpp"

#include "support/catch.hpp"

namespace
{
/// A tensor archetype of declared shape (any, 16).
struct Rows16
{
};
}  // namespace

template <>
struct mpx::tensor_traits<Rows16>
{
  static constexpr bool is_tensor = true;
  using dims = mpx::Dims<mpx::any, 16>;
};

TEST_CASE("Dims holds the rank and the extents, a tensor type declares them through its traits", "[shape]")
{
  using D = mpx::Dims<mpx::any, 729, 64>;
  STATIC_REQUIRE(D::rank == 3);
  STATIC_REQUIRE(D::extents[0] == mpx::any);
  STATIC_REQUIRE(D::extents[2] == 64);
  STATIC_REQUIRE(mpx::Dims<>::rank == 0);  // a scalar
  STATIC_REQUIRE(mpx::DeclaresShape<Rows16>);
  STATIC_REQUIRE(mpx::DeclaresShape<const Rows16&>);
  STATIC_REQUIRE(!mpx::DeclaresShape<archetypes::Tensor>);
  STATIC_REQUIRE(!mpx::DeclaresShape<archetypes::NotATensor>);
  STATIC_REQUIRE(mpx::Boundary<Rows16>);
}
