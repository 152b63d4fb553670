// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file run_proof.hpp
/// The proof of a compressed table (`RunTable`, runs.hpp): `mpx::prove(run_table)` reaches the verdicts and
/// numbers of the flat proof (proof.hpp, whose file comment says what is proved and under which
/// semantics) on the expanded table, stepping through warm-up and drain one compute at a time and
/// fast-forwarding the steady state, so that p = 64, m = 512 stays cheap for the compiler's constant
/// evaluator.

#include <mpx/action.hpp>    // mpx::Layout, mpx::cost_of, mpx::is_compute
#include <mpx/channels.hpp>  // mpx::recv_channel, mpx::send_channel, mpx::num_channels, mpx::peer_stage
#include <mpx/proof.hpp>     // mpx::Proof, mpx::Verdict, mpx::max_ranks
#include <mpx/run_facts.hpp> // mpx::detail::RunFacts, run_facts
#include <mpx/runs.hpp>      // mpx::RunTable, mpx::Run, mpx::RunAction

#include <cstdint>  // std::int64_t

namespace mpx
{

/// Proves a compressed table (runs.hpp): the verdicts and numbers of `prove(to_table(t))`. This proof
/// also requires each stage's actions of one kind in micro-batch order (the form's rule; every built-in
/// schedule obeys it) and reports a violation as `out_of_order` or `duplicate_action`; with that order,
/// the k-th message on a channel always carries micro-batch k, so messages match by construction.
///
/// Fast-forward: at the start of a sweep over the ranks that follows a sweep in which no rank entered
/// another run, when every unfinished rank is inside a repeated run, the state is compared with a
/// snapshot taken some sweeps earlier (Brent's cycle search: the snapshot moves after 1, 2, 4, ... sweeps).
/// If each rank sits at the same place of its pattern some repetitions later, with the same receives
/// posted ahead (its posting cursor the same distance ahead, or parked unmoved in a later run); if every
/// clock and pending message moved by the same time T; if each channel carried as many sends as
/// receives were posted and consumed; and if each stage's "forward done before backward" and "backward
/// done before W" counters moved alike (or the earlier action is complete), then the sweeps in between
/// are a period of the steady state: the simulation is deterministic and every comparison it makes is
/// between quantities that moved alike, so each further period repeats it shifted. The proof adds as many
/// whole periods as every rank's run (and its posting cursor) still holds, and steps on.
/// `Proof::simulated` counts the computes it stepped through one by one. `costs`, if given, replace the
/// unit costs of the timeline (the fast-forward compares exact integer times, whatever they are).
/// `sends`: how a send waits (proof.hpp); under `never_wait` a channel may hold all its m messages unread.
constexpr Proof prove(const RunTable& t, const StageCosts* costs = nullptr, Sends sends = Sends::wait_for_receive)
{
  using detail::buffer;
  const Layout& l = t.layout;
  Proof p;
  const int S = l.stages, M = l.microbatches, R = l.ranks, look = t.lookahead;
  p.ranks = R;
  auto fail = [&](Verdict v, int r, std::int64_t k, Action a) {
    p.verdict = v;
    p.rank = r;
    p.step = int(k);
    p.action = a;
    return p;
  };
  if (R < 1 || R > max_ranks || S < R || S > max_stages || M < 1 || t.num_ranks() != R || look < 1)
    return fail(Verdict::bad_shape, -1, -1, {});
  const RunAction* A = t.actions.data();
  const Run* RN = t.runs.data();
  const std::uint32_t* rb = t.begin.data();
  const std::uint16_t* rank_of = l.rank_of.data();
  const std::size_t NA = t.actions.size();
  for (int r = 0; r < R; ++r)
    for (std::uint32_t j = rb[r]; j < rb[r + 1]; ++j)
      if (RN[j].len == 0 || RN[j].count == 0 || std::size_t(RN[j].first) + RN[j].len > NA) return fail(Verdict::bad_shape, r, -1, {});

  // ---- per action, what does not change with the repetition; per run, whether it may be jumped
  detail::RunFacts facts = detail::run_facts(t, costs);
  const buffer<int>&ctr = facts.ctr, &need = facts.need, &rch = facts.rch, &sch = facts.sch, &bad = facts.bad, &flight = facts.flight,
        &full = facts.full;
  const buffer<std::int64_t>&cost = facts.cost, &lim = facts.lim;
  const buffer<std::uint8_t>& jumpable = facts.jumpable;

  // messages sent and not yet consumed, per channel: at most the receives posted ahead (look) while a send
  // waits for its receive; any number up to m when it does not
  const bool wait = sends == Sends::wait_for_receive;
  const int C = num_channels(S), cap = wait ? look + 1 : M + 1;
  const std::int64_t yield_after = wait ? 64 : 1;  // computes before a rank that never blocks yields (below)
  buffer<std::int64_t> cnt(std::size_t(3) * S + 1), nb(std::size_t(S) + 1);  // done per (kind, stage); full backwards per stage
  cnt.p[3 * S] = std::int64_t(1) << 62;
  buffer<std::int64_t> sent(C), consumed(C), rposted(C);
  buffer<std::int64_t> sent_time(std::size_t(C) * cap);  // ring: message i of channel ch at ch * cap + i % cap
  // per rank: position (run j, repetition q, entry a, step k), phase (1: computed, send pending),
  // posting cursor (pj, pq, pa, pk) and receiving computes posted ahead
  buffer<std::int64_t> rj(R), rq(R), ra(R), rk(R), phase(R), pj(R), pq(R), pa(R), pk(R), pending(R), nsteps(R);
  buffer<std::int64_t> clock(R), busy(R), in_flight(R), peak(R), wmax(R);  // wmax: highest in flight since the snapshot
  std::int64_t total = 0;
  for (int r = 0; r < R; ++r) {
    rj.p[r] = pj.p[r] = rb[r];
    nsteps.p[r] = std::int64_t(t.steps(r));
    total += nsteps.p[r];
    // the receives posted before the first compute: those of the first `look` receiving computes
    while (pending.p[r] < look && pk.p[r] < nsteps.p[r]) {
      const Run& run = RN[pj.p[r]];
      const std::uint32_t x = run.first + std::uint32_t(pa.p[r]);
      if (rch.p[x] >= 0) ++rposted.p[rch.p[x]], ++pending.p[r];
      ++pk.p[r];
      if (++pa.p[r] == run.len) {
        pa.p[r] = 0;
        if (++pq.p[r] == run.count) pq.p[r] = 0, ++pj.p[r];
      }
    }
  }

  // the snapshot a later sweep is compared with
  bool have_snap = false;
  std::int64_t lam = 0, power = 1;                // sweeps since the snapshot; how many it waits
  std::int64_t run_changes = 0, calm_since = -1;  // times a rank entered its next run
  buffer<std::int64_t> s_rq(R), s_ra(R), s_rj(R), s_phase(R), s_pj(R), s_pq(R), s_pa(R), s_pending(R), s_clock(R), s_busy(R), s_flight(R);
  buffer<std::int64_t> s_sent(C), s_consumed(C), s_rposted(C), s_time(std::size_t(C) * cap), s_cnt(std::size_t(3) * S), s_nb(S);
  buffer<std::int64_t> tmp{std::size_t(cap)};

  int finished = 0;
  for (int r = 0; r < R; ++r)
    if (nsteps.p[r] == 0) ++finished;
  std::int64_t skipped = 0;
  while (finished < R) {
    // ---- fast-forward: is the state a whole period after the snapshot?
    bool eligible = run_changes == calm_since;
    calm_since = run_changes;
    for (int r = 0; r < R && eligible; ++r)
      if (rk.p[r] < nsteps.p[r]) eligible = jumpable.p[rj.p[r]] && pj.p[r] >= rj.p[r];
    if (!eligible) {
      have_snap = false;
      power = 1;
    } else if (have_snap) {
      bool same = true;
      std::int64_t T = -1;
      for (int r = 0; r < R && same; ++r) {
        if (rk.p[r] >= nsteps.p[r]) continue;  // finished ranks stay finished
        const std::int64_t dq = rq.p[r] - s_rq.p[r];
        same = rj.p[r] == s_rj.p[r] && ra.p[r] == s_ra.p[r] && phase.p[r] == s_phase.p[r] && pa.p[r] == s_pa.p[r] &&
               pending.p[r] == s_pending.p[r] && dq > 0 && pj.p[r] - rj.p[r] == s_pj.p[r] - s_rj.p[r] &&
               (pj.p[r] == rj.p[r] ? pq.p[r] - rq.p[r] == s_pq.p[r] - s_rq.p[r] : pq.p[r] == s_pq.p[r]);
        if (same && T < 0) T = clock.p[r] - s_clock.p[r];
        same = same && clock.p[r] - s_clock.p[r] == T && T > 0;
      }
      for (int ch = 0; ch < C && same; ++ch) {
        const std::int64_t D = sent.p[ch] - s_sent.p[ch];
        same = consumed.p[ch] - s_consumed.p[ch] == D && rposted.p[ch] - s_rposted.p[ch] == D;
        for (std::int64_t i = s_consumed.p[ch]; same && i < s_sent.p[ch]; ++i)
          same = sent_time.p[std::size_t(ch) * cap + std::size_t((i + D) % cap)] - s_time.p[std::size_t(ch) * cap + std::size_t(i % cap)] == T;
      }
      for (int s = 0; s < S && same; ++s) {  // "F done before B", "B done before W" keep their answers
        const std::int64_t df = cnt.p[s] - s_cnt.p[s], dbi = cnt.p[S + s] - s_cnt.p[S + s], dw = cnt.p[2 * S + s] - s_cnt.p[2 * S + s];
        same = (dbi == 0 || dbi == df || s_cnt.p[s] == M) && (dw == 0 || dw == dbi || s_cnt.p[S + s] == M);
      }
      if (same) {
        std::int64_t K = -1;  // whole periods every rank's run (and posting cursor) still holds
        for (int r = 0; r < R; ++r) {
          if (rk.p[r] >= nsteps.p[r]) continue;
          const std::int64_t ahead = pj.p[r] == rj.p[r] ? pq.p[r] : rq.p[r];  // a parked posting cursor stays put
          const std::int64_t dq = rq.p[r] - s_rq.p[r], room = (std::int64_t(RN[rj.p[r]].count) - 1 - ahead) / dq;
          if (K < 0 || room < K) K = room;
        }
        if (K > 0) {
          for (int r = 0; r < R; ++r) {
            if (rk.p[r] >= nsteps.p[r]) continue;
            const std::int64_t dq = rq.p[r] - s_rq.p[r], dk = K * dq * std::int64_t(RN[rj.p[r]].len);
            rq.p[r] += K * dq, rk.p[r] += dk;
            if (pj.p[r] == rj.p[r]) pq.p[r] += K * dq, pk.p[r] += dk;
            clock.p[r] += K * T, busy.p[r] += K * (busy.p[r] - s_busy.p[r]);
            const std::int64_t df = in_flight.p[r] - s_flight.p[r];  // the period's highest point, K periods on
            if (df > 0 && wmax.p[r] + K * df > peak.p[r]) peak.p[r] = wmax.p[r] + K * df;
            in_flight.p[r] += K * df;
            skipped += dk;
          }
          for (int ch = 0; ch < C; ++ch) {
            const std::int64_t D = sent.p[ch] - s_sent.p[ch];
            if (D == 0) continue;
            for (std::int64_t i = consumed.p[ch]; i < sent.p[ch]; ++i) tmp.p[i - consumed.p[ch]] = sent_time.p[std::size_t(ch) * cap + std::size_t(i % cap)];
            for (std::int64_t i = consumed.p[ch]; i < sent.p[ch]; ++i)
              sent_time.p[std::size_t(ch) * cap + std::size_t((i + K * D) % cap)] = tmp.p[i - consumed.p[ch]] + K * T;
            sent.p[ch] += K * D, consumed.p[ch] += K * D, rposted.p[ch] += K * D;
          }
          for (int c = 0; c < 3 * S; ++c) cnt.p[c] += K * (cnt.p[c] - s_cnt.p[c]);
          for (int s = 0; s < S; ++s) nb.p[s] += K * (nb.p[s] - s_nb.p[s]);
        }
        have_snap = false;
      } else if (++lam == power) {
        have_snap = false, power *= 2;  // Brent: move the snapshot here, wait twice as long
      }
    }
    if (eligible && !have_snap) {
      have_snap = true;
      lam = 0;
      for (int r = 0; r < R; ++r) {
        s_rq.p[r] = rq.p[r], s_ra.p[r] = ra.p[r], s_rj.p[r] = rj.p[r], s_phase.p[r] = phase.p[r], s_pj.p[r] = pj.p[r], s_pq.p[r] = pq.p[r], s_pa.p[r] = pa.p[r];
        s_pending.p[r] = pending.p[r], s_clock.p[r] = clock.p[r], s_busy.p[r] = busy.p[r], s_flight.p[r] = in_flight.p[r];
        wmax.p[r] = in_flight.p[r];
      }
      for (int ch = 0; ch < C; ++ch) s_sent.p[ch] = sent.p[ch], s_consumed.p[ch] = consumed.p[ch], s_rposted.p[ch] = rposted.p[ch];
      for (int ch = 0; ch < C; ++ch)  // the messages in flight: the comparison reads only these
        for (std::int64_t i = consumed.p[ch]; i < sent.p[ch]; ++i)
          s_time.p[std::size_t(ch) * cap + std::size_t(i % cap)] = sent_time.p[std::size_t(ch) * cap + std::size_t(i % cap)];
      for (int c = 0; c < 3 * S; ++c) s_cnt.p[c] = cnt.p[c];
      for (int s = 0; s < S; ++s) s_nb.p[s] = nb.p[s];
    }

    // ---- one sweep: each rank runs until it blocks (as the flat proof). The rank's state lives in
    // locals while it runs: the constant evaluator pays for every indexed access.
    bool progress = false;
    for (int r = 0; r < R; ++r) {
      std::int64_t k = rk.p[r];
      const std::int64_t n = nsteps.p[r];
      if (k >= n) continue;
      std::int64_t j = rj.p[r], q = rq.p[r], a = ra.p[r], ph = phase.p[r];
      std::int64_t cj = pj.p[r], cq = pq.p[r], ca = pa.p[r], ck = pk.p[r], pend = pending.p[r];
      std::int64_t clk = clock.p[r], bsy = busy.p[r], fl = in_flight.p[r], top = peak.p[r], wm = wmax.p[r];
      const std::int64_t k0 = k, ph0 = ph;
      std::uint32_t first = RN[j].first, len = RN[j].len, count = RN[j].count;
      while (k < n) {
        const std::uint32_t x = first + std::uint32_t(a);
        if (ph == 0) {
          const RunAction& e = A[x];
          const std::int64_t mb = std::int64_t(e.mb) + q * std::int64_t(e.stride);
          const int c = ctr.p[x];
          if (mb >= lim.p[x] || mb != cnt.p[c] || mb >= cnt.p[need.p[x]]) {
            const Action act{e.op, e.stage, std::uint32_t(mb)};
            if (bad.p[x] != 0) return fail(Verdict(bad.p[x]), r, k, act);
            if (mb >= M) return fail(Verdict::foreign_action, r, k, act);
            return fail(mb < cnt.p[c] ? Verdict::duplicate_action : Verdict::out_of_order, r, k, act);
          }
          std::int64_t start = clk;
          const int ch = rch.p[x];
          if (ch >= 0) {
            if (ck <= k) return fail(Verdict::out_of_order, r, k, {is_gradient_channel(ch) ? Op::RecvB : Op::RecvF, e.stage, std::uint32_t(mb)});
            const std::int64_t idx = consumed.p[ch];
            if (sent.p[ch] <= idx) break;  // blocked until the peer sends
            const std::int64_t at = sent_time.p[std::size_t(ch) * cap + std::size_t(idx % cap)];
            if (at > start) start = at;
            consumed.p[ch] = idx + 1;
            --pend;
          }
          clk = start + cost.p[x];
          bsy += cost.p[x];
          cnt.p[c] = mb + 1;
          ++nb.p[full.p[x]];
          fl += flight.p[x];
          if (fl > top) top = fl;
          if (fl > wm) wm = fl;
          // keep `look` receiving computes posted ahead
          while (pend < look && ck < n) {
            const Run& prun = RN[cj];
            const std::uint32_t y = prun.first + std::uint32_t(ca);
            if (rch.p[y] >= 0) ++rposted.p[rch.p[y]], ++pend;
            ++ck;
            if (++ca == prun.len) {
              ca = 0;
              if (++cq == prun.count) cq = 0, ++cj;
            }
          }
          ph = 1;
        }
        const int sc = sch.p[x];
        if (sc >= 0) {
          const std::int64_t idx = sent.p[sc];
          if (wait && rposted.p[sc] <= idx) break;  // blocked until the peer posts
          sent_time.p[std::size_t(sc) * cap + std::size_t(idx % cap)] = clk;
          sent.p[sc] = idx + 1;
        }
        ph = 0;
        ++k;
        if (++a == len) {
          a = 0;
          if (++q == count) {
            q = 0, ++j, ++run_changes;
            if (k < n) first = RN[j].first, len = RN[j].len, count = RN[j].count;
          } else if (k - k0 >= yield_after && jumpable.p[j]) {
            break;  // a rank that never blocks yields between repetitions, so that its period shows
          }
        }
      }
      if (k > k0 || ph != ph0) progress = true;  // a step, or a compute whose receives are now posted
      if (k == n) ++finished;
      rk.p[r] = k, rj.p[r] = j, rq.p[r] = q, ra.p[r] = a, phase.p[r] = ph;
      pj.p[r] = cj, pq.p[r] = cq, pa.p[r] = ca, pk.p[r] = ck, pending.p[r] = pend;
      clock.p[r] = clk, busy.p[r] = bsy, in_flight.p[r] = fl, peak.p[r] = top, wmax.p[r] = wm;
    }
    if (!progress) {
      auto waits = [&](int r) {  // what rank r waits on: its send's receive, or its compute's message
        if (rk.p[r] >= nsteps.p[r]) return Action{};
        const RunAction& e = A[RN[rj.p[r]].first + ra.p[r]];
        const Op op = phase.p[r] == 1 ? (e.op == Op::F ? Op::SendF : Op::SendB) : e.op == Op::F ? Op::RecvF : Op::RecvB;
        return Action{op, e.stage, std::uint32_t(std::int64_t(e.mb) + rq.p[r] * std::int64_t(e.stride))};
      };
      for (int r = 0; r < R; ++r)
        if (rk.p[r] < nsteps.p[r]) {
          const Action a = waits(r);
          const int ps = peer_stage(a.op, a.stage, S);
          p.peer = ps >= 0 ? int(rank_of[ps]) : -1;
          if (p.peer >= 0) p.peer_action = waits(p.peer);
          return fail(Verdict::deadlock, r, rk.p[r], a);
        }
    }
  }
  // ---- every (stage, micro-batch) finished, with one kind of backward per stage
  for (int s = 0; s < S; ++s) {
    const std::int64_t f = cnt.p[s], bi = cnt.p[S + s], w = cnt.p[2 * S + s], b = nb.p[s], i = bi - b;
    const bool full = b == M && i == 0 && w == 0, split = b == 0 && i == M && w == M;
    if (f != M || !(full || split || !l.trains(s))) {
      const Op missing = f < M ? Op::F : bi < M ? (b == 0 && i > 0 ? Op::I : Op::B) : Op::W;
      const std::int64_t mb = missing == Op::F ? f : missing == Op::W ? w : bi;
      return fail(Verdict::unfinished_microbatch, l.rank_of[s], -1, {missing, std::uint16_t(s), std::uint32_t(mb < M ? mb : M)});
    }
  }
  for (int r = 0; r < R; ++r) {
    if (clock.p[r] > p.makespan) p.makespan = clock.p[r];
    p.busy[r] = busy.p[r];
    p.peak_in_flight[r] = int(peak.p[r]);
  }
  p.steps = total;
  p.simulated = total - skipped;
  return p;
}

/// Proves a compressed table with unit costs under `sends`.
constexpr Proof prove(const RunTable& t, Sends sends) { return prove(t, nullptr, sends); }

}  // namespace mpx
