// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/nccl_order.hpp: the built-in schedules under NCCL's ordering, with a group per channel
// (the runtime's transport) and with one group per pair of ranks (where receives posted ahead deadlock).
#include "support/catch.hpp"

#include <mpx/nccl_order.hpp>
#include <mpx/schedule.hpp>
#include <mpx/user_table.hpp>

using namespace mpx;

namespace
{
template <class Sched>
constexpr OrderProof order(int ranks, int m, Streams s, int chunks = 1)
{
  return prove_nccl_order(Sched::table(Layout::looped(ranks, ranks * chunks, m)), s);
}
}  // namespace

TEST_CASE("Every built-in schedule runs under NCCL's ordering with a group per channel", "[nccl_order]")
{
  // at compile time, as Pipeline asserts it
  static_assert(order<GPipe>(2, 4, Streams::per_channel).ok());
  static_assert(order<OneFOneB>(4, 8, Streams::per_channel).ok());
  static_assert(order<ZBH1>(4, 8, Streams::per_channel).ok());
  static_assert(order<Interleaved1F1B>(2, 4, Streams::per_channel, 2).ok());
  for (int p : {2, 3, 4, 8})
    for (int m : {1, 2, 4, 9, 16}) {
      CAPTURE(p, m);
      CHECK(order<GPipe>(p, m, Streams::per_channel).ok());
      CHECK(order<OneFOneB>(p, m, Streams::per_channel).ok());
      CHECK(order<ZBH1>(p, m, Streams::per_channel).ok());
      if (m % p == 0) CHECK(order<Interleaved1F1B>(p, m, Streams::per_channel, 2).ok());
    }
}

TEST_CASE("On one group per pair of ranks, receives posted ahead deadlock at micro-batch 0, named", "[nccl_order]")
{
  // rank 0's queue towards rank 1 starts [receive gradient 0, send activation 0]; rank 1's [receive activation 0, ...]
  for (const OrderProof& o : {order<GPipe>(2, 4, Streams::per_peer), order<OneFOneB>(2, 4, Streams::per_peer),
                              order<ZBH1>(2, 4, Streams::per_peer), order<OneFOneB>(4, 8, Streams::per_peer),
                              order<ZBH1>(4, 8, Streams::per_peer), order<GPipe>(4, 8, Streams::per_peer)}) {
    CHECK(o.verdict == OrderProof::Verdict::deadlock);
    CHECK(o.rank == 0);
    CHECK(o.head.op == Op::RecvB);
    CHECK(o.head.mb == 0);
    CHECK(o.peer == 1);
    CHECK(o.peer_head.op == Op::RecvF);
    CHECK(o.peer_head.mb == 0);
  }
}

TEST_CASE("On one group per pair of ranks even a receive posted as late as a table can post it holds back the send it follows", "[nccl_order]")
{
  // a receive is posted right after the compute before it, ahead of that compute's send (expand): on one
  // group per pair the gradient's receive holds the activation's send behind it; a group per channel runs
  for (const char* text : {"F0 RB0 B0; RF0 F0 B0", "F0 F1 RB0 B0 RB1 B1; RF0 F0 RF1 F1 B0 B1"}) {
    CAPTURE(text);
    const int m = text[3] == 'R' ? 1 : 2;
    const auto t = detail::user_table(text, Layout::looped(2, 2, m));
    const OrderProof one_group = prove_nccl_order(t, Streams::per_peer);
    CHECK(one_group.verdict == OrderProof::Verdict::deadlock);
    CHECK(one_group.head.op == Op::RecvB);
    CHECK(one_group.peer_head.op == Op::RecvF);
    CHECK(prove_nccl_order(t, Streams::per_channel).ok());
  }
}
