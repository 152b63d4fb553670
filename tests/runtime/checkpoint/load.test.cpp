// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/runtime/checkpoint/load.hpp on a one-rank world: a model of another shape or dtype is refused
// with the differences listed, and a cast is taken when asked for.
#include "runtime/checkpoint/checkpoint_test.hpp"

#include <nlohmann/json.hpp>

using namespace checkpoint_test;  // Saved, flip_byte, fs, Contains

TEST_CASE("A model of another shape or dtype is refused with the differences listed", "[rooms][load]")
{
  const std::string root = test::scratch_dir("mpx-state-model") + "/ckpt";
  auto w = test::one_rank_world<rooms::P1>();
  Saved a;
  mpx::save_training_state(w, root, a.stages, a.optimizers, {3, 1, 0, 0});
  Saved b;
  auto state = b.stages.state(0);
  const std::string first = state.begin()->first;
  {
    torch::NoGradGuard ng;
    state.begin()->second.set_data(state.begin()->second.data().to(torch::kDouble));  // another dtype
  }
  CHECK_THROWS_WITH(mpx::load_training_state(w, root, b.stages, b.optimizers, {}),
                    Contains("stage0.safetensors") && Contains("other dtypes: " + first + " (saved Float, the model Double)") &&
                        Contains("allow_cast"));
  mpx::CheckpointOptions cast;
  cast.allow_cast = true;
  CHECK(mpx::load_training_state(w, root, b.stages, b.optimizers, {}, cast).step == 3);
  {
    torch::NoGradGuard ng;
    state.begin()->second.set_data(torch::zeros({3, 3}));  // another shape
  }
  CHECK_THROWS_WITH(mpx::load_training_state(w, root, b.stages, b.optimizers, {}),
                    Contains("does not match this model") && Contains("other shapes: " + first + " (saved ["));
  fs::remove_all(fs::path(root).parent_path());
}

