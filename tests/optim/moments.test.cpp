// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/optim/moments.hpp: a parameter's state as fp32 moments and back, for every kind mpx builds.
#include "support/catch_torch.hpp"

#include <mpx/optim/fused_adamw.hpp>
#include <mpx/optim/moments.hpp>

#include <torch/torch.h>

#include <memory>
#include <vector>

namespace
{
/// One step of `opt` over `ps` with fixed gradients.
void moment_step_once(torch::optim::Optimizer& opt, const std::vector<at::Tensor>& ps)
{
  for (auto& p : ps) p.mutable_grad() = torch::linspace(-1, 1, p.numel()).view_as(p);
  opt.step();
}
std::vector<at::Tensor> moment_params()
{
  torch::manual_seed(3);
  return {torch::randn({3, 5}), torch::randn({80, 100})};  // under and over AdamW8bit's 4096-element floor
}
}  // namespace

TEST_CASE("Moments round-trip for AdamW, AdamW8bit and SGD: read from one optimizer, set into another of the same kind", "[optim][moments]")
{
  const auto adamw = torch::optim::AdamWOptions(1e-2).weight_decay(0.01);
  std::vector<std::unique_ptr<torch::optim::Optimizer>> kinds;
  auto a = moment_params(), b = moment_params(), c = moment_params();
  kinds.push_back(std::make_unique<mpx::FusedAdamW>(a, adamw));
  kinds.push_back(std::make_unique<mpx::AdamW8bitOptimizer>(b, adamw));
  kinds.push_back(std::make_unique<torch::optim::SGD>(c, torch::optim::SGDOptions(1e-2).momentum(0.9)));
  for (auto& opt : kinds) {
    auto ps = opt->param_groups().front().params();
    CHECK(mpx::detail::moments_of(*opt, ps[0]).step == 0);  // no step yet: no state
    moment_step_once(*opt, ps);
    moment_step_once(*opt, ps);
    const auto names = mpx::detail::moment_names(*opt);
    auto copies = std::vector<at::Tensor>{ps[0].detach().clone(), ps[1].detach().clone()};
    auto other = mpx::detail::same_kind(*opt, copies);
    for (std::size_t i = 0; i < ps.size(); ++i) {
      const auto m = mpx::detail::moments_of(*opt, ps[i]);
      CHECK(m.step == (dynamic_cast<torch::optim::SGD*>(opt.get()) ? 1 : 2));
      REQUIRE(m.fields.size() == names.size());
      for (const auto& n : names) {
        CAPTURE(n, i);
        CHECK(m.fields.at(n).sizes() == ps[i].sizes());  // dense, shaped like the parameter
        CHECK(m.fields.at(n).scalar_type() == at::kFloat);
      }
      mpx::detail::set_moments(*other, copies[i], m);
      const auto back = mpx::detail::moments_of(*other, copies[i]);
      CHECK(back.step == m.step);
      for (const auto& n : names) CHECK(torch::equal(back.fields.at(n), m.fields.at(n)));  // 8-bit: quantized again, the same codes
    }
    // the copy steps as the original does
    moment_step_once(*opt, ps);
    moment_step_once(*other, copies);
    for (std::size_t i = 0; i < ps.size(); ++i) CHECK(torch::equal(ps[i], copies[i]));
  }
}

TEST_CASE("Moments of a kind mpx does not build, or of AMSGrad, are a config_error naming the kinds", "[optim][moments]")
{
  auto ps = moment_params();
  torch::optim::Adam adam(ps, torch::optim::AdamOptions(1e-2));
  CHECK_THROWS_WITH(mpx::detail::moment_names(adam), Catch::Contains("AdamW") && Catch::Contains("make_optimizer"));
  CHECK_THROWS_AS(mpx::detail::same_kind(adam, ps), mpx::config_error);
  torch::optim::AdamW ams(ps, torch::optim::AdamWOptions(1e-2).amsgrad(true));
  moment_step_once(ams, ps);
  CHECK_THROWS_WITH(mpx::detail::moments_of(ams, ps[0]), Catch::Contains("AMSGrad"));
}
