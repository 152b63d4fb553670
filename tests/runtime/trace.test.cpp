// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/runtime/trace.hpp: events become Chrome trace slices (a wait before its work), and on a
// one-rank world `write` produces one trace file and the bubble line.
#include "support/rooms.hpp"
#include "support/scratch_dir.hpp"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

TEST_CASE("A recorded action with a wait becomes a wait slice, then its work", "[rooms][trace]")
{
  mpx::TraceRecorder t;
  t.record({mpx::Op::F, 1, 3}, 100, 50, 20);
  t.record({mpx::Op::SendF, 1, 3}, 150, 5, 0);
  const auto j = t.to_json(1, 0);
  REQUIRE(j.size() == 3);
  CHECK(j[0]["name"] == "wait F3");
  CHECK(j[0]["cat"] == "wait");
  CHECK(j[1]["name"] == "F3");
  CHECK(j[1]["ts"] == 120);
  CHECK(j[1]["dur"] == 30);
  CHECK(j[1]["cat"] == "compute");
  CHECK(j[2]["cat"] == "comm");
  t.clear();
  CHECK(t.events().empty());
}

TEST_CASE("write gathers the ranks' events into one trace and prints the bubbles", "[rooms][trace]")
{
  const std::string dir = test::scratch_dir("mpx-trace-room");
  auto w = test::one_rank_world<rooms::P1>();
  mpx::TraceRecorder t;
  t.record({mpx::Op::F, 0, 0}, 0, 10, 0);
  mpx::StepStats st;
  st.seconds = 1.0;
  st.compute_seconds = 0.75;
  std::ostringstream log;
  const double b = t.write(w, dir + "/t.json", 4, st, {"1F1B", 1, 4, 0.0}, log);
  CHECK(b == Approx(0.25));
  CHECK(log.str().find("mpx: bubble of step 4: measured 25% (mean over ranks), expected 0% (1F1B, p = 1, m = 4)") != std::string::npos);
  std::ifstream f(dir + "/t.json");
  const auto j = nlohmann::json::parse(f);
  CHECK(j["traceEvents"].size() == 2);  // the slice and the rank's name
  std::filesystem::remove_all(dir);
}
