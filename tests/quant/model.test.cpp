// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/quant/model.hpp (and tp/quantized.hpp's arithmetic) in one process: quantize_frozen packs
// every frozen linear (its parameter emptied, its codes buffers), the forward and the input's gradient are
// those of the dequantized weight, adapters train on it, Unpacked gives the weights back for a while;
// fake_quantize's forward is the round trip and its gradient passes straight through; misuse is a named
// error. Under tensor parallelism: tp/tp.test.cpp ("[quant]").
#include "support/catch_torch.hpp"
#include "support/tiny_tp_transformer.hpp"

#include <mpx/quant/model.hpp>

#include <set>

namespace q = mpx::quant;

namespace
{
const tiny::Config quant_config{32, 16, 4, 2, 8};

int64_t packed_linears(torch::nn::Module& m)
{
  int64_t n = 0;
  for (auto& b : m.named_buffers())
    if (b.key().ends_with("weight_codes")) ++n;
  return n;
}
}  // namespace

TEST_CASE("quantize_frozen packs every frozen linear: its parameter emptied, its output the dequantized weight's", "[quant]")
{
  torch::manual_seed(2);
  mpx::tp::ColumnLinear fc(64, 8);
  mpx::tp::RowLinear row(64, 8);
  const auto x = torch::randn({3, 5, 64});
  for (auto* m : {static_cast<torch::nn::Module*>(fc.get()), static_cast<torch::nn::Module*>(row.get())}) {
    for (auto& p : m->parameters()) p.requires_grad_(false);
  }
  const auto w_fc = fc->weight.detach().clone(), w_row = row->weight.detach().clone();
  const auto r1 = q::quantize_frozen(*fc, q::parse("nf4"));
  const auto r2 = q::quantize_frozen(*row, q::parse("int8"));
  CHECK(r1.linears.size() == 1);
  CHECK(r1.bytes_before == 64 * 8 * 4);
  CHECK(r1.bytes_after == 8 * 32 + 8 * 1 + 8 * 8);  // codes, block maxima (int8), step and mean per row
  CHECK(r2.bytes_after == 8 * 64 + 8 * 4);
  CHECK(fc->weight.numel() == 0);
  CHECK(row->weight.numel() == 0);
  CHECK(packed_linears(*fc) == 1);
  const auto x1 = x.clone().requires_grad_(true), x2 = x.clone().requires_grad_(true);
  const auto dq = q::round_trip(w_fc, q::parse("nf4"));
  const auto y = fc(x1);
  CHECK(torch::allclose(y, torch::nn::functional::linear(x, dq, fc->bias), 1e-6, 1e-6));
  // the input's gradient: that of the dequantized weight (dequantized again in the backward)
  y.pow(2).sum().backward();
  torch::nn::functional::linear(x2, dq, fc->bias).pow(2).sum().backward();
  CHECK(torch::allclose(x1.grad(), x2.grad(), 1e-6, 1e-6));
  CHECK(torch::allclose(row(x), torch::nn::functional::linear(x, q::round_trip(w_row, q::parse("int8")), row->bias), 1e-6, 1e-6));
  // nf4 stays close to the weight it stands for (a few percent of the output's scale)
  const auto exact = torch::nn::functional::linear(x, w_fc, fc->bias);
  CHECK(((y - exact).norm() / exact.norm()).item<double>() < 0.2);
}

TEST_CASE("QLoRA on the tiny transformer: adapters train on the packed base, Unpacked gives the weights back for a while", "[quant][lora]")
{
  torch::manual_seed(1);
  tiny_tp::Model m(quant_config, 0, quant_config.layers);
  tiny_tp::add_adapters(*m);
  std::map<std::string, at::Tensor> before;
  for (auto& p : m->named_parameters()) before[p.key()] = p.value().detach().clone();
  const auto r = q::quantize_frozen(*m, q::parse("nf4/g8"));
  CHECK(r.linears.size() == std::size_t(4 * quant_config.layers + 1));  // qkv, proj, fc1, fc2 per block, and the head
  CHECK(packed_linears(*m) == int64_t(r.linears.size()));
  // 6,656 weights: 4 bits each, an int8 block maximum per 8, a step and a mean per row (320 rows)
  CHECK(r.bytes_before == 6656 * 4);
  CHECK(r.bytes_after == 6656 / 2 + 6656 / 8 + 320 * 8);
  const auto batch = tiny::make_batch(quant_config, 4, 0, 0, 1);
  auto loss = tiny_tp::loss(m(batch.tokens), batch);
  loss.backward();
  for (auto& p : m->named_parameters()) {
    CAPTURE(p.key());
    CHECK(p.value().grad().defined() == mpx::lora::is_adapter(p.key()));
    if (mpx::lora::is_adapter(p.key())) CHECK(p.value().grad().abs().sum().item<double>() > 0);
  }
  {
    std::set<std::string> packed;  // "….weight" of each "….weight_codes"
    for (auto& b : m->named_buffers())
      if (b.key().ends_with("weight_codes")) packed.insert(b.key().substr(0, b.key().size() - 6));
    q::Unpacked whole(*m);
    for (auto& p : m->named_parameters()) {
      CAPTURE(p.key());
      const auto& b = before.at(p.key());
      REQUIRE(p.value().sizes() == b.sizes());
      if (packed.count(p.key()))
        CHECK(torch::equal(p.value(), q::round_trip(b, q::parse("nf4/g8"))));
      else
        CHECK(torch::equal(p.value(), b));
    }
    CHECK_THROWS_WITH(mpx::lora::fold(*m), Catch::Contains("held quantized"));
  }
  CHECK(m->blocks->ptr(0)->named_parameters().find("qkv.weight")->numel() == 0);
  // the model still runs, with the same loss, after the window
  CHECK(torch::allclose(tiny_tp::loss(m(batch.tokens), batch), loss));
  CHECK_THROWS_WITH(q::quantize_frozen(*m, q::parse("int8")), Catch::Contains("quantized already"));
}

TEST_CASE("quantize_frozen leaves trained linears alone, fake_quantize's forward is the round trip, its gradient straight through", "[quant]")
{
  torch::manual_seed(3);
  mpx::tp::ColumnLinear fc(32, 6);
  CHECK(q::quantize_frozen(*fc, q::parse("nf4/g8")).linears.empty());  // it trains: nothing packed
  const auto r = q::fake_quantize(*fc, q::parse("int4/g8"));
  CHECK(r.linears.size() == 1);
  CHECK(r.bytes_after == 6 * 16 + 6 * 4 * 4);
  const auto x = torch::randn({4, 32});
  const auto y = fc(x);
  const auto wq = q::round_trip(fc->weight, q::parse("int4/g8")).requires_grad_(true);
  const auto y2 = torch::nn::functional::linear(x, wq, fc->bias);
  CHECK(torch::allclose(y, y2, 1e-6, 1e-6));
  y.pow(2).sum().backward();
  y2.pow(2).sum().backward();
  CHECK(torch::allclose(fc->weight.grad(), wq.grad(), 1e-6, 1e-6));  // straight through: the quantized weight's gradient
  CHECK_THROWS_WITH(q::fake_quantize(*fc, q::parse("nf4")), Catch::Contains("int8 or int4"));
  for (auto& p : fc->parameters()) p.requires_grad_(false);
  mpx::tp::ColumnLinear frozen(32, 6);
  frozen->weight.requires_grad_(false);
  CHECK(q::fake_quantize(*frozen, q::parse("int8")).linears.empty());
  CHECK_THROWS_WITH(frozen->fake_quantize(q::parse("int8")), Catch::Contains("frozen"));
}
