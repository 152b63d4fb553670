// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/run_facts.hpp: what the run proof reads of each action (counters, channels, costs, in-flight
// steps, invalid actions) and which runs it may fast-forward through.
#include "support/catch.hpp"

#include <mpx/run_facts.hpp>
#include <mpx/schedule.hpp>

using namespace mpx;

TEST_CASE("Each action's facts: its counters, channels, cost and in-flight step", "[run_facts]")
{
  const RunTable t = OneFOneB::runs(Layout::looped(2, 2, 8));
  const detail::RunFacts f = detail::run_facts(t, nullptr);
  const int S = 2;
  for (std::size_t i = 0; i < t.actions.size(); ++i) {
    const RunAction& e = t.actions[i];
    CAPTURE(i, op_name(e.op), e.stage);
    CHECK(f.bad.p[i] == 0);
    CHECK(f.lim.p[i] == 8);
    CHECK(f.ctr.p[i] == (e.op == Op::F ? 0 : 1) * S + e.stage);
    CHECK(f.need.p[i] == (e.op == Op::F ? 3 * S : e.stage));  // a backward needs its forward's counter
    CHECK(f.rch.p[i] == recv_channel(e.op, e.stage, S));
    CHECK(f.sch.p[i] == send_channel(e.op, e.stage, S));
    CHECK(f.cost.p[i] == cost_of(e.op));
    CHECK(f.flight.p[i] == (e.op == Op::F ? 1 : -1));
    CHECK(f.full.p[i] == (e.op == Op::B ? e.stage : S));
  }
  // declared costs replace the units
  StageCosts c;
  c.forward[0] = 7, c.backward[0] = 11, c.forward[1] = 3, c.backward[1] = 5;
  const detail::RunFacts g = detail::run_facts(t, &c);
  for (std::size_t i = 0; i < t.actions.size(); ++i) CHECK(g.cost.p[i] == c.of(t.actions[i].op, t.actions[i].stage));
}

TEST_CASE("Runs that repeat with consecutive micro-batches may be jumped, others not", "[run_facts]")
{
  const RunTable t = OneFOneB::runs(Layout::looped(4, 4, 64));
  const detail::RunFacts f = detail::run_facts(t, nullptr);
  int jumpable = 0;
  for (std::uint32_t j = 0; j < t.begin[4]; ++j) {
    CAPTURE(j, t.runs[j].count, t.runs[j].len);
    if (t.runs[j].count == 1) CHECK(f.jumpable.p[j] == 0);  // nothing to jump
    jumpable += f.jumpable.p[j];
  }
  CHECK(jumpable >= 4);  // each rank's steady state
  // a forward-only stage given a backward is invalid where it stands, and its run is not jumped
  detail::run_builder b(Layout::looped(2, 2, 4), 1);
  b.repeat(0, {{Op::F, 0, 0}, {Op::B, 0, 0}}, 4);
  b.repeat(1, {{Op::F, 1, 0}, {Op::B, 1, 0}}, 4);
  RunTable bad = b.finish();
  bad.layout.forward_only = 1;  // after the builder, which would drop that backward
  const detail::RunFacts h = detail::run_facts(bad, nullptr);
  CHECK(h.bad.p[bad.runs[0].first + 1] == int(Verdict::forward_only_backward));
  CHECK(h.lim.p[bad.runs[0].first + 1] == -1);
  CHECK(h.jumpable.p[0] == 0);
  CHECK(h.jumpable.p[1] == 1);
}
