// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/device.hpp.
#include "support/catch.hpp"

#include <mpx/device.hpp>

using namespace mpx;

TEST_CASE("Device tags model Device, other types do not", "[device][static]")
{
  STATIC_REQUIRE(Device<GPU<0>>);
  STATIC_REQUIRE(Device<GPU<7>>);
  STATIC_REQUIRE(Device<CPU<0>>);
  STATIC_REQUIRE(Device<CPU<>>);
  STATIC_REQUIRE(!Device<int>);
  STATIC_REQUIRE(!Device<void>);
  STATIC_REQUIRE(device_traits<GPU<3>>::kind == DeviceKind::cuda);
  STATIC_REQUIRE(device_traits<CPU<2>>::kind == DeviceKind::cpu);
  STATIC_REQUIRE(slot_v<GPU<3>> == 3);
  STATIC_REQUIRE(slot_v<CPU<>> == 0);
}
