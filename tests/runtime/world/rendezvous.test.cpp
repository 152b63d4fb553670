// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/runtime/world/rendezvous.hpp in one process: the run's keys are hidden
// under its secret from a store client that does not know it, the Gloo endpoint follows the route or
// GLOO_SOCKET_IFNAME, unreachable addresses are named, a missing store is a config_error in time.
#include "support/rooms.hpp"

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <cstdlib>

namespace
{
c10::intrusive_ptr<c10d::TCPStore> outsider(int port)
{
  c10d::TCPStoreOptions o;
  o.port = static_cast<std::uint16_t>(port);
  o.isServer = false;
  o.waitWorkers = false;
  o.timeout = std::chrono::seconds(5);
  return c10::make_intrusive<c10d::TCPStore>("127.0.0.1", o);
}
using rooms::bytes;
}  // namespace

TEST_CASE("A store client without the run's secret can neither read nor change the run's keys", "[rooms][rendezvous]")
{
  auto w = test::one_rank_world<rooms::P1>(std::chrono::seconds(60), "0123456789abcdef0123456789abcdef");
  const auto mine = w.store->get("mpx/settings/0");  // the world's own key, as the run names it
  auto other = outsider(w.env.master_port);
  CHECK(!other->check({"mpx/0/mpx/settings/0"}));  // the name it would have without a secret
  CHECK(!other->check({"mpx/settings/0"}));
  other->set("mpx/0/mpx/settings/0", bytes("seed=666\n"));  // a write lands beside the run's keys, not on them
  CHECK(w.store->get("mpx/settings/0") == mine);
  CHECK(other->check({"0123456789abcdef0123456789abcdef/mpx/0/mpx/settings/0"}));  // it is there, under the secret
}

TEST_CASE("read_env takes the run's secret from MPX_STORE_SECRET", "[rooms][rendezvous]")
{
  ::setenv("MPX_STORE_SECRET", "s3cret", 1);
  CHECK(mpx::read_env().store_secret == "s3cret");
  ::unsetenv("MPX_STORE_SECRET");
  CHECK(mpx::read_env().store_secret.empty());
}

TEST_CASE("The Gloo endpoint: loopback for a local master, GLOO_SOCKET_IFNAME when set, else the route", "[rooms][rendezvous]")
{
  mpx::Env e;
  e.master_addr = "127.0.0.1";
  CHECK(mpx::detail::gloo_endpoint(e).address == "127.0.0.1");
  ::setenv("GLOO_SOCKET_IFNAME", "lo,eth0", 1);
  e.gloo_socket_ifname = mpx::read_env().gloo_socket_ifname;  // (its first name: env.hpp)
  CHECK(mpx::detail::gloo_endpoint(e).interface == "lo");
  ::unsetenv("GLOO_SOCKET_IFNAME");
  e.gloo_socket_ifname = mpx::read_env().gloo_socket_ifname;
  CHECK(mpx::detail::interface_address("lo") == "127.0.0.1");
  CHECK(mpx::detail::route_address("127.0.0.2", 29500) == "127.0.0.1");  // the kernel's choice for that route
  e.master_addr = "no-such-host.invalid";
  CHECK_THROWS_WITH(mpx::detail::gloo_endpoint(e), Catch::Contains("no route to MASTER_ADDR=no-such-host.invalid"));
}

TEST_CASE("An address nobody listens on is named, a store that is not there is a config_error within the timeout", "[rooms][rendezvous]")
{
  const int port = mpx::detail::free_port();
  CHECK(mpx::detail::try_connect("127.0.0.1", port, std::chrono::milliseconds(500)).find("refused") != std::string::npos);
  mpx::Env e;
  e.rank = 1;
  e.world_size = 2;
  e.master_port = port;
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH(mpx::make_store(e, std::chrono::milliseconds(1500)), Catch::Contains("could not join the rendezvous at 127.0.0.1:"));
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10));
}
