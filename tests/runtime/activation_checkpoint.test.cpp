// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/runtime/activation_checkpoint.hpp: checkpointed and plain forward give equal gradients, dropout on.
#include "support/catch_torch.hpp"

#include <mpx/runtime/activation_checkpoint.hpp>
#include <mpx/runtime/trainer.hpp>  // mpx::detail::usable_boundaries, boundary_segments (the split W pass)

#include <torch/torch.h>

namespace
{
struct BlockImpl : torch::nn::Module
{
  BlockImpl()
      : fc1(register_module("fc1", torch::nn::Linear(32, 64))), fc2(register_module("fc2", torch::nn::Linear(64, 32))),
        drop(register_module("drop", torch::nn::Dropout(0.3)))
  {
  }
  torch::Tensor forward(torch::Tensor x) { return x + drop(fc2(torch::gelu(drop(fc1(x))))); }
  torch::nn::Linear fc1, fc2;
  torch::nn::Dropout drop;
};
TORCH_MODULE(Block);

struct Grads
{
  std::vector<at::Tensor> params;
  at::Tensor input, output;
};

/// Two blocks; checkpointed or not; one forward and backward from a fixed seed.
Grads run(bool ckpt, bool use_grad_api)
{
  torch::manual_seed(7);
  Block a, b;
  auto x = torch::randn({16, 32}).requires_grad_(true);
  std::vector<at::Tensor> params;
  for (auto* m : {&a, &b})
    for (auto& p : (*m)->parameters()) params.push_back(p);
  torch::manual_seed(11);  // the dropout masks
  at::Tensor y;
  if (ckpt) {
    auto fa = [&](const std::vector<at::Tensor>& in) { return std::vector<at::Tensor>{a(in[0])}; };
    auto fb = [&](const std::vector<at::Tensor>& in) { return std::vector<at::Tensor>{b(in[0])}; };
    auto h = mpx::checkpoint(fa, {x}, a->parameters())[0];
    y = mpx::checkpoint(fb, {h}, b->parameters())[0];
  } else {
    y = b(a(x));
  }
  auto loss = y.pow(2).mean();
  Grads g;
  g.output = y.detach();
  if (use_grad_api) {
    std::vector<at::Tensor> wrt{x};
    wrt.insert(wrt.end(), params.begin(), params.end());
    auto gs = torch::autograd::grad({loss}, wrt);
    g.input = gs[0];
    g.params.assign(gs.begin() + 1, gs.end());
  } else {
    loss.backward();
    g.input = x.grad();
    for (auto& p : params) g.params.push_back(p.grad());
  }
  return g;
}
}  // namespace

TEST_CASE("Checkpointed blocks give the plain run's gradients, with dropout", "[checkpoint][torch]")
{
  for (bool api : {false, true}) {
    CAPTURE(api);
    const Grads plain = run(false, api), ckpt = run(true, api);
    CHECK(torch::equal(plain.output, ckpt.output));
    CHECK((plain.input - ckpt.input).abs().max().item<double>() <= 1e-6 * plain.input.abs().max().item<double>());
    REQUIRE(plain.params.size() == ckpt.params.size());
    for (std::size_t i = 0; i < plain.params.size(); ++i) {
      CAPTURE(i);
      const double scale = plain.params[i].abs().max().item<double>();
      CHECK((plain.params[i] - ckpt.params[i]).abs().max().item<double>() <= 1e-6 * scale);
    }
  }
}

TEST_CASE("Without the RNG restore the masks would differ: the recompute really uses the saved state", "[checkpoint][torch]")
{
  // drawing random numbers between forward and backward must not change the gradients
  torch::manual_seed(3);
  Block a;
  auto x = torch::randn({8, 32}).requires_grad_(true);
  auto f = [&](const std::vector<at::Tensor>& in) { return std::vector<at::Tensor>{a(in[0])}; };
  torch::manual_seed(5);
  auto y = mpx::checkpoint(f, {x}, a->parameters())[0];
  torch::randn({1000});  // disturbs the generator
  y.sum().backward();
  auto g1 = x.grad().clone();
  x.mutable_grad() = at::Tensor();
  torch::manual_seed(5);
  a(x).sum().backward();
  CHECK(torch::allclose(g1, x.grad(), 1e-6, 1e-7));
}

TEST_CASE("Inputs that need no gradient and integer outputs pass through", "[checkpoint][torch]")
{
  auto w = torch::randn({4, 4}).requires_grad_(true);
  auto ids = torch::arange(4, torch::kLong);
  auto f = [&](const std::vector<at::Tensor>& in) { return std::vector<at::Tensor>{torch::matmul(in[0], w), in[1] * 2}; };
  auto outs = mpx::checkpoint(f, {torch::randn({2, 4}), ids}, {w});
  CHECK(outs[1].scalar_type() == torch::kLong);
  CHECK(!outs[1].requires_grad());
  outs[0].sum().backward();
  CHECK(w.grad().defined());
}

TEST_CASE("checkpoint_block: a plain call unless BlockCheckpointing is on, on, the plain run's gradients", "[checkpoint][torch]")
{
  // three blocks with dropout, each marked with checkpoint_block, as a module's forward would
  auto run_blocks = [](bool on) {
    torch::manual_seed(7);
    std::vector<Block> blocks(3);
    auto x = torch::randn({16, 32}).requires_grad_(true);
    torch::manual_seed(11);
    at::Tensor h = x;
    {
      mpx::BlockCheckpointing scope(on);
      for (auto& b : blocks) h = mpx::checkpoint_block(*b, [&b](const at::Tensor& t) { return b(t); }, h);
    }
    const std::string fn = h.grad_fn() ? h.grad_fn()->name() : "";
    torch::randn({1000});  // disturbs the generator between forward and backward
    h.pow(2).mean().backward();
    std::vector<at::Tensor> g{x.grad()};
    for (auto& b : blocks)
      for (auto& p : b->parameters()) g.push_back(p.grad());
    return std::make_pair(fn, g);
  };
  const auto [plain_fn, plain] = run_blocks(false);
  const auto [ckpt_fn, ckpt] = run_blocks(true);
  CHECK(plain_fn.find("CheckpointFunction") == std::string::npos);
  CHECK(ckpt_fn.find("CheckpointFunction") != std::string::npos);
  REQUIRE(plain.size() == ckpt.size());
  for (std::size_t i = 0; i < plain.size(); ++i) {
    CAPTURE(i);
    CHECK((plain[i] - ckpt[i]).abs().max().item<double>() <= 1e-6 * plain[i].abs().max().item<double>());
  }
  // with gradients off (evaluation) it is a plain call even when on
  torch::NoGradGuard no_grad;
  mpx::BlockCheckpointing scope;
  Block b;
  auto y = mpx::checkpoint_block(*b, [&b](const at::Tensor& t) { return b(t); }, torch::randn({2, 32}));
  CHECK(!y.grad_fn());
}

TEST_CASE("Block boundaries split the W pass: each block's parameters hang below its own output", "[checkpoint][torch]")
{
  // pre -> 3 blocks -> head, as a stage with an embedding and a head would be
  torch::manual_seed(1);
  torch::nn::Linear pre(32, 32), head(32, 4);
  std::vector<Block> blocks(3);
  std::vector<at::Tensor> list;
  at::Tensor y;
  {
    mpx::BlockBoundaries capture(&list);
    auto h = pre(torch::randn({4, 32}));
    for (auto& b : blocks) h = mpx::checkpoint_block(*b, [&b](const at::Tensor& t) { return b(t); }, h);
    y = head(h);
  }
  REQUIRE(list.size() == 6);  // input and output of each block
  const auto bounds = mpx::detail::usable_boundaries(list, {y});
  REQUIRE(bounds.size() == 4);  // pre's output, then each block's output (shared inputs counted once)
  const auto seg = mpx::detail::boundary_segments({y}, bounds);
  auto segment_of = [&](const at::Tensor& p) { return seg.at(p.unsafeGetTensorImpl()); };
  for (auto& p : head->parameters()) CHECK(segment_of(p) == -1);
  for (auto& p : pre->parameters()) CHECK(segment_of(p) == 0);
  for (int k = 0; k < 3; ++k)
    for (auto& p : blocks[std::size_t(k)]->parameters()) CHECK(segment_of(p) == k + 1);
  // a parameter used in two blocks is reached from both boundaries: it takes the whole graph
  std::vector<at::Tensor> list2;
  at::Tensor y2;
  {
    mpx::BlockBoundaries capture(&list2);
    auto h = pre(torch::randn({4, 32}));
    for (int k = 0; k < 2; ++k) h = mpx::checkpoint_block(*blocks[0], [&](const at::Tensor& t) { return blocks[0](t); }, h);
    y2 = head(h);
  }
  const auto seg2 = mpx::detail::boundary_segments({y2}, mpx::detail::usable_boundaries(list2, {y2}));
  for (auto& p : blocks[0]->parameters()) CHECK(seg2.at(p.unsafeGetTensorImpl()) == mpx::detail::several_segments);
}
