// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/optim/fused_step_8bit.hpp: the first step from zero moments is AdamW's, and its moments
// are stored as the tensor path's quantize stores them; through AdamW8bitOptimizer, an embedding's unused rows get the
// weight decay alone while the used rows step bit for bit as an optimizer over those rows alone.
#include "support/catch_torch.hpp"

#include <mpx/optim/adamw8bit.hpp>
#include <mpx/optim/fused_step_8bit.hpp>

#include <torch/torch.h>

#include <cmath>

TEST_CASE("The fused 8-bit step's first step is AdamW's, its moments stored as quantize stores them", "[optim]")
{
  torch::manual_seed(7);
  const std::int64_t n = 700;  // two full blocks and a part
  auto p = torch::randn({n});
  const auto g = torch::randn({n}), p0 = p.clone();
  const double lr = 1e-2, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.1, c1 = 1 - b1, c2 = 1 - b2;
  mpx::Quantized m8, v8;
  mpx::detail::fused_step_8bit(p, g, m8, v8, /*first=*/true, lr, b1, b2, eps, wd, c1, c2);
  const auto m = g * float(1 - b1), v = g * g * float(1 - b2);
  const auto expect = p0 * float(1 - lr * wd) - float(lr / c1) * m / ((v / float(c2)).sqrt() + float(eps));
  CHECK(torch::allclose(p, expect, 1e-6, 1e-7));
  CHECK(m8.numel == n);
  CHECK(m8.codes.numel() == 3 * mpx::quant_block);  // padded to whole blocks
  CHECK(m8.absmax.numel() == 3);
  // the codes and block maxima are what the tensor path's quantize gives the fp32 moments
  const mpx::Quantized m_ref = mpx::quantize(m, mpx::detail::signed_code()), v_ref = mpx::quantize(v, mpx::detail::unsigned_code());
  CHECK(torch::allclose(m8.absmax, m_ref.absmax, 1e-6, 0));  // v: the fused arithmetic rounds once less (a multiply-add)
  CHECK(torch::allclose(v8.absmax, v_ref.absmax, 1e-6, 0));
  CHECK(torch::equal(m8.codes.flatten(), m_ref.codes.flatten()));
  CHECK(torch::equal(v8.codes.flatten(), v_ref.codes.flatten()));
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
