// SPDX-License-Identifier: Apache-2.0
// Tests for examples/moondream/speeds.hpp: declared speeds parsed and refused by name, the flags' consistency, a
// balanced layout cut for a slow device, the speeds a re-plan wrote read back on resume (and a bad file named),
// the watch of a plan. (The probe over real ranks and the re-plan itself: moondream.train.rebalance.)
#include "../../../tests/support/catch_torch.hpp"
#include "batches.hpp"
#include "../speeds.hpp"

#include <torch/csrc/distributed/c10d/HashStore.hpp>  // c10d::HashStore

#include <filesystem>
#include <fstream>

namespace
{
const moondream::Workload speeds_shapes{4, 2, 20, 3};  // 4 samples of 2 crops and 20 tokens (3 answer tokens)
}  // namespace

TEST_CASE("Declared device speeds: one positive number per device of the layout, anything else named", "[moondream][speeds]")
{
  CHECK(moondream::parse_speeds("1,0.5", 2, "2b") == std::vector<double>{1.0, 0.5});
  CHECK(moondream::parse_speeds("2,2,1,1", 4, "4b") == std::vector<double>{2, 2, 1, 1});
  CHECK_THROWS_WITH(moondream::parse_speeds("1,0.5", 4, "4b"), Catch::Contains("gives 2 speeds; layout 4b has 4 devices"));
  CHECK_THROWS_WITH(moondream::parse_speeds("1,fast", 2, "2b"), Catch::Contains("'fast' is not a positive number"));
  CHECK_THROWS_WITH(moondream::parse_speeds("1,0", 2, "2b"), Catch::Contains("'0' is not a positive number"));
  CHECK_THROWS_WITH(moondream::parse_speeds("1,", 2, "2b"), Catch::Contains("'' is not a positive number"));
  CHECK_THROWS_WITH(moondream::parse_speeds("1,0.5x", 2, "2b"), Catch::Contains("'0.5x'"));
}

TEST_CASE("The rebalancing flags name what they need: a pipeline, whole devices, a balanced layout, --save and restarts", "[moondream][speeds]")
{
  moondream::Options o;
  o.layout = "1";
  o.device_speeds = "1,1";
  CHECK_THROWS_WITH(moondream::check_speeds(o), Catch::Contains("layout 1 is one process"));
  o.layout = "2";
  o.device_speeds = "1,1,1";
  CHECK_THROWS_WITH(moondream::check_speeds(o), Catch::Contains("layout 2 has 2 devices"));
  o.device_speeds = "probe";
  CHECK_NOTHROW(moondream::check_speeds(o));
  o.rebalance = "report";
  o.tp = 2;
  CHECK_THROWS_WITH(moondream::check_speeds(o), Catch::Contains("use --tp 1 --vision-tp 1"));
  o.tp = 1;
  CHECK_NOTHROW(moondream::check_speeds(o));
  o.rebalance = "on";
  CHECK_THROWS_WITH(moondream::check_speeds(o), Catch::Contains("use --layout 2b or 4b, or --rebalance report"));
  o.layout = "2b";
  CHECK_THROWS_WITH(moondream::check_speeds(o), Catch::Contains("give --save DIR"));
  o.save = "/tmp/x";
  CHECK_THROWS_WITH(moondream::check_speeds(o), Catch::Contains("give --max-restarts 1 or more"));
  o.max_restarts = 1;
  CHECK_NOTHROW(moondream::check_speeds(o));
}

TEST_CASE("A balanced layout on a slow first device gives it less of the model, and predicts a shorter step than the equal cut there", "[moondream][speeds]")
{
  const auto c = moondream::load_config("medium");
  for (const char* schedule : {"gpipe", "1f1b", "zbh1"}) {
    CAPTURE(schedule);
    const auto equal = moondream::plan_of("2b", schedule, c, speeds_shapes, 4, false);
    const auto slow = moondream::plan_of("2b", schedule, c, speeds_shapes, 4, false, true, {0.5, 1.0});
    CHECK(slow.part[1] < equal.part[1]);  // fewer pieces on slot 0
    // the equal cut on these devices, predicted in the same (fastest device's) time
    const auto equal_there = moondream::plan_of("2b", schedule, c, speeds_shapes, 4, false, true, {0.5, 1.0}, equal.part);
    CHECK(slow.predicted.makespan < equal_there.predicted.makespan);
    CHECK(moondream::describe(slow).find("devices' speeds 0.5, 1; predicted step ") != std::string::npos);
    CHECK_THROWS_WITH(moondream::plan_of("2b", schedule, c, speeds_shapes, 4, false, true, {1.0}), Catch::Contains("1 device speeds for layout 2b of 2 devices"));
  }
  // the watch of a plan predicts each slot's compute from the proof under its speeds
  const auto slow = moondream::plan_of("2b", "1f1b", c, speeds_shapes, 4, false, true, {0.5, 1.0});
  auto watch = moondream::watch_of(slow, moondream::Speeds{{0.5, 1.0}, "declared"});
  std::vector<double> as_planned{double(slow.predicted.busy[0]) * 1e-9, double(slow.predicted.busy[1]) * 1e-9};
  for (int i = 0; i < 5; ++i) CHECK_FALSE(watch.observe(as_planned));
}

TEST_CASE("Speeds come from the re-plan's file when resuming under --rebalance on, then from the flag, and a bad file is named", "[moondream][speeds]")
{
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("moondream_speeds_test_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  moondream::Options o;
  o.layout = "2b";
  o.save = dir.string();
  o.rebalance = "on";
  auto store = c10::make_intrusive<c10d::HashStore>();
  const mpx::Env env;
  const std::vector<int> slot_of{0, 1};
  CHECK(moondream::device_speeds(o, env, *store, slot_of, 2, true).per_slot.empty());  // no file, none declared: equal
  o.device_speeds = "1,0.25";
  CHECK(moondream::device_speeds(o, env, *store, slot_of, 2, true).per_slot == std::vector<double>{1, 0.25});
  moondream::write_speeds_file(o, moondream::Speeds{{0.5, 1.0}, "measured", {1.4, 1.2}, ""}, 7, "slot 0 computes at 0.50x");
  const auto s = moondream::device_speeds(o, env, *store, slot_of, 2, true);
  CHECK(s.per_slot == std::vector<double>{0.5, 1.0});
  CHECK(s.source.find("measured by the run at step 7") != std::string::npos);
  CHECK(s.scale.vision_forward == 1.0);  // the file's cost scale only under --costs measured
  o.costs = "measured";
  CHECK(moondream::device_speeds(o, env, *store, slot_of, 2, true).scale.vision_forward == 1.4);
  o.costs = "flops";
  // a fresh run (not resuming) plans with the flag, not with an old run's file
  CHECK(moondream::device_speeds(o, env, *store, slot_of, 2, false).per_slot == std::vector<double>{1, 0.25});
  // a file for another layout, or not a speeds file, stops with its name and the fix
  CHECK_THROWS_WITH(moondream::device_speeds(o, env, *store, {0, 1, 2, 3}, 4, true), Catch::Contains("holds 2 speeds for a layout of 4 devices"));
  std::ofstream(dir / "speeds.json") << "{\"speeds\": \"fast\"}";
  CHECK_THROWS_WITH(moondream::device_speeds(o, env, *store, slot_of, 2, true), Catch::Contains("is not a speeds file") && Catch::Contains("delete it"));
  fs::remove_all(dir);
}

TEST_CASE("Measured costs are timed on every rank and shared, the fastest rank's kept, and the plan scales the encoder by them", "[moondream][speeds]")
{
  const auto c = moondream::load_config("tiny");
  const auto b = moondream::testing::two_samples(c);
  const auto w = moondream::workload_of({b});
  // every rank's measurement shared through the store (one rank here), the fastest rank's kept, two digits
  moondream::Options o;
  o.config = "tiny";
  o.layout = "2b";
  o.costs = "measured";
  o.freeze_vision = "on";
  auto store = c10::make_intrusive<c10d::HashStore>();
  const auto s = moondream::resolve_speeds(o, mpx::Env{}, *store, {0, 1}, 2, false, c, b);
  CHECK(s.scale.vision_forward > 0);
  CHECK(s.scale.vision_forward == std::round(s.scale.vision_forward * 100) / 100);
  CHECK(s.scale_source.find("rank 0's (the fastest) kept") != std::string::npos);
  const auto plan = moondream::plan_for(o, c, w, s);
  if (s.scale.vision_forward != 1.0) CHECK(moondream::describe(plan).find("encoder at ") != std::string::npos);
}
