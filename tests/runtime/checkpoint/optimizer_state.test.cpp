// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/runtime/checkpoint/optimizer_state.hpp: AdamW, AdamW8bit and SGD state out as named tensors and back
// into a fresh optimizer, which then steps exactly as the original does.
#include "support/rooms.hpp"

#include <mpx/runtime/checkpoint/optimizer_state.hpp>

namespace
{
/// Two steps of `make(params)` on fixed gradients; its state moved into a second optimizer over a copy of
/// the parameters; one more step of each: the parameters must be equal.
template <class Make>
void moves_exactly(Make make, std::vector<std::string> fields)
{
  torch::manual_seed(7);
  std::map<std::string, at::Tensor> a{{"big", torch::randn({80, 64}).requires_grad_()}, {"small", torch::randn({5}).requires_grad_()}};
  auto grads = [](const std::map<std::string, at::Tensor>& ps, int k) {
    for (auto& [n, p] : ps) p.mutable_grad() = torch::sin(p.detach() * double(k + 1));
  };
  auto oa = make(std::vector<at::Tensor>{a["big"], a["small"]});
  for (int k = 0; k < 2; ++k) grads(a, k), oa->step();
  const auto named = mpx::named_optimizer_state(*oa, a);
  REQUIRE(named.has_value());
  for (auto& f : fields) CHECK(named->count("big/" + f) == 1);
  std::map<std::string, at::Tensor> b;
  for (auto& [n, p] : a) b[n] = p.detach().clone().requires_grad_();
  auto ob = make(std::vector<at::Tensor>{b["big"], b["small"]});
  mpx::restore_optimizer_state(*ob, b, [&](const std::string& k) { auto it = named->find(k); return it == named->end() ? at::Tensor() : it->second; });
  grads(a, 2), grads(b, 2);
  oa->step(), ob->step();
  for (auto& [n, p] : a) CHECK(torch::equal(p, b[n]));
}
}  // namespace

TEST_CASE("Optimizer state moves by parameter name: AdamW, AdamW8bit, SGD", "[rooms][optimizer_state]")
{
  const auto adamw = torch::optim::AdamWOptions(1e-2).weight_decay(0.1);
  moves_exactly([&](std::vector<at::Tensor> ps) { return std::make_unique<torch::optim::AdamW>(ps, adamw); }, {"step", "exp_avg", "exp_avg_sq"});
  moves_exactly([&](std::vector<at::Tensor> ps) { return std::make_unique<mpx::AdamW8bitOptimizer>(ps, adamw); }, {"step", "m8", "m8max", "v8", "v8max"});
  moves_exactly([&](std::vector<at::Tensor> ps) { return std::make_unique<torch::optim::SGD>(ps, torch::optim::SGDOptions(1e-2).momentum(0.9)); },
                {"momentum_buffer"});
}

TEST_CASE("An unknown optimizer kind is said so, a missing moment names the key", "[rooms][optimizer_state]")
{
  auto p = torch::randn({4}).requires_grad_();
  torch::optim::RMSprop rms({p}, torch::optim::RMSpropOptions(1e-2));
  CHECK(!mpx::named_optimizer_state(rms, {{"p", p}}).has_value());
  torch::optim::AdamW adamw({p}, torch::optim::AdamWOptions(1e-2));
  auto only_step = [](const std::string& k) { return k == "p/step" ? torch::tensor(3L) : at::Tensor(); };
  CHECK_THROWS_WITH(mpx::restore_optimizer_state(adamw, {{"p", p}}, only_step), Catch::Contains("optimizer state 'p/exp_avg' is missing"));
}
