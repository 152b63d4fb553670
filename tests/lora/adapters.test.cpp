// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/lora/adapters.hpp (and tp/adapter.hpp's arithmetic) in one process: apply freezes the base
// and adds adapters that start at zero, their term is alpha/r·B·A·x with the explicit formula's gradients,
// patterns and kinds choose the linears, bad options and a plain torch::nn::Linear are named errors, fold
// and merged give W + alpha/r·B·A. Under tensor parallelism: tp/tp.test.cpp ("[lora]").
#include "support/catch_torch.hpp"
#include "support/tiny_tp_transformer.hpp"

#include <mpx/lora/adapters.hpp>

namespace
{
const tiny::Config lora_config{32, 16, 4, 2, 8};

std::vector<std::string> trainable_names(torch::nn::Module& m)
{
  std::vector<std::string> out;
  for (auto& p : m.named_parameters())
    if (p.value().requires_grad()) out.push_back(p.key());
  return out;
}

/// A plain torch::nn::Linear beside an mpx one.
struct MixedImpl : torch::nn::Module
{
  MixedImpl() : plain(register_module("plain", torch::nn::Linear(4, 4))), fc(register_module("fc", mpx::tp::ColumnLinear(4, 6))) {}
  torch::nn::Linear plain;
  mpx::tp::ColumnLinear fc;
};
TORCH_MODULE(Mixed);
}  // namespace

TEST_CASE("lora::apply freezes the base and adapts every mpx linear, the output unchanged until B trains", "[lora]")
{
  torch::manual_seed(1);
  tiny_tp::Model m(lora_config, 0, lora_config.layers);
  const auto batch = tiny::make_batch(lora_config, 4, 0, 0, 1);
  const auto before = m(batch.tokens).detach();
  int64_t all = 0;
  for (auto& p : m->parameters()) all += p.numel();
  mpx::lora::Options o;
  o.rank = 4, o.alpha = 8;
  const auto r = mpx::lora::apply(*m, o);
  // 2 blocks x (qkv, proj, fc1, fc2) and the head
  CHECK(r.adapted == std::vector<std::string>{"blocks.0.qkv", "blocks.0.proj", "blocks.0.fc1", "blocks.0.fc2", "blocks.1.qkv", "blocks.1.proj",
                                              "blocks.1.fc1", "blocks.1.fc2", "head"});
  CHECK(r.frozen_parameters == all);
  const int64_t D = lora_config.dim, V = lora_config.vocab;
  const int64_t per_block = 4 * (D + 3 * D) + 4 * (D + D) + 4 * (D + 4 * D) + 4 * (4 * D + D);
  CHECK(r.adapter_parameters == 2 * per_block + 4 * (D + V));
  const auto names = trainable_names(*m);
  CHECK(names.size() == 18);
  for (auto& n : names) CHECK(mpx::lora::is_adapter(n));
  CHECK(torch::equal(m(batch.tokens).detach(), before));  // B = 0
  CHECK(m->head->lora.a.size(0) == 4);
  CHECK(m->head->lora.scale == 2.0);
}

TEST_CASE("The adapter's term is alpha/r·B·A·x and its gradients are the explicit formula's", "[lora]")
{
  torch::manual_seed(2);
  mpx::tp::ColumnLinear col(5, 7);
  mpx::tp::RowLinear row(7, 3);
  mpx::lora::Options o;
  o.rank = 2, o.alpha = 6;
  mpx::lora::apply(*col, o);
  mpx::lora::apply(*row, o);
  {
    torch::NoGradGuard ng;
    col->lora.b.normal_();
    row->lora.b.normal_();
  }
  const auto x = torch::randn({4, 5});
  auto y = row(col(x));
  (y * torch::arange(12.0).reshape({4, 3})).sum().backward();
  // the same by hand, on copies
  auto A1 = col->lora.a.detach().clone().requires_grad_(true), B1 = col->lora.b.detach().clone().requires_grad_(true);
  auto A2 = row->lora.a.detach().clone().requires_grad_(true), B2 = row->lora.b.detach().clone().requires_grad_(true);
  auto h = x.mm(col->weight.t()) + col->bias + 3.0 * x.mm(A1.t()).mm(B1.t());
  auto want = h.mm(row->weight.t()) + row->bias + 3.0 * h.mm(A2.t()).mm(B2.t());
  CHECK(torch::allclose(y, want, 1e-5, 1e-6));
  (want * torch::arange(12.0).reshape({4, 3})).sum().backward();
  CHECK(torch::allclose(col->lora.a.grad(), A1.grad(), 1e-5, 1e-6));
  CHECK(torch::allclose(col->lora.b.grad(), B1.grad(), 1e-5, 1e-6));
  CHECK(torch::allclose(row->lora.a.grad(), A2.grad(), 1e-5, 1e-6));
  CHECK(torch::allclose(row->lora.b.grad(), B2.grad(), 1e-5, 1e-6));
  CHECK(!col->weight.grad().defined());  // frozen
  // dropout acts on the adapter's input only, in training
  o.dropout = 0.5;
  mpx::tp::ColumnLinear d(5, 7);
  mpx::lora::apply(*d, o);
  {
    torch::NoGradGuard ng;
    d->lora.b.normal_();
  }
  d->eval();
  const auto base = x.mm(d->weight.t()) + d->bias;
  CHECK(torch::allclose(d(x), base + 3.0 * x.mm(d->lora.a.t()).mm(d->lora.b.t()), 1e-5, 1e-6));
  d->train();
  CHECK(!torch::allclose(d(x), d(x)));  // two masks
}

TEST_CASE("Targets choose linears by name and kind, and by global names when given", "[lora]")
{
  tiny_tp::Model m(lora_config, 0, lora_config.layers);
  mpx::lora::Options o;
  o.targets = R"(blocks\.[0-9]+\.fc[12])";
  CHECK(mpx::lora::apply(*m, o).adapted == std::vector<std::string>{"blocks.0.fc1", "blocks.0.fc2", "blocks.1.fc1", "blocks.1.fc2"});
  tiny_tp::Model k(lora_config, 0, lora_config.layers);
  o.targets = "", o.kinds = mpx::lora::Kinds::row;
  CHECK(mpx::lora::apply(*k, o).adapted == std::vector<std::string>{"blocks.0.proj", "blocks.0.fc2", "blocks.1.proj", "blocks.1.fc2"});
  // global names: a stage holding blocks 1.. of a model names its linears as the whole model does, and draws alike
  tiny_tp::Model whole(lora_config, 0, 2), tail(lora_config, 1, 2);
  std::map<std::string, at::Tensor> global;
  for (auto& p : tail->named_parameters()) {
    auto n = p.key();
    if (n.starts_with("blocks.0.")) n = "blocks.1." + n.substr(9);
    global["model." + n] = p.value();
  }
  std::map<std::string, at::Tensor> global_whole;
  for (auto& p : whole->named_parameters()) global_whole["model." + p.key()] = p.value();
  mpx::lora::Options g;
  g.targets = R"(model\.blocks\.1\.fc1)";
  CHECK(mpx::lora::apply(*tail, g, global).adapted == std::vector<std::string>{"model.blocks.1.fc1"});
  mpx::lora::apply(*whole, g, global_whole);
  CHECK(torch::equal(tail->blocks[0]->as<tiny_tp::BlockImpl>()->fc1->lora.a, whole->blocks[1]->as<tiny_tp::BlockImpl>()->fc1->lora.a));
}

TEST_CASE("Bad LoRA options, a plain torch::nn::Linear named, and a second apply are errors that name the fix", "[lora]")
{
  auto fails = [](auto&& f, const std::string& says) {
    try {
      f();
    } catch (const mpx::config_error& e) {
      INFO(e.what());
      CHECK(std::string(e.what()).find(says) != std::string::npos);
      return;
    }
    FAIL("no error: " + says);
  };
  mpx::lora::Options o;
  Mixed mixed;
  o.rank = 0;
  fails([&] { mpx::lora::apply(*mixed, o); }, "the rank must be at least 1");
  o.rank = 2, o.alpha = 0;
  fails([&] { mpx::lora::apply(*mixed, o); }, "alpha must be positive");
  o.alpha = 2, o.dropout = 1;
  fails([&] { mpx::lora::apply(*mixed, o); }, "the dropout must be in [0, 1)");
  o.dropout = 0, o.targets = "(";
  fails([&] { mpx::lora::apply(*mixed, o); }, "is not a regular expression");
  o.targets = "plain";
  fails([&] { mpx::lora::apply(*mixed, o); }, "build it as mpx::tp::ColumnLinear");
  o.targets = "nothing";
  fails([&] { mpx::lora::apply(*mixed, o); }, "the linears are named like 'fc'");
  o.targets = "";
  Mixed fresh;
  const auto r = mpx::lora::apply(*fresh, o);
  CHECK(r.adapted == std::vector<std::string>{"fc"});
  CHECK(r.not_adaptable == std::vector<std::string>{"plain"});  // every mpx linear: the plain one listed, left alone
  fails([&] { mpx::lora::apply(*fresh, o); }, "has an adapter already");
}

TEST_CASE("fold and merged give W + alpha/r·B·A within 1e-6, and the merged model's output", "[lora]")
{
  torch::manual_seed(3);
  tiny_tp::Model m(lora_config, 0, lora_config.layers);
  mpx::lora::Options o;
  o.rank = 4, o.alpha = 16;
  mpx::lora::apply(*m, o);
  {
    torch::NoGradGuard ng;
    for (auto& p : m->named_parameters())
      if (p.key().ends_with("lora_b")) p.value().normal_(0, 0.1);
  }
  const auto batch = tiny::make_batch(lora_config, 4, 0, 0, 1);
  const auto adapted = m(batch.tokens).detach();
  std::map<std::string, at::Tensor> named;
  for (auto& p : m->named_parameters()) named[p.key()] = p.value().detach().clone();
  const auto merged = mpx::lora::merged(named, o.alpha);
  for (auto& [n, t] : merged) CHECK(!mpx::lora::is_adapter(n));
  CHECK(merged.size() + 18 == named.size());
  const auto want = named.at("blocks.0.qkv.weight") + 4.0 * named.at("blocks.0.qkv.lora_b").mm(named.at("blocks.0.qkv.lora_a"));
  CHECK((merged.at("blocks.0.qkv.weight") - want).abs().max().item<double>() <= 1e-6);
  // fold: the same weights in place, B zero, the output unchanged
  mpx::lora::fold(*m);
  for (auto& [n, t] : merged) CHECK((m->named_parameters()[n] - t).abs().max().item<double>() <= 1e-6);
  CHECK(m->head->lora.b.abs().sum().item<double>() == 0);
  CHECK(torch::allclose(m(batch.tokens).detach(), adapted, 1e-5, 1e-5));
  // a piece (not whole) is refused by name
  named["head.lora_b"] = named["head.lora_b"].narrow(0, 0, 8);
  CHECK_THROWS_WITH(mpx::lora::merged(named, o.alpha), Catch::Contains("merge whole tensors"));
}
