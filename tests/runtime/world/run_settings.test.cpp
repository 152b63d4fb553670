// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/runtime/world/run_settings.hpp: the first difference between two ranks' settings names the
// setting and both values; malformed settings cannot be compared.
#include "support/rooms.hpp"

TEST_CASE("Run settings: the first difference names the setting and both values", "[rooms][run_settings]")
{
  using mpx::detail::settings_difference;
  const mpx::RunSettings a{{"seed", "1"}, {"config", "tiny"}}, b{{"seed", "2"}, {"config", "tiny"}}, c{{"seed", "1"}};
  CHECK(settings_difference(a, 0, a, 1).empty());
  CHECK(settings_difference(a, 0, b, 1) == "run setting 'seed' is '1' on rank 0 but '2' on rank 1");
  CHECK(settings_difference(a, 0, c, 1) == "rank 0 has run setting 'config' = 'tiny', rank 1 does not set it");
  CHECK(mpx::detail::decode_settings(mpx::detail::encode_settings(a)) == a);
  CHECK_THROWS_AS(mpx::detail::encode_settings({{"a=b", "1"}}), mpx::config_error);
}
