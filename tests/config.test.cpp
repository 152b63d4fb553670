// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/config.hpp: strings as template arguments, type names and the fingerprint's hash at compile time.
#include "support/catch.hpp"

#include <mpx/config.hpp>

namespace
{
template <mpx::fixed_string S>
constexpr std::size_t length_of() { return S.size(); }
}  // namespace

TEST_CASE("fixed_string, type_name and FNV-1a are compile-time facts", "[config]")
{
  STATIC_REQUIRE(length_of<"labels">() == 6);
  STATIC_REQUIRE(mpx::fixed_string("labels").view() == "labels");
  STATIC_REQUIRE(mpx::detail::type_name<int>() == "int");
  STATIC_REQUIRE(mpx::detail::fnv1a("") == 14695981039346656037ull);  // the offset basis
  STATIC_REQUIRE(mpx::detail::fnv1a("a") == 0xaf63dc4c8601ec8cull);   // FNV-1a's published value for "a"
  STATIC_REQUIRE(mpx::detail::fnv1a_u64(0, 1) != mpx::detail::fnv1a_u64(1, 1));
  STATIC_REQUIRE(MPX_VERSION_MAJOR == 0);
}
