// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file run_facts.hpp
/// What the proof of a compressed table (run_proof.hpp) reads of each of its actions, computed once before
/// the simulation: what does not change with the repetition of the action's run — the counter it advances,
/// the counter that must be past its micro-batch, its receive and send channels, its cost, whether it keeps
/// a micro-batch in flight, and a verdict if it is invalid where it stands — and, per run, whether the
/// simulation may fast-forward through it. Internal.

#include <mpx/action.hpp>    // mpx::Layout, mpx::StageCosts, mpx::cost_of, mpx::is_compute, mpx::detail::buffer
#include <mpx/channels.hpp>  // mpx::recv_channel, mpx::send_channel
#include <mpx/proof.hpp>     // mpx::Verdict
#include <mpx/runs.hpp>      // mpx::RunTable, mpx::Run, mpx::RunAction

#include <cstdint>  // std::int64_t, std::uint8_t

namespace mpx::detail
{

/// Per action of a `RunTable` (indexed like `RunTable::actions`), and per run (like `RunTable::runs`).
struct RunFacts
{
  buffer<int> ctr;     ///< the counter it advances: kind * S + stage, kinds F, B-or-I, W
  buffer<int> need;    ///< the counter that must be past its micro-batch (3S: none)
  buffer<int> rch;     ///< the channel it receives on (-1: none); 2b: activations b -> b+1, 2b+1: gradients
  buffer<int> sch;     ///< the channel it sends on (-1: none)
  buffer<int> bad;     ///< the verdict if it is invalid where it stands (0: valid)
  buffer<int> flight;  ///< +1: a forward kept for a backward, -1: a backward (or W) that ends one, 0: neither
  buffer<int> full;    ///< its stage if it is a full backward (B), else S (a counter nobody reads)
  buffer<std::int64_t> cost;
  buffer<std::int64_t> lim;       ///< M, or -1 for an invalid action (one comparison checks both)
  buffer<std::uint8_t> jumpable;  ///< per run: it may be fast-forwarded through (see `run_facts`)
};

/// The facts of `t`'s actions under `costs` (unit costs when null). A run may be fast-forwarded through
/// when it repeats, its actions are valid with every repetition's micro-batch in range, and each entry's
/// stride is the count of its (op, stage) in the pattern, whose entries carry consecutive micro-batches
/// (the form's rule). The runs' bounds must have been checked.
constexpr RunFacts run_facts(const RunTable& t, const StageCosts* costs)
{
  const Layout& l = t.layout;
  const int S = l.stages, M = l.microbatches, R = l.ranks;
  const RunAction* A = t.actions.data();
  const Run* RN = t.runs.data();
  const std::uint32_t* rb = t.begin.data();
  const std::size_t NA = t.actions.size(), NR = rb[R];
  RunFacts f{buffer<int>(NA), buffer<int>(NA), buffer<int>(NA), buffer<int>(NA), buffer<int>(NA), buffer<int>(NA),
             buffer<int>(NA), buffer<std::int64_t>(NA), buffer<std::int64_t>(NA), buffer<std::uint8_t>(NR)};
  for (int r = 0; r < R; ++r)
    for (std::uint32_t j = rb[r]; j < rb[r + 1]; ++j)
      for (std::uint32_t i = RN[j].first; i < RN[j].first + RN[j].len; ++i) {
        const RunAction& e = A[i];
        const int s = e.stage;
        f.bad.p[i] = !is_compute(e.op)                   ? int(Verdict::bad_shape)
                     : (s >= S || l.rank_of[s] != r)    ? int(Verdict::foreign_action)
                     : e.op != Op::F && !l.trains(s)    ? int(Verdict::forward_only_backward)
                                                        : 0;
        f.lim.p[i] = f.bad.p[i] ? -1 : M;
        f.rch.p[i] = f.sch.p[i] = -1;
        if (f.bad.p[i]) continue;
        const int kind = e.op == Op::F ? 0 : e.op == Op::W ? 2 : 1;
        f.ctr.p[i] = kind * S + s;
        f.need.p[i] = kind == 0 ? 3 * S : (kind - 1) * S + s;
        f.flight.p[i] = e.op == Op::F ? (l.trains(s) ? 1 : 0) : (e.op == Op::B || e.op == Op::W) ? -1 : 0;
        f.full.p[i] = e.op == Op::B ? s : S;
        f.rch.p[i] = recv_channel(e.op, s, S);
        f.sch.p[i] = send_channel(e.op, s, S, l.forward_only);
        f.cost.p[i] = costs ? costs->of(e.op, s) : cost_of(e.op);
      }
  buffer<std::int64_t> seen(std::size_t(3) * S), next(std::size_t(3) * S);
  for (std::uint32_t j = 0; j < NR; ++j) {
    const Run& run = RN[j];
    bool ok = run.count > 1;
    for (std::uint32_t i = run.first; ok && i < run.first + run.len; ++i) {
      ok = f.bad.p[i] == 0 && std::uint64_t(A[i].mb) + std::uint64_t(run.count - 1) * A[i].stride < std::uint64_t(M);
      if (!ok) break;
      const int c = f.ctr.p[i];
      if (seen.p[c] == 0) next.p[c] = A[i].mb;
      ok = A[i].mb == next.p[c];
      ++seen.p[c], ++next.p[c];
    }
    for (std::uint32_t i = run.first; ok && i < run.first + run.len; ++i) ok = std::int64_t(A[i].stride) == seen.p[f.ctr.p[i]];
    for (std::uint32_t i = run.first; i < run.first + run.len; ++i)
      if (f.bad.p[i] == 0) seen.p[f.ctr.p[i]] = 0;
    f.jumpable.p[j] = ok;
  }
  return f;
}

}  // namespace mpx::detail
