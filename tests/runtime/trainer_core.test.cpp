// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/runtime/trainer_core.hpp on a one-rank world: a step of the compiled trainer body over a
// typed stage set and walk is plain LibTorch's backward of the micro-batches then the stage's AdamW (mpx's
// one-pass FusedAdamW, its numerics tested in optim/); the step order follows the options; save and load round-trip the step count.
#include "support/rooms.hpp"
#include "support/scratch_dir.hpp"

TEST_CASE("A TrainerCore step is the micro-batches' backward then the stage's AdamW", "[rooms][trainer_core]")
{
  auto w = test::one_rank_world<rooms::P1>();
  mpx::TrainOptions o;
  o.lr = mpx::WarmupCosine{1e-2, 0, 10, 1.0};
  o.skip_nonfinite = false;  // nothing to agree on first: each rank steps, then the statistics are summed
  mpx::StageSet<rooms::P1> set(0, torch::kCPU, rooms::make, o);
  mpx::Executor<rooms::P1, tiny::Batch> ex(w, set, [](const tiny::Batch& b) { return b.tokens; }, tiny::loss);
  mpx::detail::TrainerCore core(w, o, set, ex, {"1F1B", 1, 4, 0.0});
  CHECK(core.step_order() == mpx::detail::TrainerCore::StepOrder::step_then_agree);

  auto ref = rooms::make_model();
  mpx::FusedAdamW adamw(ref->parameters(), torch::optim::AdamWOptions(1e-2).betas({o.beta1, o.beta2}).eps(o.eps).weight_decay(o.weight_decay));
  for (long step = 0; step < 2; ++step) {
    const auto mbs = rooms::microbatches(step);
    ex.use(mbs);
    const mpx::StepStats st = core.step();
    for (auto& p : ref->parameters()) p.mutable_grad().reset();  // as the trainer drops them
    double total = 0;
    for (auto& mb : mbs) {
      auto l = tiny::loss(ref->forward(mb.tokens), mb) / 4.0;
      l.backward();
      total += l.item<double>();
    }
    adamw.step();
    CHECK(rooms::rel(st.loss, total) < 1e-6);
  }
  CHECK(core.steps_done() == 2);
  auto mine = set.parameters(0), theirs = ref->parameters();
  for (std::size_t i = 0; i < mine.size(); ++i) CHECK(torch::allclose(mine[i], theirs[i], 1e-5, 1e-6));
}

TEST_CASE("TrainerCore: clipping orders agree-then-step, save and load carry the step count", "[rooms][trainer_core]")
{
  auto w = test::one_rank_world<rooms::P1>();
  const std::string dir = test::scratch_dir("trainer_core");
  mpx::TrainOptions o;
  o.skip_nonfinite = false;
  o.clip_norm = 1.0;  // clipping needs the global norm before any step
  mpx::StageSet<rooms::P1> set(0, torch::kCPU, rooms::make, o);
  mpx::Executor<rooms::P1, tiny::Batch> ex(w, set, [](const tiny::Batch& b) { return b.tokens; }, tiny::loss);
  mpx::detail::TrainerCore core(w, o, set, ex, {"1F1B", 1, 4, 0.0});
  CHECK(core.step_order() == mpx::detail::TrainerCore::StepOrder::agree_then_step);
  const auto mbs = rooms::microbatches(0);
  ex.use(mbs);
  CHECK(core.step().grad_norm > 0);
  core.save(dir);
  mpx::StageSet<rooms::P1> set2(0, torch::kCPU, rooms::make, o);
  mpx::Executor<rooms::P1, tiny::Batch> ex2(w, set2, [](const tiny::Batch& b) { return b.tokens; }, tiny::loss);
  mpx::detail::TrainerCore fresh(w, o, set2, ex2, {"1F1B", 1, 4, 0.0});
  fresh.load(dir);
  CHECK(fresh.steps_done() == 1);
  CHECK(torch::equal(set2.parameters(0)[0], set.parameters(0)[0]));
}
