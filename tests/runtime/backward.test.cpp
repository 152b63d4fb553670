// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/runtime/backward.hpp: B, and I followed by W, give the same gradients as a plain backward,
// with and without block boundaries.
#include "support/rooms.hpp"

namespace
{
struct Run
{
  tiny::Model m{nullptr};  // layers 1-6: a last stage whose input wants a gradient
  at::Tensor x;
  std::vector<at::Tensor> bounds;
  at::Tensor loss;
  explicit Run(bool capture)
  {
    torch::manual_seed(7);
    m = tiny::Model(rooms::config, 1, 6);
    x = torch::randn({3, rooms::config.seq, rooms::config.dim}).requires_grad_(true);
    mpx::BlockBoundaries b(capture ? &bounds : nullptr);
    auto mb = rooms::microbatches(0)[0];
    loss = tiny::loss(m->forward(x), mb);
  }
  std::vector<at::Tensor> grads() const
  {
    std::vector<at::Tensor> g;
    for (auto& p : m->parameters()) g.push_back(p.grad().clone());
    return g;
  }
};

void same(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b)
{
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) CHECK(torch::allclose(a[i], b[i], 1e-5, 1e-6));
}
}  // namespace

TEST_CASE("full_backward: the parameters' and the input's gradients of a plain backward", "[rooms][backward]")
{
  Run plain(false), b(false);
  plain.loss.backward();
  auto gin = mpx::full_backward({b.loss}, {torch::ones_like(b.loss)}, {b.x});
  REQUIRE(gin.size() == 1);
  CHECK(torch::allclose(gin[0], plain.x.grad()));
  same(b.grads(), plain.grads());
  CHECK(mpx::full_backward({}, {}, {b.x})[0].defined() == false);  // nothing to backpropagate
}

TEST_CASE("input_backward then weight_backward: the same gradients, each computed once", "[rooms][backward]")
{
  for (bool capture : {false, true}) {
    CAPTURE(capture);
    Run plain(false), split(capture);
    plain.loss.backward();
    const std::vector<at::Tensor> outs{split.loss}, seeds{torch::ones_like(split.loss)};
    auto bounds = mpx::detail::usable_boundaries(split.bounds, outs);
    CHECK(bounds.empty() == !capture);  // the blocks' outputs, each once (not the leaf input, not the outputs)
    auto g = mpx::input_backward(outs, seeds, {split.x}, bounds);
    CHECK(torch::allclose(g.inputs[0], plain.x.grad(), 1e-5, 1e-6));
    for (auto& p : split.m->parameters()) CHECK(!p.grad().defined());  // I leaves the weights alone
    mpx::weight_backward(outs, seeds, bounds, g.bounds, split.m->parameters());
    same(split.grads(), plain.grads());
  }
}
