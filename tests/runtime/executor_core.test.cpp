// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/runtime/executor_core.hpp: the compiled walk reaches the typed code only through its
// calls, by micro-batch index — stage 0's input and the loss once per micro-batch, the forward once per
// forward action — and the summed loss / m it returns is the calls' own.
#include "support/rooms.hpp"

TEST_CASE("ExecutorCore calls the typed code by micro-batch index, once per action", "[rooms][executor_core]")
{
  auto w = test::one_rank_world<rooms::P1>();
  mpx::StageSet<rooms::P1> set(0, torch::kCPU, rooms::make, {});
  const auto mbs = rooms::microbatches(0);
  std::vector<int> inputs, forwards, losses;
  mpx::detail::ExecutorCore::Calls calls{
      [&](int mb) {
        inputs.push_back(mb);
        return std::vector<at::Tensor>{mbs[std::size_t(mb)].tokens};
      },
      [&](int s, const std::vector<at::Tensor>& in, int mb) {
        forwards.push_back(mb);
        return set.forward(s, in, mbs[std::size_t(mb)]);
      },
      [&](const std::vector<at::Tensor>& out, int mb) {
        losses.push_back(mb);
        return tiny::loss(out[0], mbs[std::size_t(mb)]);
      }};
  mpx::detail::ExecutorCore core(w, set, mpx::schedule_facts<rooms::P1>(0), calls);
  CHECK(core.actions().size() == 8);
  int done = 0, last = 0;
  const auto walk = core.walk(1.0, 0, nullptr, [&](int) { ++last; }, [&](int) { ++done; });
  CHECK(inputs == std::vector<int>{0, 1, 2, 3});
  CHECK(forwards == std::vector<int>{0, 1, 2, 3});
  CHECK(losses == std::vector<int>{0, 1, 2, 3});
  CHECK(last == 1);
  CHECK(done == 1);
  auto ref = rooms::make_model();
  double total = 0;
  for (auto& mb : mbs) total += tiny::loss(ref->forward(mb.tokens), mb).item<double>() / 4.0;
  CHECK(rooms::rel(walk.loss_sum.item<double>(), total) < 1e-12);
}

TEST_CASE("A call that throws is the stage's error, naming rank, step and action", "[rooms][executor_core]")
{
  auto w = test::one_rank_world<rooms::P1>();
  mpx::StageSet<rooms::P1> set(0, torch::kCPU, rooms::make, {});
  mpx::detail::ExecutorCore::Calls calls{[](int) -> std::vector<at::Tensor> { throw std::runtime_error("no such picture"); },
                                         [](int, const std::vector<at::Tensor>& in, int) { return in; },
                                         [](const std::vector<at::Tensor>& out, int) { return out[0].sum(); }};
  mpx::detail::ExecutorCore core(w, set, mpx::schedule_facts<rooms::P1>(0), calls);
  CHECK_THROWS_AS(core.walk(1.0, 5, nullptr, [](int) {}, [](int) {}), mpx::stage_error);
  try {
    core.walk(1.0, 5, nullptr, [](int) {}, [](int) {});
  } catch (const mpx::stage_error& e) {
    CHECK_THAT(e.what(), Catch::Contains("rank 0") && Catch::Contains("step 5") && Catch::Contains("F0 of stage 0") &&
                             Catch::Contains("no such picture"));
  }
}
