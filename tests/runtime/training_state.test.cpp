// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/runtime/training_state.hpp: a pipeline's stages as a checkpoint sees them. (Saved and loaded:
// checkpoint/save.test.cpp, load.test.cpp, manifest.test.cpp; across layouts and degrees on real ranks:
// runtime.test.cpp and tp.test.cpp.)
#include "runtime/checkpoint/checkpoint_test.hpp"

#include <nlohmann/json.hpp>

using namespace checkpoint_test;  // Saved, flip_byte, fs, Contains

TEST_CASE("A rank's stages as a checkpoint sees them: tensors by name, shard, optimizer", "[rooms][training_state]")
{
  Saved a;
  const auto stages = mpx::checkpoint_stages(a.stages, a.optimizers);
  REQUIRE(stages.size() == 1);
  const mpx::CheckpointStage& s = stages[0];
  CHECK(s.index == 0);
  CHECK(s.shard.empty());  // degree 1
  CHECK(s.tp_size == 1);
  CHECK(s.cuts.empty());
  CHECK(s.optimizer == &a.optimizers.at(0));
  CHECK(s.tensors.size() == a.stages.state(0).size());
  for (auto& [name, t] : s.tensors) CHECK(t.is_same(a.stages.state(0).at(name)));  // the module's own tensors, not copies
  CHECK(s.global_names == a.stages.global_names(0));
}
