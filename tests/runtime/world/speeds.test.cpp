// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/runtime/world/speeds.hpp: the probe measures for its budget and gives a throughput, the exchange
// through a store gives every rank's figure and names a missing rank or a foreign value. (slot_seconds, a
// collective over the world, runs in the moondream rebalancing test with real ranks: moondream.train.rebalance.)
#include "support/catch.hpp"

#include <mpx/runtime/world/speeds.hpp>

#include <torch/csrc/distributed/c10d/HashStore.hpp>  // c10d::HashStore

#include <chrono>

using namespace std::chrono_literals;

TEST_CASE("The speed probe times matrix products for its budget and reports GFLOP/s", "[speeds]")
{
  const auto t0 = std::chrono::steady_clock::now();
  const double gflops = mpx::probe_speed(torch::kCPU, 200ms);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(gflops > 0.1);   // any CPU of this century
  CHECK(gflops < 1e5);
  CHECK(took >= 0.2);
  CHECK(took < 5.0);
}

TEST_CASE("Speeds exchanged through the store come back by rank, and a missing rank or a foreign value is named", "[speeds]")
{
  auto store = c10::make_intrusive<c10d::HashStore>();
  CHECK(mpx::exchange_speeds(*store, 0, 1, 12.5, 1000ms) == std::vector<double>{12.5});
  CHECK_THROWS_WITH(mpx::exchange_speeds(*store, 0, 1, 0.0, 1000ms, "zero"), Catch::Contains("is not a positive number"));
  // rank 1 of 2 never arrives: rank 0 stops waiting, naming what it waited for
  CHECK_THROWS_WITH(mpx::exchange_speeds(*store, 0, 2, 3.0, 200ms, "absent"), Catch::Contains("for every rank's measured speed"));
  // another program's value under rank 1's key
  const std::string junk = "fast";
  store->set("mpx/speeds/junk/1", std::vector<std::uint8_t>(junk.begin(), junk.end()));
  CHECK_THROWS_WITH(mpx::exchange_speeds(*store, 0, 2, 3.0, 1000ms, "junk"), Catch::Contains("'fast'") && Catch::Contains("not a speed"));
}
