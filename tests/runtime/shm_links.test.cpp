// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/runtime/shm_links.hpp in one process: the store holds what the ranks agree on, so a second
// rank's part is played by writing its keys; the ring a sender opens for a peer on this host carries a
// message to a receiver that opens it by the same name, a peer elsewhere gets no ring, and the world's sum
// goes through shared memory only when every rank shares the host. (Two real ranks: runtime.test.cpp's
// parity cases run over these rings, and over Gloo with MPX_SHM=0.)
#include "support/rooms.hpp"

#include <torch/csrc/distributed/c10d/HashStore.hpp>

namespace
{
using rooms::bytes;

/// Rank 0 of a two-slot world on a store of its own, rank 1 not there: its keys are written by the test.
mpx::World two_rank_world(int local_world_size)
{
  mpx::World w;
  w.env.world_size = 2, w.env.local_world_size = local_world_size, w.env.shm.spin_us = 0;
  w.slots = 2, w.ranks_per_replica = 2, w.degree = {1, 1}, w.first_rank = {0, 1};
  w.timeout = std::chrono::seconds(5);
  w.store = c10::make_intrusive<c10d::HashStore>();
  return w;
}
}  // namespace

TEST_CASE("Shared memory: a ring to a peer on this host, none to a peer elsewhere, the world's sum where all share it", "[rooms][shm_links]")
{
  {  // rank 1 says it runs here: rank 0's ring to it is a ring, and carries a message
    auto w = two_rank_world(2);
    w.store->set("mpx/shm/0/host/1", bytes("host " + mpx::detail::host_identity()));
    mpx::ShmLinks links(w, true);
    mpx::ShmRing* out = links.outgoing(0, 1, 0);
    REQUIRE(out != nullptr);
    CHECK(links.outgoing(0, 1, 0) == out);  // opened once per channel
    CHECK(out->try_write(8, [](auto put) {
      const std::uint64_t v = 42;
      put(&v, 8);
    }));
    const std::string token = [&] {
      const auto v = w.store->get("mpx/shm/0/token");
      const std::string t(v.begin(), v.end());
      return t.substr(0, t.find(' '));
    }();
    mpx::ShmRing in("/mpx-" + token + "-0-1-0-0", 8192ull << 10, mpx::ShmRing::End::receiver, "rank 0", w.timeout, std::chrono::microseconds(0));
    bool over = true;
    std::uint64_t over_bytes = 0;
    const auto m = in.read(over, over_bytes, "the test's message");
    CHECK(!over);
    REQUIRE(m.numel() == 8);
    CHECK(*reinterpret_cast<const std::uint64_t*>(m.data_ptr()) == 42);
    // the world's sum: every rank shares the host (rank 1 says so under the sum's own keys)
    w.store->set("mpx/shm/1/host/1", bytes("host " + mpx::detail::host_identity()));
    CHECK(mpx::make_world_sum(w) != nullptr);
  }
  {  // rank 1 runs elsewhere: no ring, and the sum goes over Gloo
    auto w = two_rank_world(2);
    w.store->set("mpx/shm/0/host/1", bytes("host another-host"));
    mpx::ShmLinks links(w, true);
    CHECK(links.outgoing(0, 1, 0) == nullptr);
    CHECK(links.incoming(0, 1, 0) == nullptr);
    w.store->set("mpx/shm/1/host/1", bytes("host another-host"));
    CHECK(mpx::make_world_sum(w) == nullptr);
  }
  {  // shared memory off (MPX_SHM=0 on this rank): it shares with nobody
    auto w = two_rank_world(2);
    w.env.shm.on = false;
    w.store->set("mpx/shm/0/host/1", bytes("host " + mpx::detail::host_identity()));
    mpx::ShmLinks links(w, true);
    CHECK(links.outgoing(0, 1, 0) == nullptr);
  }
  {  // messages on the device, or a world of one: nothing comes here
    auto w = two_rank_world(2);
    mpx::ShmLinks off(w, false);
    CHECK(off.outgoing(0, 1, 0) == nullptr);
    auto one = test::one_rank_world<rooms::P1>();
    CHECK(mpx::make_world_sum(one) == nullptr);
  }
}
