// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/runtime/state_io.hpp on a one-rank world: a saved state loads back whole (parameters,
// optimizer, step, loss scaler), a crash's leftovers do not hide it, and bad directories name the fix.
#include "support/rooms.hpp"
#include "support/scratch_dir.hpp"

#include <fstream>

TEST_CASE("Saved training state loads back: parameters, optimizer, step and scaler", "[rooms][state_io]")
{
  const std::string dir = test::scratch_dir("mpx-state-io");
  auto w = test::one_rank_world<rooms::P1>();
  mpx::StageSet<rooms::P1> a(0, torch::kCPU, rooms::make, {});
  mpx::StageOptimizers oa(a, {});
  for (auto& p : a.parameters(0)) p.mutable_grad() = torch::ones_like(p);
  oa.step(1e-2);
  std::filesystem::create_directories(dir + "/ckpt.partial");  // a crash's leftovers: replaced
  mpx::save_training_state(w, dir + "/ckpt", a, oa, {7, 512.0, 2, 3});
  CHECK(std::filesystem::exists(dir + "/ckpt/stage0.safetensors"));
  CHECK(std::filesystem::exists(dir + "/ckpt/stage0.optimizer.pt"));
  CHECK(!std::filesystem::exists(dir + "/ckpt.partial"));

  mpx::StageSet<rooms::P1> b(0, torch::kCPU, rooms::make, {});
  mpx::StageOptimizers ob(b, {});
  const auto t = mpx::load_training_state(dir + "/ckpt", b, ob, {});
  CHECK(t.step == 7);
  CHECK(t.loss_scale == 512.0);
  CHECK(t.skipped == 2);
  CHECK(t.good_steps == 3);
  for (std::size_t i = 0; i < a.parameters(0).size(); ++i) CHECK(torch::equal(a.parameters(0)[i], b.parameters(0)[i]));

  using Catch::Contains;
  CHECK_THROWS_WITH(mpx::load_training_state(dir + "/none", b, ob, {}), Contains("no checkpoint at") && Contains("trainer.json missing"));
  std::ofstream(dir + "/ckpt/trainer.json") << "{ not json";
  CHECK_THROWS_WITH(mpx::load_training_state(dir + "/ckpt", b, ob, {}), Contains("trainer.json is corrupt"));
  std::ofstream(dir + "/ckpt/trainer.json") << R"({"step": 7, "fingerprint": "1"})";
  CHECK_THROWS_WITH(mpx::load_training_state(dir + "/ckpt", b, ob, {}), Contains("saved by a different pipeline"));
  std::filesystem::remove_all(dir);
}
