// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file nccl_order.hpp
/// The proof of a schedule table under NCCL's ordering. `prove_nccl_order(table, streams)` walks every
/// rank's action list as the executor does (`expand`: receives posted where the table posts them, sends
/// right after the compute that produced them) against this model of NCCL:
/// - messages travel on *streams* (a communicator's stream between two ranks); on a stream each rank's
///   operations run one at a time, in its posting order;
/// - a send and a receive at the heads of their ranks' queues on one stream meet and both complete; a
///   receive at the head holds every later operation of its rank on that stream until its send arrives,
///   and a send holds them until its receive is at the peer's head;
/// - posting never blocks the rank (NCCL's calls return at once); a compute waits until the receive it
///   consumes has completed; a step ends when every operation has completed.
/// Which messages share a stream is the transport's choice (`Streams`): `per_channel` — a group per
/// channel, one direction each, what mpx's runtime builds where messages travel as on NCCL
/// (boundary_links.hpp) — or `per_peer` — every message between two ranks on one group, as a pipeline on
/// one process group of NCCL carries them. The result names the first blocked rank's head operation and,
/// for a deadlock, the peer's head operation it waits behind.
///
/// Under `per_channel` what follows a receive on its stream is only its channel's later receives, which the
/// rank consumes in that order anyway; so every table the Gloo proof accepts (proof.hpp: sends block until
/// their receive is posted, a strictly stronger condition) passes here too. `per_channel` is the model that
/// `prove(table, Sends::never_wait)` (proof.hpp) reaches at O(1) a step, which is what `Pipeline` asserts for
/// GPU pipelines (tests/nccl_order.test.cpp compares the two on 3,000 tables); this one is the reference.
/// `per_peer` is what the posting of receives ahead fails: the receive of micro-batch 0's gradient, posted
/// first, holds micro-batch 0's activation behind it.
/// Cost: one pass over each rank's expanded actions per sweep, sweeps about the table's critical path.

#include <mpx/action.hpp>    // mpx::Action, mpx::Op, mpx::expand
#include <mpx/channels.hpp>  // mpx::channel_of, mpx::peer_stage

#include <cstdint>  // std::uint8_t
#include <vector>   // std::vector

namespace mpx
{

/// Which messages share a stream (see the file comment).
enum class Streams : std::uint8_t { per_channel, per_peer };

/// What `prove_nccl_order` concluded.
struct OrderProof
{
  enum class Verdict : std::uint8_t { ok, deadlock, unmatched } verdict = Verdict::ok;
  int rank = -1;     ///< the first blocked rank (or where a mismatch met)
  Action head{};     ///< its operation at the head of the stream that holds it
  int peer = -1;     ///< the rank at the stream's other end
  Action peer_head{};  ///< the peer's operation at the head of that stream (op SendF's stage 0xFFFF: none posted)
  constexpr bool ok() const { return verdict == Verdict::ok; }
};

namespace detail
{
constexpr bool is_message(Op op) { return is_send(op) || is_recv(op); }

/// One message operation in its stream's queue at one end: the rank, its place in the rank's list.
struct QueuedOp
{
  int rank = 0;
  std::size_t at = 0;
};
}  // namespace detail

/// Proves table `t` under NCCL's ordering with `streams` (see the file comment).
template <class AnyTable>
constexpr OrderProof prove_nccl_order(const AnyTable& t, Streams streams)
{
  using namespace detail;
  const Layout& l = t.layout;
  const int R = l.ranks, S = l.stages, C = 2 * S;
  std::vector<std::vector<Action>> acts(std::size_t(R), std::vector<Action>{});
  for (int r = 0; r < R; ++r) acts[std::size_t(r)] = expand(t, r);
  auto peer_of = [&](int r, const Action& a) { return int(l.rank_of[std::size_t(peer_stage(a.op, a.stage, S))]); };
  // a stream's key: its channel, or the pair of ranks (low * R + high)
  auto stream_of = [&](int r, const Action& a) {
    if (streams == Streams::per_channel) return channel_of(a.op, a.stage);
    const int p = peer_of(r, a);
    return r < p ? r * R + p : p * R + r;
  };
  const int K = streams == Streams::per_channel ? C : R * R;
  // per stream, per end (the lower rank first), its operations in posting order, and the head's index
  std::vector<std::vector<QueuedOp>> queue(std::size_t(K) * 2, std::vector<QueuedOp>{});
  std::vector<std::size_t> head(std::size_t(K) * 2, 0);
  auto end_of = [&](int key, int r, const Action& a) { return std::size_t(key) * 2 + (r < peer_of(r, a) ? 0 : 1); };
  for (int r = 0; r < R; ++r)
    for (std::size_t i = 0; i < acts[std::size_t(r)].size(); ++i) {
      const Action& a = acts[std::size_t(r)][i];
      if (is_message(a.op)) queue[end_of(stream_of(r, a), r, a)].push_back({r, i});
    }
  std::vector<std::size_t> pc(std::size_t(R), 0);
  std::vector<bool> arrived(std::size_t(C) * std::size_t(l.microbatches), false);  // per (channel, micro-batch): received
  OrderProof out;
  // completes the meetings at the heads of stream `key`; false on a mismatch (out set)
  auto meet = [&](int key) {
    auto& q0 = queue[std::size_t(key) * 2];
    auto& q1 = queue[std::size_t(key) * 2 + 1];
    std::size_t& h0 = head[std::size_t(key) * 2];
    std::size_t& h1 = head[std::size_t(key) * 2 + 1];
    while (h0 < q0.size() && h1 < q1.size() && q0[h0].at < pc[std::size_t(q0[h0].rank)] && q1[h1].at < pc[std::size_t(q1[h1].rank)]) {
      const Action& a = acts[std::size_t(q0[h0].rank)][q0[h0].at];
      const Action& b = acts[std::size_t(q1[h1].rank)][q1[h1].at];
      if (is_send(a.op) == is_send(b.op)) return true;  // two receives (or two sends) at the heads: held
      const Action& recv = is_send(a.op) ? b : a;
      const Action& send = is_send(a.op) ? a : b;
      if (channel_of(send.op, send.stage) != channel_of(recv.op, recv.stage) || send.mb != recv.mb) {
        out.verdict = OrderProof::Verdict::unmatched;
        out.rank = is_send(a.op) ? q1[h1].rank : q0[h0].rank, out.head = recv;
        out.peer = is_send(a.op) ? q0[h0].rank : q1[h1].rank, out.peer_head = send;
        return false;
      }
      arrived[std::size_t(channel_of(recv.op, recv.stage)) * std::size_t(l.microbatches) + recv.mb] = true;
      ++h0, ++h1;
    }
    return true;
  };
  bool progress = true;
  while (progress) {
    progress = false;
    for (int r = 0; r < R; ++r) {
      auto& mine = acts[std::size_t(r)];
      while (pc[std::size_t(r)] < mine.size()) {
        const Action& a = mine[pc[std::size_t(r)]];
        if (!is_message(a.op)) {
          Action need{};
          if (receive_of(l, a.op, a.stage, need) &&
              !arrived[std::size_t(channel_of(need.op, a.stage)) * std::size_t(l.microbatches) + a.mb])
            break;  // waits for its data
        }
        ++pc[std::size_t(r)];
        progress = true;
        if (is_message(a.op) && !meet(stream_of(r, a))) return out;
      }
    }
  }
  // finished when every rank is through its list and every queue is drained
  for (int r = 0; r < R; ++r) {
    const auto& mine = acts[std::size_t(r)];
    std::size_t k = pc[std::size_t(r)];
    if (k == mine.size()) {  // through: a send of its may still wait at a head
      for (int key = 0; key < K; ++key)
        for (int e = 0; e < 2; ++e) {
          const auto& q = queue[std::size_t(key) * 2 + std::size_t(e)];
          const std::size_t h = head[std::size_t(key) * 2 + std::size_t(e)];
          if (h < q.size() && q[h].rank == r) k = q[h].at;
        }
      if (k == mine.size()) continue;
    } else {  // blocked on a compute: the head of the stream its receive travels on
      Action need{};
      receive_of(l, mine[k].op, mine[k].stage, need);
      const Action rv{need.op, mine[k].stage, mine[k].mb};
      const int key = stream_of(r, rv);
      const std::size_t e = end_of(key, r, rv);
      k = queue[e][head[e]].at;
    }
    const Action& a = mine[k];
    const int key = stream_of(r, a);
    const std::size_t other = end_of(key, r, a) ^ 1;
    out.verdict = OrderProof::Verdict::deadlock;
    out.rank = r, out.head = a, out.peer = peer_of(r, a);
    out.peer_head = head[other] < queue[other].size() ? acts[std::size_t(queue[other][head[other]].rank)][queue[other][head[other]].at]
                                                      : Action{Op::SendF, 0xFFFF, 0};
    return out;
  }
  return out;
}

}  // namespace mpx
