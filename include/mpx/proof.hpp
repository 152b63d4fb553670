// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file proof.hpp
/// The compile-time proof of a schedule table. `mpx::prove(table)` runs every rank's program and reports
/// whether each action belongs to its rank and runs once, whether every micro-batch of every stage goes
/// forward before backward and is finished (a forward-only stage, `Layout::forward_only`, with forwards
/// only), whether every send meets its receive in order, and whether every rank finishes. It also yields the expected step time, bubble fraction and peak in-flight
/// micro-batches per rank. `Pipeline` `static_assert`s each verdict.
///
/// Semantics proved (see docs/03_schedules.md):
/// - a receive is *posted* where the table posts it and does not block;
/// - a compute blocks until the receive it consumes has its data (its send has run);
/// - a send, by default (`Sends::wait_for_receive`, Gloo's, the strictest the executor relies on),
///   *blocks* until the peer has posted the matching receive (a Gloo send completes only then); under
///   `Sends::never_wait` it blocks nothing: NCCL's order where each channel has a group (a stream) of its
///   own, as mpx's runtime builds on NCCL (runtime/boundary_links.hpp) — a send is enqueued on its
///   channel's stream and the rank goes on; what that stream holds behind it is only the channel's later
///   sends, which meet their receives in the same order. nccl_order.hpp models the streams one by one.
/// An executor that waits for its sends later, or posts receives earlier, only removes waits, so it
/// finishes too; every table proved under the default is proved under `never_wait`. The timeline uses
/// asynchronous sends and free communication: it is the schedule's own bubble, under the cost model of
/// action.hpp.
///
/// The proof of a flat table is one pass over the steps with O(1) work each. The proof of a compressed
/// table (`RunTable`) is run_proof.hpp's: the same verdicts, the steady state fast-forwarded.

#include <mpx/action.hpp>    // mpx::Step, mpx::Table, mpx::Layout, mpx::cost_of
#include <mpx/channels.hpp>  // mpx::recv_channel, mpx::send_channel, mpx::num_channels, mpx::peer_stage

#include <array>      // std::array
#include <cstdint>    // std::int64_t

namespace mpx
{

/// What the proof concluded; the first failure found wins.
enum class Verdict : std::uint8_t {
  ok,
  bad_shape,              ///< the table's rank count or sizes differ from the pipeline's layout
  foreign_action,         ///< an action names a stage that lives on another rank, or a micro-batch >= m
  duplicate_action,       ///< an action appears twice
  unfinished_microbatch,  ///< a (stage, micro-batch) lacks its forward or backward (or mixes B with I/W)
  out_of_order,           ///< a backward before its forward, W before I, or a compute whose receive is not posted
  unmatched_messages,     ///< the k-th send on a channel carries another micro-batch than the k-th receive expects
  deadlock,               ///< some rank can never finish
  forward_only_backward,  ///< a backward of a forward-only stage (Frozen, nothing trainable before it)
};

constexpr const char* verdict_text(Verdict v)
{
  constexpr const char* t[] = {"ok",
                               "the table's shape differs from the pipeline's layout",
                               "an action names a stage of another rank or a micro-batch out of range",
                               "an action appears twice",
                               "a micro-batch is left unfinished",
                               "an action comes before what it needs",
                               "sends and receives do not match in order",
                               "the ranks deadlock",
                               "a forward-only stage (Frozen, nothing trainable before it) is given a backward"};
  return t[static_cast<int>(v)];
}

inline constexpr int max_ranks = 256;

/// Result of `prove`. `rank`, `step` and `action` locate the first failure (for a deadlock: where the
/// first blocked rank waits; `peer` is the rank it waits for and `peer_action` where that one waits).
struct Proof
{
  Verdict verdict = Verdict::ok;
  int rank = -1;
  int step = -1;
  Action action{};
  int peer = -1;
  Action peer_action{};

  int ranks = 0;
  std::int64_t makespan = 0;                    ///< expected step time, in cost units
  std::array<std::int64_t, max_ranks> busy{};   ///< compute time per rank
  std::array<int, max_ranks> peak_in_flight{};  ///< stage micro-batches forwarded and not yet fully backwarded
                                                ///< (a forward-only stage's keep nothing: they never count)
  std::int64_t steps = 0;      ///< computes proved, all ranks
  std::int64_t simulated = 0;  ///< of those, computes simulated one by one (the rest fast-forwarded: run tables)

  constexpr bool ok() const { return verdict == Verdict::ok; }
  /// Expected idle fraction of the step, over all ranks: 1 - sum(busy) / (ranks * makespan).
  constexpr double bubble() const
  {
    std::int64_t b = 0;
    for (int r = 0; r < ranks; ++r) b += busy[r];
    return makespan == 0 ? 0.0 : 1.0 - double(b) / double(std::int64_t(ranks) * makespan);
  }
  constexpr int max_in_flight() const
  {
    int x = 0;
    for (int r = 0; r < ranks; ++r) x = peak_in_flight[r] > x ? peak_in_flight[r] : x;
    return x;
  }
};

/// Whether a send waits for the peer's matching receive to be posted (see the file comment).
enum class Sends : std::uint8_t {
  wait_for_receive,  ///< Gloo's (and the shared-memory rings' bound): the default
  never_wait,        ///< NCCL's with a group per channel: the send goes on its channel's stream, the rank on
};

namespace detail
{
enum : std::uint8_t { done_f = 1, done_b = 2, done_w = 4 };
}  // namespace detail

/// Proves a table (see the file comment for what, and under which semantics).
///
/// Channels: 2*b carries activations from stage b to b+1, 2*b+1 gradients from stage b+1 to b.
/// The loop body calls no functions (see schedule.hpp's NOTE).
/// `starts`, if given, receives each step's expected start time (indexed like the table's steps); `costs`,
/// if given, replace the unit costs of the timeline (`mpx::predict`, balance.hpp); `sends`: how a send waits.
template <class AnyTable>
constexpr Proof prove(const AnyTable& t, std::int64_t* starts = nullptr, const StageCosts* costs = nullptr,
                      Sends sends = Sends::wait_for_receive)
{
  using detail::buffer;
  const Layout& l = t.layout;
  Proof p;
  const int S = l.stages, M = l.microbatches, R = l.ranks;
  p.ranks = R;
  auto fail = [&](Verdict v, int r, int k, Action a) {
    p.verdict = v;
    p.rank = r;
    p.step = k;
    p.action = a;
    return p;
  };
  if (R < 1 || R > max_ranks || S < R || S > max_stages || M < 1 || t.num_ranks() != R)
    return fail(Verdict::bad_shape, -1, -1, {});
  if (t.malformed_rank >= 0) return fail(Verdict::bad_shape, t.malformed_rank, t.malformed_step, {});

  const int C = num_channels(S);
  const bool wait = sends == Sends::wait_for_receive;
  buffer<std::uint8_t> state(std::size_t(S) * M);  // done_* bits per (stage, mb)
  buffer<int> count(std::size_t(S) * 4);            // F, B, I, W per stage
  buffer<int> sent(C), consumed(C), rposted(C);     // per channel
  buffer<std::uint32_t> sent_mb(std::size_t(C) * M);
  buffer<std::int64_t> sent_time(std::size_t(C) * M);
  buffer<int> pc(R), phase(R), posted(R), in_flight(R);
  buffer<std::int64_t> clock(R), busy(R);
  buffer<int> peak(R);
  const Step* steps = t.steps.data();
  const std::uint16_t* rank_of = l.rank_of.data();
  const std::uint32_t* begin = t.begin.data();

  // receives posted before the first compute
  for (int r = 0; r < R; ++r) {
    const int n = int(begin[r + 1] - begin[r]);
    const int end = int(t.post_begin[r]) < n ? int(t.post_begin[r]) : n;
    for (int j = 0; j < end; ++j) {
      const Step& c = steps[begin[r] + j];
      if (c.stage >= S) continue;
      if (const int ch = recv_channel(c.op, c.stage, S); ch >= 0) ++rposted.p[ch];
    }
    posted.p[r] = end;
  }

  int finished = 0;
  for (int r = 0; r < R; ++r)
    if (begin[r] == begin[r + 1]) ++finished;
  while (finished < R) {
    bool progress = false;
    for (int r = 0; r < R; ++r) {
      const int b = int(begin[r]), n = int(begin[r + 1]) - b;
      while (pc.p[r] < n) {
        const int k = pc.p[r];
        const Step& c = steps[b + k];
        const int s = c.stage;
        const bool back = c.op == Op::B || c.op == Op::I;
        if (phase.p[r] == 0) {
          // ---- checks that need no peer
          if (!(c.op == Op::F || back || c.op == Op::W)) return fail(Verdict::bad_shape, r, k, {c.op, c.stage, c.mb});
          if (s >= S || rank_of[s] != r || c.mb >= std::uint32_t(M))
            return fail(Verdict::foreign_action, r, k, {c.op, c.stage, c.mb});
          if (c.op != Op::F && s < l.forward_only) return fail(Verdict::forward_only_backward, r, k, {c.op, c.stage, c.mb});
          std::uint8_t& st = state.p[std::size_t(s) * M + c.mb];
          const std::uint8_t mine = c.op == Op::F ? detail::done_f : c.op == Op::W ? detail::done_w : detail::done_b;
          if (st & mine) return fail(Verdict::duplicate_action, r, k, {c.op, c.stage, c.mb});
          const std::uint8_t needs = c.op == Op::F ? 0 : c.op == Op::W ? detail::done_b : detail::done_f;
          if ((st & needs) != needs) return fail(Verdict::out_of_order, r, k, {c.op, c.stage, c.mb});
          // ---- the receive it consumes: posted, and its data sent
          std::int64_t start = clock.p[r];
          const int ch = recv_channel(c.op, s, S);
          if (ch >= 0) {
            if (posted.p[r] <= k)
              return fail(Verdict::out_of_order, r, k, {is_gradient_channel(ch) ? Op::RecvB : Op::RecvF, c.stage, c.mb});
            const int idx = consumed.p[ch];
            if (sent.p[ch] <= idx) break;  // blocked until the peer sends
            const std::size_t at = std::size_t(ch) * M + idx;
            if (sent_mb.p[at] != c.mb) return fail(Verdict::unmatched_messages, r, k, {c.op, c.stage, c.mb});
            if (sent_time.p[at] > start) start = sent_time.p[at];
            ++consumed.p[ch];
          }
          // ---- run it
          st |= mine;
          ++count.p[s * 4 + int(c.op)];
          const std::int64_t cost = costs ? costs->of(c.op, s) : cost_of(c.op);
          clock.p[r] = start + cost;
          if (starts) starts[b + k] = start;
          busy.p[r] += cost;
          if (c.op == Op::F && s >= l.forward_only) ++in_flight.p[r];
          if (c.op == Op::B || c.op == Op::W) --in_flight.p[r];
          if (in_flight.p[r] > peak.p[r]) peak.p[r] = in_flight.p[r];
          // ---- post the receives the table posts after it
          const int end = int(c.post_end) < n ? int(c.post_end) : n;
          for (int j = posted.p[r]; j < end; ++j) {
            const Step& q = steps[b + j];
            if (q.stage >= S) continue;
            if (const int ch = recv_channel(q.op, q.stage, S); ch >= 0) ++rposted.p[ch];
          }
          if (end > posted.p[r]) posted.p[r] = end;
          phase.p[r] = 1;
          progress = true;  // its receives are posted: a blocked sender may go on
        }
        // ---- its send: blocks until the receiver has posted the matching receive (Gloo's)
        const int sch = send_channel(c.op, s, S, l.forward_only);
        if (sch >= 0) {
          const int idx = sent.p[sch];
          if (wait && rposted.p[sch] <= idx) break;  // blocked until the peer posts
          sent_mb.p[std::size_t(sch) * M + idx] = c.mb;
          sent_time.p[std::size_t(sch) * M + idx] = clock.p[r];
          ++sent.p[sch];
        }
        phase.p[r] = 0;
        pc.p[r] = k + 1;
        progress = true;
        if (k + 1 == n) ++finished;
      }
    }
    if (!progress) {
      auto waits = [&](int r) {  // what rank r waits on: its send's receive, or its compute's message
        const int b = int(begin[r]), n = int(begin[r + 1]) - b;
        if (pc.p[r] >= n) return Action{};
        const Step& c = steps[b + pc.p[r]];
        const Op op = phase.p[r] == 1 ? (c.op == Op::F ? Op::SendF : Op::SendB) : c.op == Op::F ? Op::RecvF : Op::RecvB;
        return Action{op, c.stage, c.mb};
      };
      for (int r = 0; r < R; ++r)
        if (pc.p[r] < int(begin[r + 1] - begin[r])) {
          const Action a = waits(r);
          const int ps = peer_stage(a.op, a.stage, S);
          p.peer = ps >= 0 ? int(rank_of[ps]) : -1;
          if (p.peer >= 0) p.peer_action = waits(p.peer);
          return fail(Verdict::deadlock, r, pc.p[r], a);
        }
    }
  }
  // ---- every (stage, micro-batch) finished, with one kind of backward per stage
  for (int s = 0; s < S; ++s) {
    const int f = count.p[s * 4], bb = count.p[s * 4 + 1], i = count.p[s * 4 + 2], w = count.p[s * 4 + 3];
    const bool full = bb == M && i == 0 && w == 0, split = bb == 0 && i == M && w == M;
    if (s < l.forward_only && f != M) return fail(Verdict::unfinished_microbatch, l.rank_of[s], -1, {Op::F, std::uint16_t(s), std::uint32_t(f)});
    if (s < l.forward_only) continue;  // forwards only (a backward failed above)
    if (f != M || !(full || split)) {
      const std::uint8_t whole = detail::done_f | detail::done_b | (bb == 0 ? detail::done_w : 0);
      std::uint32_t mb = 0;
      while (mb < std::uint32_t(M) && state.p[std::size_t(s) * M + mb] == whole) ++mb;
      const std::uint8_t got = mb < std::uint32_t(M) ? state.p[std::size_t(s) * M + mb] : whole;
      const Op missing = !(got & detail::done_f) ? Op::F : !(got & detail::done_b) ? (bb == 0 && i > 0 ? Op::I : Op::B) : Op::W;
      return fail(Verdict::unfinished_microbatch, l.rank_of[s], -1, {missing, std::uint16_t(s), mb});
    }
  }
  for (int r = 0; r < R; ++r) {
    if (clock.p[r] > p.makespan) p.makespan = clock.p[r];
    p.busy[r] = busy.p[r];
    p.peak_in_flight[r] = peak.p[r];
  }
  p.steps = p.simulated = std::int64_t(begin[R]);
  return p;
}

/// Proves a flat table with unit costs under `sends`.
template <class AnyTable>
constexpr Proof prove(const AnyTable& t, Sends sends)
{
  return prove(t, nullptr, nullptr, sends);
}

}  // namespace mpx
