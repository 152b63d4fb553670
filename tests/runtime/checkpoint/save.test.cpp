// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/runtime/checkpoint/save.hpp on a one-rank world: a saved checkpoint loads back whole
// (parameters, optimizer, step, scaler, random generator), `latest` names the newest, an interrupted save's
// leftovers are replaced, and old checkpoints are pruned — but not a longer earlier run's later ones.
#include "runtime/checkpoint/checkpoint_test.hpp"

#include <nlohmann/json.hpp>

using namespace checkpoint_test;  // Saved, flip_byte, fs, Contains

TEST_CASE("A checkpoint loads back (parameters, optimizer, step, scaler, random generator), latest names it, old ones are pruned", "[rooms][save]")
{
  const std::string root = test::scratch_dir("mpx-state-io") + "/ckpt";
  auto w = test::one_rank_world<rooms::P1>();
  Saved a;
  fs::create_directories(root + "/step-00000007.partial");  // a crash's leftovers: replaced
  torch::manual_seed(123);
  const auto rng = torch::rand({4});  // what the generator draws next after the save
  torch::manual_seed(123);
  mpx::save_training_state(w, root, a.stages, a.optimizers, {7, 512.0, 2, 3});
  const auto after = torch::rand({4});
  CHECK(torch::equal(rng, after));
  for (auto f : {"stage0.safetensors", "stage0.optimizer.safetensors", "rank0.rng.safetensors", "trainer.json", "manifest.json"})
    CHECK(fs::exists(root + "/step-00000007/" + f));
  CHECK(!fs::exists(root + "/step-00000007.partial"));
  std::ifstream latest(root + "/latest");
  std::string name;
  latest >> name;
  CHECK(name == "step-00000007");

  Saved b;
  torch::manual_seed(999);
  const auto t = mpx::load_training_state(w, root, b.stages, b.optimizers, {});
  CHECK(t.step == 7);
  CHECK(t.loss_scale == 512.0);
  CHECK(t.skipped == 2);
  CHECK(t.good_steps == 3);
  for (std::size_t i = 0; i < a.stages.parameters(0).size(); ++i) CHECK(torch::equal(a.stages.parameters(0)[i], b.stages.parameters(0)[i]));
  CHECK(torch::equal(torch::rand({4}), rng));  // the generator continues where the saved run's did

  // keep = 2: a third save prunes the oldest; a step dir itself also loads
  mpx::save_training_state(w, root, a.stages, a.optimizers, {8, 1, 0, 0});
  mpx::save_training_state(w, root, a.stages, a.optimizers, {9, 1, 0, 0});
  CHECK(!fs::exists(root + "/step-00000007"));
  CHECK(fs::exists(root + "/step-00000008"));
  CHECK(mpx::load_training_state(w, root, b.stages, b.optimizers, {}).step == 9);
  // a shorter run into the same root: latest is its step; the longer run's later checkpoints stay
  mpx::save_training_state(w, root, a.stages, a.optimizers, {2, 1, 0, 0});
  CHECK(mpx::load_training_state(w, root, b.stages, b.optimizers, {}).step == 2);
  CHECK(fs::exists(root + "/step-00000009"));
  CHECK(mpx::load_training_state(w, root + "/step-00000008", b.stages, b.optimizers, {}).step == 8);
  mpx::save_training_state(w, root, a.stages, a.optimizers, {3, 1, 0, 0});
  mpx::save_training_state(w, root, a.stages, a.optimizers, {4, 1, 0, 0});
  CHECK(!fs::exists(root + "/step-00000002"));  // pruned: the two newest up to step 4 are 3 and 4
  CHECK(fs::exists(root + "/step-00000003"));
  CHECK_THROWS_WITH(mpx::load_training_state(w, root + "/none", b.stages, b.optimizers, {}), Contains("no checkpoint at"));
  fs::remove_all(fs::path(root).parent_path());
}


