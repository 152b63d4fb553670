// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/table_view.hpp: a pipeline's table seen through TableView gives the same action lists,
// proof and timeline as the table itself, for small tables (viewed in static storage) and large ones
// (built at start-up).
#include "support/archetypes.hpp"
#include "support/catch.hpp"

#include <mpx/print.hpp>

#include <sstream>

using namespace mpx;
using namespace archetypes;

namespace
{
template <class Sched, int M>
using Two = Pipeline<Stage<Block, CPU<0>>, Stage<Block, CPU<1>>, Schedule<Sched>, Microbatches<M>>;
using Looped = Pipeline<Stage<Block, CPU<0>>, Stage<Block, CPU<1>>, Stage<Block, CPU<0>>, Stage<Block, CPU<1>>,
                        Schedule<Interleaved1F1B>, Microbatches<4>>;
using FrozenFirst = Pipeline<Stage<Block, CPU<0>, Frozen>, Stage<Block, CPU<1>>, Stage<Block, CPU<2>>, Microbatches<5>>;
using Large = Two<OneFOneB, 1100>;  // 4,400 steps: above detail::static_table_steps, built at start-up

template <class P>
void same_as_the_table()
{
  const Table t = P::make_table();
  const TableView v = table_view<P>();
  REQUIRE(v.num_ranks() == t.num_ranks());
  REQUIRE(v.steps.size() == t.steps.size());
  for (int r = 0; r < t.num_ranks(); ++r) {
    const auto got = actions_of(v, r), want = expand(t, r);
    REQUIRE(got.size() == want.size());
    for (std::size_t k = 0; k < want.size(); ++k) {
      CHECK(got[k].op == want[k].op);
      CHECK(got[k].stage == want[k].stage);
      CHECK(got[k].mb == want[k].mb);
    }
  }
  const Proof a = proof_of(v), b = prove(t);
  CHECK(a.ok());
  CHECK(a.makespan == b.makespan);
  CHECK(a.bubble() == b.bubble());
  for (int r = 0; r < t.num_ranks(); ++r) CHECK(a.peak_in_flight[r] == b.peak_in_flight[r]);
  std::ostringstream x, y;
  print_timeline(x, v);
  print_timeline(y, t);
  CHECK(x.str() == y.str());
}
}  // namespace

TEST_CASE("A table's view gives its action lists, proof and timeline: every built-in schedule", "[table_view]")
{
  same_as_the_table<Two<GPipe, 4>>();
  same_as_the_table<Two<OneFOneB, 4>>();
  same_as_the_table<Two<ZBH1, 6>>();
  same_as_the_table<Looped>();
  same_as_the_table<FrozenFirst>();
}

TEST_CASE("A large table is built once at start-up and viewed there", "[table_view]")
{
  STATIC_REQUIRE(Large::num_steps > detail::static_table_steps);
  same_as_the_table<Large>();
  CHECK(table_view<Large>().steps.data() == table_view<Large>().steps.data());  // built once, kept
}

TEST_CASE("A small table is viewed where the compile-time table lies", "[table_view]")
{
  using P = Two<OneFOneB, 4>;
  CHECK(table_view<P>().steps.data() == table_v<P>.steps.data());
}
