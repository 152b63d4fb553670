// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/errors.hpp: the three kinds of error, and every message starting with `mpx: ` exactly once.
#include "support/catch.hpp"

#include <mpx/errors.hpp>

#include <stdexcept>
#include <type_traits>

TEST_CASE("Errors: a config_error is an invalid_argument, peer and stage errors are runtime errors, with one `mpx: ` prefix", "[errors]")
{
  STATIC_REQUIRE(std::is_base_of_v<std::invalid_argument, mpx::config_error>);
  STATIC_REQUIRE(std::is_base_of_v<std::runtime_error, mpx::peer_error>);
  STATIC_REQUIRE(std::is_base_of_v<std::runtime_error, mpx::stage_error>);
  CHECK(mpx::detail::error_start("rank 1") == "mpx: rank 1");
  CHECK(mpx::detail::error_start("mpx: rank 1") == "mpx: rank 1");
  CHECK(mpx::detail::nested("mpx: the header is short") == "the header is short");
  CHECK(mpx::detail::nested("the header is short") == "the header is short");
}
