// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/runs.hpp: the run tables of the built-in schedules expand to the tables spelled out step by
// step, and their proof (run_proof.hpp) agrees with the flat proof in every number.
#include "support/catch.hpp"

#include <mpx/run_proof.hpp>
#include <mpx/schedule.hpp>

#include <string>
#include <utility>
#include <vector>

using namespace mpx;

namespace
{
// A flat table sized for `per_stage` computes per (stage, micro-batch), ranks' slices in order; `put`
// appends to rank r's slice.
struct table_builder
{
  Table t;
  std::vector<std::uint32_t> cursor;
  table_builder(const Layout& l, int per_stage) : t(l, std::size_t(l.stages) * l.microbatches * per_stage), cursor(std::size_t(l.ranks))
  {
    std::vector<std::uint32_t> count(std::size_t(l.ranks));
    for (int s = 0; s < l.stages; ++s) count[l.rank_of[s]] += std::uint32_t(l.microbatches * per_stage);
    std::uint32_t at = 0;
    for (int r = 0; r < l.ranks; ++r) t.begin.p[r] = cursor[std::size_t(r)] = at, at += count[std::size_t(r)];
    t.begin.p[l.ranks] = at;
  }
  void put(int r, Op op, int s, int mb) { t.steps.p[cursor[std::size_t(r)]++] = Step{op, std::uint16_t(s), std::uint32_t(mb), 0}; }
  Table finish(int lookahead)
  {
    detail::post_receives(t, lookahead);
    return std::move(t);
  }
};

// The schedules spelled out step by step (the definitions the run tables must expand to).
Table gpipe_steps(const Layout& l)
{
  table_builder b(l, 2);
  for (int s = 0; s < l.stages; ++s) {
    for (int m = 0; m < l.microbatches; ++m) b.put(l.rank_of[s], Op::F, s, m);
    for (int m = 0; m < l.microbatches; ++m) b.put(l.rank_of[s], Op::B, s, m);
  }
  return b.finish(3);  // GPipe posts three receiving computes ahead (its receiving computes run back to back)
}
Table one_f_one_b_steps(const Layout& l)
{
  table_builder b(l, 2);
  const int m = l.microbatches;
  for (int s = 0; s < l.stages; ++s) {
    const int r = l.rank_of[s], warmup = std::min(l.stages - s - 1, m);
    for (int i = 0; i < warmup; ++i) b.put(r, Op::F, s, i);
    for (int i = 0; i < m - warmup; ++i) b.put(r, Op::F, s, warmup + i), b.put(r, Op::B, s, i);
    for (int i = m - warmup; i < m; ++i) b.put(r, Op::B, s, i);
  }
  return b.finish(1);
}
Table interleaved_steps(const Layout& l)
{
  table_builder b(l, 2);
  const int p = l.ranks, v = l.stages / l.ranks, m = l.microbatches, total = m * v, pv = p * v;
  auto chunk_f = [&](int k, int r) { return ((k % pv) / p) * p + r; };
  auto chunk_b = [&](int k, int r) { return (v - 1 - (k % pv) / p) * p + r; };
  auto mb = [&](int k) { return (k / pv) * p + k % p; };
  for (int r = 0; r < p; ++r) {
    const int w = (p - r - 1) * 2 + (v - 1) * p, warmup = m == p ? total : std::min(w, total);
    for (int k = 0; k < warmup; ++k) b.put(r, Op::F, chunk_f(k, r), mb(k));
    for (int i = 0; i < total - warmup; ++i) b.put(r, Op::F, chunk_f(warmup + i, r), mb(warmup + i)), b.put(r, Op::B, chunk_b(i, r), mb(i));
    for (int k = total - warmup; k < total; ++k) b.put(r, Op::B, chunk_b(k, r), mb(k));
  }
  return b.finish(2);
}
Table zbh1_steps(const Layout& l)  // the zero-bubble paper's handcrafted ZB-H1
{
  table_builder b(l, 3);
  const int p = l.stages, m = l.microbatches;
  for (int s = 0; s < p; ++s) {
    const int r = l.rank_of[s], w = std::min(p - s, m);
    for (int i = 0; i < w; ++i) b.put(r, Op::F, s, i);
    for (int k = 0; k < m; ++k) {
      b.put(r, Op::I, s, k);
      if (k >= s) b.put(r, Op::W, s, k - s);
      if (w + k < m) b.put(r, Op::F, s, w + k);
    }
    for (int k = std::max(m - s, 0); k < m; ++k) b.put(r, Op::W, s, k);
  }
  return b.finish(1);
}

bool same_table(const Table& a, const Table& b)
{
  if (a.num_ranks() != b.num_ranks()) return false;
  for (int r = 0; r <= a.num_ranks(); ++r)
    if (a.begin[r] != b.begin[r] || (r < a.num_ranks() && a.post_begin[r] != b.post_begin[r])) return false;
  for (std::size_t i = 0; i < a.begin[a.num_ranks()]; ++i) {
    const Step &x = a.steps[i], &y = b.steps[i];
    if (x.op != y.op || x.stage != y.stage || x.mb != y.mb || x.post_end != y.post_end) return false;
  }
  return true;
}

std::string differences(const Proof& a, const Proof& b)
{
  std::string d;
  if (a.verdict != b.verdict) d += " verdict " + std::to_string(int(a.verdict)) + "/" + std::to_string(int(b.verdict));
  if (a.rank != b.rank || a.step != b.step) d += " at " + std::to_string(a.rank) + ":" + std::to_string(a.step) + "/" + std::to_string(b.rank) + ":" + std::to_string(b.step);
  if (!(a.action == b.action)) d += " action";
  if (a.makespan != b.makespan) d += " makespan " + std::to_string(a.makespan) + "/" + std::to_string(b.makespan);
  for (int r = 0; r < a.ranks; ++r) {
    if (a.busy[r] != b.busy[r]) d += " busy@" + std::to_string(r);
    if (a.peak_in_flight[r] != b.peak_in_flight[r]) d += " peak@" + std::to_string(r);
  }
  return d;
}
}  // namespace

TEST_CASE("Run tables expand to the schedules spelled out step by step, and prove the same", "[runs][proof]")
{
  int cases = 0;
  for (int p : {1, 2, 3, 4, 5, 8, 16})
    for (int m : {1, 2, 3, 4, 5, 7, 8, 16, 33, 64, 200}) {
      const Layout l = Layout::looped(p, p, m);
      for (int which = 0; which < 3; ++which) {
        const RunTable rt = which == 0 ? GPipe::runs(l) : which == 1 ? OneFOneB::runs(l) : ZBH1::runs(l);
        const Table t = to_table(rt);
        INFO((which == 0 ? "GPipe" : which == 1 ? "1F1B" : "ZB-H1") << " p=" << p << " m=" << m);
        CHECK(same_table(t, which == 0 ? gpipe_steps(l) : which == 1 ? one_f_one_b_steps(l) : zbh1_steps(l)));
        const Proof flat = prove(t), runs = prove(rt);
        CHECK(flat.ok());
        CHECK(differences(flat, runs) == "");
        CHECK(runs.steps == flat.steps);
        // warm-up, steady, drain per stage (ZB-H1: warm-up, three I/W/F patterns of which one that repeats once is spelled out, closing Ws)
        CHECK(rt.runs.size() <= std::size_t((which == 2 ? 11 : 3) * p));
        ++cases;
      }
      for (int v : {1, 2, 3}) {
        if (m % p != 0 || (p == 1 && v > 1)) continue;
        const Layout li = Layout::looped(p, p * v, m);
        const RunTable rt = Interleaved1F1B::runs(li);
        INFO("interleaved v=" << v << " p=" << p << " m=" << m);
        CHECK(same_table(to_table(rt), interleaved_steps(li)));
        const Proof flat = prove(to_table(rt)), runs = prove(rt);
        CHECK(flat.ok());
        CHECK(differences(flat, runs) == "");
        ++cases;
      }
    }
  CHECK(cases > 220);
}
