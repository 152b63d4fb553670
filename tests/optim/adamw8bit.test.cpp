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

TEST_CASE("The fused CPU step skips an embedding's unused rows without changing any result", "[optim]")
{
  // 8 rows of 256 (one quantisation block each); a batch uses rows 1 and 5 only, later row 6 as well
  torch::manual_seed(4);
  const double lr = 1e-2, wd = 0.1;
  auto w = torch::randn({8, 256}).requires_grad_(true);
  auto used = w.detach().index({torch::tensor({1, 5})}).clone().requires_grad_(true);  // the same rows, alone
  const auto w0 = w.detach().clone();
  mpx::AdamW8bitOptimizer a({w}, torch::optim::AdamWOptions(lr).weight_decay(wd), 256), b({used}, torch::optim::AdamWOptions(lr).weight_decay(wd), 256);
  const auto idx = torch::tensor({1, 5, 1});
  for (int step = 0; step < 4; ++step) {
    a.zero_grad(), b.zero_grad();
    auto target = torch::randn({3, 256});
    (torch::nn::functional::embedding(idx, w) - target).pow(2).sum().backward();
    (torch::nn::functional::embedding(torch::tensor({0, 1, 0}), used) - target).pow(2).sum().backward();
    a.step(), b.step();
  }
  // used rows: bit for bit what an optimizer over those rows alone computes
  CHECK(torch::equal(w.detach().index({torch::tensor({1, 5})}), used.detach()));
  // unused rows: weight decay only, (1 - lr * wd) per step, in fp32
  auto expect = w0.clone();
  for (int step = 0; step < 4; ++step) expect.mul_(float(1 - lr * wd));
  for (int r : {0, 2, 3, 4, 6, 7}) CHECK(torch::equal(w.detach()[r], expect[r]));
  // a row used for the first time at step 5 (gradient 1): m = 0.1, v = 0.001 (β 0.9, 0.999), bias-corrected at step 5
  a.zero_grad();
  torch::nn::functional::embedding(torch::tensor({6}), w).sum().backward();
  const auto before = w.detach()[6].clone();
  a.step();
  const double c1 = 1 - std::pow(0.9, 5), c2 = 1 - std::pow(0.999, 5), expected = lr * (0.1 / c1) / std::sqrt(0.001 / c2);
  const auto moved = (before * float(1 - lr * wd) - w.detach()[6]);
  CHECK(moved.min().item<double>() == Approx(expected).epsilon(0.01));
  CHECK(moved.max().item<double>() == Approx(expected).epsilon(0.01));
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
