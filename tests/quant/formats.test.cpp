// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/quant/formats.hpp: names parse and print back; NF4's levels are the paper's; each format's
// round trip stays within half a step of its grid, packs two 4-bit codes to a byte in the documented order,
// handles rows that are not whole groups, and counts its bytes; a row cut in two slices whose statistics
// are reduced between them quantizes exactly as the whole row (what a row-parallel linear relies on).
#include "support/catch_torch.hpp"

#include <mpx/quant/formats.hpp>

#include <vector>

namespace q = mpx::quant;

namespace
{
/// Slice [from, from + n) of every row of `w` quantized as a row-parallel rank does, its row statistics
/// reduced with the other slice's (max, sum), in one process: each slice records its statistics as it
/// computes them, and both are quantized again with the other's until they agree (a statistic may depend on
/// an earlier reduced one: nf4's maxima's spread on their mean).
at::Tensor slice_round_trip(const at::Tensor& w, int64_t from, int64_t n, const q::Spec& s)
{
  const at::Tensor mine = w.narrow(1, from, n), other = w.narrow(1, from == 0 ? n : 0, w.size(1) - n);
  std::vector<at::Tensor> seen[2];  // each slice's own statistics, in the order asked
  auto rows = [&](int me) {
    auto reduce = [&, me](bool is_max) {
      return [&, me, is_max](at::Tensor& t) {
        const std::size_t k = seen[me].size();
        seen[me].push_back(t.clone());
        if (k < seen[1 - me].size()) is_max ? t.copy_(torch::maximum(t, seen[1 - me][k])) : t.add_(seen[1 - me][k]);
      };
    };
    return q::Rows{reduce(true), reduce(false)};
  };
  at::Tensor out;
  for (int round = 0; round < 3; ++round) {
    seen[0].clear();
    out = q::dequantize(q::quantize(mine, s, rows(0)));
    seen[1].clear();
    q::quantize(other, s, rows(1));
  }
  return out;
}
}  // namespace

TEST_CASE("NF4's levels are the normal quantiles of the QLoRA paper: 16, ascending, -1 and 1 at the ends, 0 exact", "[quant]")
{
  const auto& lv = q::nf4_levels();
  REQUIRE(lv.numel() == 16);
  CHECK(lv[0].item<float>() == -1.0f);
  CHECK(lv[15].item<float>() == 1.0f);
  CHECK(lv[7].item<float>() == 0.0f);
  CHECK((lv.narrow(0, 1, 15) > lv.narrow(0, 0, 15)).all().item<bool>());
  // published values (QLoRA appendix E)
  CHECK(lv[8].item<float>() == Approx(0.0795803).margin(1e-6));
  CHECK(lv[14].item<float>() == Approx(0.7229568).margin(1e-6));
  CHECK(lv[1].item<float>() == Approx(-0.6961928).margin(1e-6));
}

TEST_CASE("int8 per channel and int4 per group round trip within half a step, codes in range, two 4-bit codes to a byte", "[quant]")
{
  torch::manual_seed(3);
  const auto w = torch::randn({6, 128});
  SECTION("int8 per channel")
  {
    const auto p = q::quantize(w, q::parse("int8"));
    CHECK(p.codes.scalar_type() == at::kChar);
    CHECK(p.codes.sizes() == w.sizes());
    REQUIRE(p.scales.sizes() == at::IntArrayRef{6, 1});
    CHECK(torch::allclose(p.scales.squeeze(1), std::get<0>(w.abs().max(1)) / 127));
    CHECK(((q::dequantize(p) - w).abs() <= p.scales / 2 + 1e-7).all().item<bool>());
    CHECK(p.bytes() == 6 * 128 + 6 * 4);
  }
  SECTION("int4, groups of 32")
  {
    const auto p = q::quantize(w, q::parse("int4/g32"));
    CHECK(p.codes.scalar_type() == at::kByte);
    CHECK(p.codes.sizes() == at::IntArrayRef{6, 64});
    REQUIRE(p.scales.sizes() == at::IntArrayRef{6, 4});
    const auto step = p.scales.repeat_interleave(32, 1);
    CHECK(((q::dequantize(p) - w).abs() <= step / 2 + 1e-7).all().item<bool>());
    CHECK(p.bytes() == 6 * 64 + 6 * 4 * 4);
  }
  SECTION("the documented nibble order: the even column low, codes q + 8")
  {
    const auto row = torch::tensor({{7.0f, -7.0f, 0.0f, 3.0f}});
    const auto p = q::quantize(row, q::parse("int4/g4"));
    CHECK(p.scales.item<float>() == 1.0f);
    CHECK(p.codes[0][0].item<uint8_t>() == (7 + 8) + 16 * (-7 + 8));
    CHECK(p.codes[0][1].item<uint8_t>() == (0 + 8) + 16 * (3 + 8));
  }
}

TEST_CASE("nf4 puts each value on the nearest level of its block's maximum, double quantization keeps the maxima within half a step", "[quant]")
{
  torch::manual_seed(4);
  const auto w = torch::randn({4, 256}) * 0.02;
  const auto plain = q::quantize(w, q::parse("nf4") /*double quant*/);
  q::Spec single = q::parse("nf4");
  single.double_quant = false;
  const auto exact = q::quantize(w, single);
  REQUIRE(exact.scales.sizes() == at::IntArrayRef{4, 4});
  CHECK(torch::allclose(exact.scales, w.abs().view({4, 4, 64}).amax(2)));
  // nearest level: no level is closer to w / c than the chosen one
  const auto x = (w.view({4, 4, 64}) / exact.scales.unsqueeze(2)).view({4, 256});
  const auto chosen = q::dequantize(exact).view({4, 4, 64}) / exact.scales.unsqueeze(2);
  const auto gaps = (x.unsqueeze(2) - q::nf4_levels().view({1, 1, 16})).abs();
  CHECK(torch::allclose((x - chosen.view({4, 256})).abs(), std::get<0>(gaps.min(2)), 0, 1e-6));
  // double quantization: maxima as int8 codes, a step and mean per row; each within half a step
  CHECK(plain.scales.scalar_type() == at::kChar);
  const auto maxima = plain.scales.to(at::kFloat) * plain.scale_step + plain.scale_mean;
  CHECK(((maxima - exact.scales).abs() <= plain.scale_step / 2 + 1e-9).all().item<bool>());
  CHECK(plain.bytes() == 4 * 128 + 4 * 4 + 4 * 8);
  CHECK(exact.bytes() == 4 * 128 + 4 * 4 * 4);
}

TEST_CASE("on normally distributed weights nf4 errs less than int4 with the same blocks (why QLoRA uses it)", "[quant]")
{
  torch::manual_seed(5);
  const auto w = torch::randn({64, 512});
  const double nf4 = (q::round_trip(w, q::parse("nf4")) - w).pow(2).mean().item<double>();
  const double int4 = (q::round_trip(w, q::parse("int4/g64")) - w).pow(2).mean().item<double>();
  CHECK(nf4 < 0.9 * int4);
}

TEST_CASE("rows that are not whole groups end in a shorter group, and every format keeps the shape and dtype", "[quant]")
{
  torch::manual_seed(6);
  const auto w = torch::randn({3, 70});
  for (const char* f : {"bf16", "int8", "int8/g32", "int4", "int4/g32", "nf4"}) {
    INFO(f);
    const auto back = q::round_trip(w, q::parse(f));
    CHECK(back.sizes() == w.sizes());
    CHECK(back.scalar_type() == at::kFloat);
    CHECK((back - w).abs().max().item<float>() < 0.6f);
    // the last 6 columns quantize as a group of their own
    if (std::string(f) == "int4/g32") CHECK(torch::allclose(back.narrow(1, 64, 6), q::round_trip(w.narrow(1, 64, 6).contiguous(), q::parse("int4/g32"))));
  }
  CHECK(q::round_trip(w.to(at::kBFloat16), q::parse("int4")).scalar_type() == at::kBFloat16);
  CHECK(torch::equal(q::round_trip(w, q::parse("bf16")), w.to(at::kBFloat16).to(at::kFloat)));
}

TEST_CASE("a row cut into two slices at a whole group, its statistics reduced between them, quantizes as the whole row", "[quant]")
{
  torch::manual_seed(7);
  const auto w = torch::randn({5, 256});
  for (const char* f : {"int8", "int4/channel", "int4/g64", "nf4", "int8/g128"}) {
    INFO(f);
    const auto s = q::parse(f);
    const auto whole = q::dequantize(q::quantize(w, s));
    CHECK(torch::equal(slice_round_trip(w, 0, 128, s), whole.narrow(1, 0, 128)));
    CHECK(torch::equal(slice_round_trip(w, 128, 128, s), whole.narrow(1, 128, 128)));
  }
}

TEST_CASE("A weight of more than 2^20 values is packed and unpacked in pieces of whole rows, as its rows alone", "[quant]")
{
  torch::manual_seed(9);
  const auto w = torch::randn({2100, 1000});  // pieces of 1,048 rows: three
  for (const char* f : {"nf4", "int4", "int8"}) {
    INFO(f);
    const auto whole = q::quantize(w, q::parse(f));
    const auto part = q::quantize(w.narrow(0, 1000, 1100).contiguous(), q::parse(f));
    CHECK(whole.codes.size(0) == 2100);
    CHECK(torch::equal(whole.codes.narrow(0, 1000, 1100), part.codes));
    CHECK(torch::equal(whole.scales.narrow(0, 1000, 1100), part.scales));
    CHECK(torch::equal(q::dequantize(whole).narrow(0, 1000, 1100), q::dequantize(part)));
  }
}

TEST_CASE("quant: bad weights and groups are named errors", "[quant]")
{
  CHECK_THROWS_WITH(q::quantize(torch::zeros({2, 2, 2}), q::parse("int8")), Catch::Contains("2-d"));
  CHECK_THROWS_WITH(q::quantize(torch::zeros({2, 4}), q::Spec{q::Format::int4, 3, true}), Catch::Contains("even group"));
  CHECK_THROWS_WITH(q::quantize(torch::zeros({2, 4}), q::Spec{q::Format::nf4, 0, true}), Catch::Contains("even group"));
  CHECK_THROWS_WITH(q::quantize(torch::zeros({2, 4}), q::parse("fp32")), Catch::Contains("nothing to quantize"));
  // an all-zero weight quantizes to zeros, not NaN
  for (const char* f : {"int8", "int4", "nf4"}) CHECK(torch::equal(q::round_trip(torch::zeros({2, 64}), q::parse(f)), torch::zeros({2, 64})));
}
