// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/optim/adamw8bit.hpp.
#include "support/catch_torch.hpp"

#include <mpx/optim/adamw8bit.hpp>

#include <torch/torch.h>

#include <iostream>

namespace
{
/// Linear regression, 200 steps; returns the losses and the final weights.
std::pair<std::vector<double>, at::Tensor> regress(bool eight, torch::optim::Optimizer** keep = nullptr)
{
  torch::manual_seed(1);
  const auto truth = torch::randn({128, 64});
  auto w = torch::zeros({128, 64}).requires_grad_(true);  // 8192 values: 8-bit state
  auto b = torch::zeros({64}).requires_grad_(true);       // small: fp32 state
  auto opts = torch::optim::AdamWOptions(3e-2).weight_decay(1e-2);
  std::unique_ptr<torch::optim::Optimizer> opt;
  if (eight) opt = std::make_unique<mpx::AdamW8bitOptimizer>(std::vector<at::Tensor>{w, b}, opts);
  else opt = std::make_unique<torch::optim::AdamW>(std::vector<at::Tensor>{w, b}, opts);
  std::vector<double> losses;
  for (int step = 0; step < 200; ++step) {
    auto x = torch::randn({256, 128}, at::make_generator<at::CPUGeneratorImpl>(100 + step));
    auto y = torch::matmul(x, truth) + 0.5;
    auto loss = (torch::matmul(x, w) + b - y).pow(2).mean();
    opt->zero_grad();
    loss.backward();
    opt->step();
    losses.push_back(loss.item<double>());
  }
  if (keep) *keep = opt.release();
  return {losses, w.detach().clone()};
}
}  // namespace

TEST_CASE("8-bit AdamW tracks fp32 AdamW on a regression over 200 steps", "[adamw8bit]")
{
  auto [l32, w32] = regress(false);
  auto [l8, w8] = regress(true);
  std::cout << "regression: fp32 AdamW loss " << l32.front() << " -> " << l32.back() << ", 8-bit AdamW " << l8.front() << " -> "
            << l8.back() << "; weights differ by " << ((w8 - w32).norm() / w32.norm()).item<double>() << " (relative)\n";
  CHECK(l8.back() < 0.05 * l8.front());                  // it learns
  CHECK(l8.back() < 1.5 * l32.back() + 1e-3);            // about as well
  CHECK(((w8 - w32).norm() / w32.norm()).item<double>() < 0.05);
  for (std::size_t i = 0; i < l8.size(); i += 20) CHECK(std::abs(l8[i] - l32[i]) <= 0.1 * l32[i] + 1e-2);
}

TEST_CASE("8-bit AdamW state costs at most 2.1 bytes per parameter (fp32 AdamW: 8)", "[adamw8bit]")
{
  auto w = torch::randn({1024, 1024}).requires_grad_(true);
  mpx::AdamW8bitOptimizer opt({w}, torch::optim::AdamWOptions(1e-3));
  w.sum().backward();
  opt.step();
  const double per = double(opt.state_bytes()) / double(w.numel());
  std::cout << "8-bit AdamW state: " << per << " bytes per parameter\n";
  CHECK(per <= 2.1);
}

TEST_CASE("8-bit AdamW state saves and loads, hyper-parameters included", "[adamw8bit]")
{
  torch::manual_seed(2);
  auto w = torch::randn({64, 128}).requires_grad_(true);
  auto b = torch::randn({8}).requires_grad_(true);
  mpx::AdamW8bitOptimizer a({w, b}, torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
  for (int i = 0; i < 3; ++i) {
    a.zero_grad();
    (w.pow(3).sum() + b.pow(2).sum()).backward();
    a.step();
  }
  torch::serialize::OutputArchive out;
  a.save(out);
  std::ostringstream bytes;
  out.save_to(bytes);
  auto w2 = w.detach().clone().requires_grad_(true), b2 = b.detach().clone().requires_grad_(true);
  mpx::AdamW8bitOptimizer c({w2, b2}, torch::optim::AdamWOptions(0.5));  // other lr: must come back as 1e-2
  torch::serialize::InputArchive in;
  std::istringstream is(bytes.str());
  in.load_from(is);
  c.load(in);
  CHECK(static_cast<torch::optim::AdamWOptions&>(c.param_groups()[0].options()).lr() == Approx(1e-2));
  for (auto* o : {&a, &c}) {
    o->zero_grad();
    auto& p = o == &a ? w : w2;
    auto& q = o == &a ? b : b2;
    (p.pow(3).sum() + q.pow(2).sum()).backward();
    o->step();
  }
  CHECK(torch::equal(w, w2));
  CHECK(torch::equal(b, b2));
}

TEST_CASE("8-bit AdamW takes fp32 moments for a large parameter and quantizes them (a re-cut shard's)", "[torch][adamw8bit]")
{
  auto p = torch::zeros({64, 80}, torch::requires_grad());  // 5120 values: 8-bit moments
  mpx::AdamW8bitOptimizer opt({p}, torch::optim::AdamWOptions(1e-3));
  const auto m = torch::randn({64, 80}) * 1e-3, v = torch::rand({64, 80}) * 1e-6;
  opt.set_param_state(p, {{"step", torch::tensor(3L)}, {"m", m}, {"v", v}});
  const auto st = opt.param_state(p);
  REQUIRE(st.count("m8"));
  const auto back = mpx::detail::dense_moment(st.at("m8"), st.at("m8max"), p.sizes(), true);
  CHECK((back - m).abs().max().item<float>() <= 0.02f * m.abs().max().item<float>());
  const auto vback = mpx::detail::dense_moment(st.at("v8"), st.at("v8max"), p.sizes(), false);
  CHECK((vback - v).abs().max().item<float>() <= 0.02f * v.abs().max().item<float>());
  // the field names, as checkpoints know them
  using F = mpx::AdamW8bitOptimizer::Field;
  CHECK(mpx::AdamW8bitOptimizer::quantized_fields(F::m) == std::pair<const char*, const char*>{F::m_codes, F::m_absmax});
  CHECK(mpx::AdamW8bitOptimizer::quantized_fields(F::step).first == nullptr);
  CHECK(mpx::AdamW8bitOptimizer::is_quantized_field("v8max"));
  CHECK(!mpx::AdamW8bitOptimizer::is_quantized_field("v"));
}
