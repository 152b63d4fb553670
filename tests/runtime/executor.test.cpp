// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/runtime/executor.hpp on a one-rank world: one walk of a one-stage pipeline gives the loss
// and gradients of plain LibTorch; a stage's own failure is a stage_error naming rank, step and action,
// not a peer_error.
#include "support/rooms.hpp"

namespace
{
using Exec = mpx::Executor<rooms::P1, tiny::Batch>;
auto input = [](const tiny::Batch& b) { return b.tokens; };
}  // namespace

TEST_CASE("A walk computes the summed loss / m and accumulates the gradients of plain LibTorch", "[rooms][executor]")
{
  auto w = test::one_rank_world<rooms::P1>();
  mpx::StageSet<rooms::P1> set(0, torch::kCPU, rooms::make, {});
  Exec ex(w, set, input, tiny::loss);
  CHECK(ex.actions().size() == 8);  // F and B of 4 micro-batches, no messages
  CHECK(!ex.split().schedule_splits());
  std::vector<int> done;
  mpx::TraceRecorder trace;
  const auto mbs = rooms::microbatches(0);
  const auto walk = ex.walk(mbs, 1.0, 0, &trace, [&](int s) { done.push_back(s); });
  CHECK(done == std::vector<int>{0});  // once, after the stage's last backward
  CHECK(trace.events().size() == 8);
  CHECK(walk.compute_seconds > 0);
  auto ref = rooms::make_model();
  double total = 0;
  for (auto& mb : mbs) {
    auto l = tiny::loss(ref->forward(mb.tokens), mb) / 4.0;
    l.backward();
    total += l.item<double>();
  }
  CHECK(rooms::rel(walk.loss_sum.item<double>(), total) < 1e-12);
  auto mine = set.parameters(0), theirs = ref->parameters();
  for (std::size_t i = 0; i < mine.size(); ++i) CHECK(torch::allclose(mine[i].grad(), theirs[i].grad(), 1e-5, 1e-7));
}

TEST_CASE("The loss seed scales the gradients (the loss scaler's multiply)", "[rooms][executor]")
{
  auto w = test::one_rank_world<rooms::P1>();
  mpx::StageSet<rooms::P1> one(0, torch::kCPU, rooms::make, {}), eight(0, torch::kCPU, rooms::make, {});
  Exec a(w, one, input, tiny::loss), b(w, eight, input, tiny::loss);
  a.walk(rooms::microbatches(0), 1.0, 0, nullptr, [](int) {});
  b.walk(rooms::microbatches(0), 8.0, 0, nullptr, [](int) {});
  CHECK(torch::allclose(eight.parameters(0)[0].grad(), 8 * one.parameters(0)[0].grad()));
}

TEST_CASE("A stage whose loss throws is this rank's stage_error, naming step and action", "[rooms][executor]")
{
  auto w = test::one_rank_world<rooms::P1>();
  mpx::StageSet<rooms::P1> set(0, torch::kCPU, rooms::make, {});
  auto bad_loss = [](const at::Tensor& logits, const tiny::Batch&) { return logits.reshape({-1, 5}).sum(); };  // wrong shape
  Exec ex(w, set, input, bad_loss);
  try {
    ex.walk(rooms::microbatches(0), 1.0, 3, nullptr, [](int) {});
    FAIL("no error");
  } catch (const mpx::peer_error&) {
    FAIL("a stage's own failure was blamed on a peer");
  } catch (const mpx::stage_error& e) {
    const std::string m = e.what();
    CHECK(m.find("mpx: rank 0 (slot 0, replica 0), step 3, action 0 F0 of stage 0: stage 0 failed:") != std::string::npos);
    CHECK(m.find("peer") == std::string::npos);
  }
}

TEST_CASE("ZB-H1 splits a stage's backward only when its module marks blocks, else its I runs the whole backward", "[rooms][executor]")
{
  using PZb = mpx::Pipeline<mpx::Stage<tiny::Model, mpx::CPU<0>, mpx::Layers<0, 6>>, mpx::Schedule<mpx::ZBH1>, mpx::Microbatches<4>,
                            mpx::Batch<tiny::Batch>>;
  auto w = test::one_rank_world<PZb>();
  const auto mbs = rooms::microbatches(0);
  auto ref = rooms::make_model();
  for (auto& mb : mbs) (tiny::loss(ref->forward(mb.tokens), mb) / 4.0).backward();
  for (const bool marked : {true, false}) {
    CAPTURE(marked);
    auto make = [&](auto) {
      tiny::Config c = rooms::config;
      c.mark_blocks = marked;
      torch::manual_seed(100);  // rooms::make_model's draw
      return tiny::Model(c, 0, c.layers);
    };
    mpx::StageSet<PZb> set(0, torch::kCPU, make, {});
    mpx::Executor<PZb, tiny::Batch> ex(w, set, input, tiny::loss);
    CHECK(ex.split().schedule_splits());
    std::vector<std::string> events;
    ex.walk(mbs, 1.0, 0, nullptr, [&](int s) { events.push_back("last " + std::to_string(s)); },
            [&](int s) { events.push_back("done " + std::to_string(s)); });
    CHECK(ex.split().marks_blocks(0) == marked);
    CHECK(events == std::vector<std::string>{"last 0", "done 0"});  // the buckets' arm, then their start
    auto mine = set.parameters(0), theirs = ref->parameters();
    for (std::size_t i = 0; i < mine.size(); ++i) CHECK(torch::allclose(mine[i].grad(), theirs[i].grad(), 1e-5, 1e-7));
  }
}
