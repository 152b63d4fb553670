// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/optim/fused_adamw.hpp.
#include "support/catch_torch.hpp"

#include <mpx/optim/fused_adamw.hpp>

#include <torch/torch.h>

#include <algorithm>  // std::max
#include <iostream>
#include <memory>
#include <vector>

namespace
{
/// Parameters of every kind the step meets: a weight whose size is not a multiple of the four lanes
/// (the tail), a bias, one larger than a parallel_for grain, a strided one, a double one (the tensor
/// path). Each has a gradient.
std::vector<at::Tensor> parameters()
{
  torch::manual_seed(3);
  std::vector<at::Tensor> ps{torch::randn({37, 29}), torch::randn({29}), torch::randn({300, 300}), torch::randn({16, 12}).t(),
                             torch::randn({5, 3}, torch::kDouble)};
  for (auto& p : ps) p.requires_grad_(true);
  return ps;
}

std::vector<at::Tensor> clones(const std::vector<at::Tensor>& ps)
{
  std::vector<at::Tensor> out;
  for (const auto& p : ps) {
    // keep the layout (the transposed one stays strided)
    auto c = torch::empty_strided(p.sizes(), p.strides(), p.options()).copy_(p.detach());
    out.push_back(c.requires_grad_(true));
  }
  return out;
}

/// Sets each parameter's gradient for step `step` (the same in every copy). The first parameter's
/// gradient is transposed in memory (a contiguous parameter, a strided gradient of its shape, as `mm`'s
/// backward can give one).
void set_grads(std::vector<at::Tensor>& ps, int step)
{
  for (std::size_t i = 0; i < ps.size(); ++i) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 * step + i);
    const auto o = ps[i].options().requires_grad(false);
    ps[i].mutable_grad() = i == 0 ? torch::randn({ps[i].size(1), ps[i].size(0)}, gen, o).t()
                                  : torch::randn(ps[i].sizes(), gen, o) * double(i + 1);
  }
}

double max_relative(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b)
{
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, ((a[i] - b[i]).abs().max() / b[i].abs().max()).item<double>());
  return worst;
}

/// Steps a FusedAdamW and LibTorch's AdamW over the same gradients; returns the worst relative difference.
double against_libtorch(const torch::optim::AdamWOptions& o, int steps)
{
  auto ref = parameters();
  auto ours = clones(ref);
  torch::optim::AdamW a(ref, o);
  mpx::FusedAdamW b(ours, o);
  for (int s = 0; s < steps; ++s) {
    set_grads(ref, s), set_grads(ours, s);
    a.step(), b.step();
  }
  return max_relative(ours, ref);
}
}  // namespace

TEST_CASE("FusedAdamW steps as LibTorch's AdamW does, within fp32 rounding", "[fused_adamw]")
{
  const auto base = torch::optim::AdamWOptions(3e-2).betas({0.9, 0.95}).eps(1e-6);
  for (double wd : {0.0, 0.1}) {
    const double d = against_libtorch(torch::optim::AdamWOptions(base).weight_decay(wd), 50);
    std::cout << "FusedAdamW against torch::optim::AdamW, 50 steps, weight decay " << wd << ": max relative difference " << d << "\n";
    CHECK(d < 1e-5);
  }
  const double ams = against_libtorch(torch::optim::AdamWOptions(base).amsgrad(true), 20);  // the tensor path
  CHECK(ams < 1e-6);
}

TEST_CASE("FusedAdamW takes the one pass only where it can", "[fused_adamw]")
{
  auto ps = parameters();
  set_grads(ps, 0);
  const torch::optim::AdamWOptions o(1e-3);
  CHECK_FALSE(ps[0].grad().is_contiguous());
  CHECK(mpx::FusedAdamW::fusable(ps[0], o));  // a strided gradient is read through a contiguous copy
  CHECK(mpx::FusedAdamW::fusable(ps[2], o));
  CHECK_FALSE(mpx::FusedAdamW::fusable(ps[3], o));  // strided
  CHECK_FALSE(mpx::FusedAdamW::fusable(ps[4], o));  // double
  CHECK_FALSE(mpx::FusedAdamW::fusable(ps[0], torch::optim::AdamWOptions(o).amsgrad(true)));
  auto h = torch::randn({8}, torch::kHalf).requires_grad_(true);
  h.mutable_grad() = torch::randn({8}, torch::kHalf);
  CHECK_FALSE(mpx::FusedAdamW::fusable(h, o));
}

TEST_CASE("FusedAdamW's pass sums each gradient's squares as it reads them", "[fused_adamw]")
{
  auto ps = parameters();
  auto unused = torch::ones({3}).requires_grad_(true);
  ps.push_back(unused);
  mpx::FusedAdamW opt(ps, torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
  for (int step = 0; step < 2; ++step) {
    set_grads(ps, step);
    ps.back().mutable_grad().reset();
    opt.step();
    for (std::size_t i = 0; i < 3; ++i) {  // the one pass (a strided gradient, a tail, several grains)
      const auto sq = opt.stepped_grad_sq(ps[i]);
      REQUIRE(sq.has_value());
      const double want = ps[i].grad().to(torch::kDouble).pow(2).sum().item<double>();
      CHECK(*sq == Approx(want).epsilon(1e-12));
    }
    CHECK_FALSE(opt.stepped_grad_sq(ps[3]).has_value());  // strided parameter: the tensor path
    CHECK_FALSE(opt.stepped_grad_sq(ps[4]).has_value());  // double
    CHECK_FALSE(opt.stepped_grad_sq(unused).has_value());  // no gradient, no step
  }
  ps[0].mutable_grad().reset();  // a later step forgets what the earlier one summed
  opt.step();
  CHECK_FALSE(opt.stepped_grad_sq(ps[0]).has_value());
  CHECK(opt.stepped_grad_sq(ps[1]).has_value());
}

TEST_CASE("FusedAdamW's state is LibTorch's: either optimizer resumes the other's archive", "[fused_adamw]")
{
  const auto o = torch::optim::AdamWOptions(1e-2).weight_decay(0.05);
  auto ref = parameters();
  torch::optim::AdamW a(ref, o);
  for (int s = 0; s < 3; ++s) set_grads(ref, s), a.step();
  auto ours = clones(ref);

  torch::serialize::OutputArchive out;
  a.save(out);
  std::stringstream bytes;
  out.save_to(bytes);
  mpx::FusedAdamW b(ours, o);
  torch::serialize::InputArchive in;
  in.load_from(bytes);
  b.load(in);
  for (int s = 3; s < 8; ++s) set_grads(ref, s), set_grads(ours, s), a.step(), b.step();
  CHECK(max_relative(ours, ref) < 1e-5);

  // and back: LibTorch's AdamW resumes what FusedAdamW saved
  torch::serialize::OutputArchive out2;
  b.save(out2);
  std::stringstream bytes2;
  out2.save_to(bytes2);
  auto again = clones(ours);
  torch::optim::AdamW c(again, o);
  torch::serialize::InputArchive in2;
  in2.load_from(bytes2);
  c.load(in2);
  set_grads(ours, 8), set_grads(again, 8), b.step(), c.step();
  CHECK(max_relative(again, ours) < 1e-5);
}

TEST_CASE("FusedAdamW: no gradient, no step, a closure's loss comes back, autograd sees the write", "[fused_adamw]")
{
  auto w = torch::ones({6}).requires_grad_(true);
  auto unused = torch::ones({6}).requires_grad_(true);
  mpx::FusedAdamW opt(std::vector<at::Tensor>{w, unused}, torch::optim::AdamWOptions(0.1).weight_decay(0));
  const auto version = w._version();
  const at::Tensor loss = opt.step([&] {
    opt.zero_grad();
    auto l = (w * w).sum();
    l.backward();
    return l;
  });
  CHECK(loss.item<float>() == 6.0f);
  CHECK(w._version() > version);
  CHECK(torch::allclose(w.detach(), torch::full({6}, 0.9f)));  // the first step moves each value by lr
  CHECK(torch::equal(unused.detach(), torch::ones({6})));
  CHECK(opt.state().size() == 1);
}

TEST_CASE("FusedAdamW: the same bits on one intra-op thread or two", "[fused_adamw]")
{
  const int threads = at::get_num_threads();
  std::vector<std::vector<at::Tensor>> runs;
  for (int n : {1, 2}) {
    at::set_num_threads(n);
    auto ps = parameters();
    mpx::FusedAdamW opt(ps, torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
    for (int s = 0; s < 5; ++s) set_grads(ps, s), opt.step();
    runs.push_back(ps);
  }
  at::set_num_threads(threads);
  for (std::size_t i = 0; i < runs[0].size(); ++i) CHECK(torch::equal(runs[0][i], runs[1][i]));
}

TEST_CASE("FusedAdamW refuses a sparse gradient and names what takes one", "[fused_adamw]")
{
  auto w = torch::zeros({4, 3}).requires_grad_(true);
  w.mutable_grad() = torch::zeros({4, 3}).to_sparse();
  mpx::FusedAdamW opt(std::vector<at::Tensor>{w}, torch::optim::AdamWOptions(1e-3));
  CHECK_THROWS_WITH(opt.step(), Catch::Matchers::Contains("SparseAdam"));
}
