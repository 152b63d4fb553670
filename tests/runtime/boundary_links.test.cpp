// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/runtime/boundary_links.hpp in one process: the lane rule (which lanes a value leaves on, so
// that each of the next slot's tensor-parallel ranks receives exactly one copy), and CPU messages packed.
// (Messages between real ranks, over shared memory, Gloo and mixed degrees: runtime.test.cpp and tp.test.cpp.)
#include "support/rooms.hpp"

namespace
{
/// A world of slots of tensor-parallel degrees `degree`, seen from tensor-parallel rank `tp_rank` of `slot`.
mpx::World mesh(std::vector<int> degree, int slot, int tp_rank)
{
  mpx::World w;
  w.slots = int(degree.size()), w.degree = degree, w.slot = slot, w.tp_rank = tp_rank, w.tp_size = degree[std::size_t(slot)];
  int first = 0;
  for (int d : degree) w.first_rank.push_back(first), first += d;
  w.ranks_per_replica = first;
  return w;
}
}  // namespace

TEST_CASE("A value leaves on the lanes that reach each of the next slot's ranks exactly once", "[rooms][boundary_links]")
{
  auto one_to_two = mesh({1, 2}, 0, 0);  // degree 1 -> 2: the one rank sends on both lanes
  mpx::BoundaryLinks a(one_to_two);
  CHECK(a.send_lanes(1) == std::vector<int>{0, 1});
  CHECK(a.packing());  // CPU messages travel packed
  auto two_to_one_r0 = mesh({2, 1}, 0, 0), two_to_one_r1 = mesh({2, 1}, 0, 1);  // degree 2 -> 1: rank 0 sends, rank 1 does not
  mpx::BoundaryLinks b0(two_to_one_r0), b1(two_to_one_r1);
  CHECK(b0.send_lanes(1) == std::vector<int>{0});
  CHECK(b1.send_lanes(1).empty());
  auto two_to_four = mesh({2, 4}, 0, 1);  // degree 2 -> 4: rank 1 serves lanes 1 and 3
  mpx::BoundaryLinks c(two_to_four);
  CHECK(c.send_lanes(1) == std::vector<int>{1, 3});
  CHECK_NOTHROW(c.next_step());
  CHECK_NOTHROW(c.finish_sends());  // nothing in flight
}
