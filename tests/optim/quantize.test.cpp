// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/optim/quantize.hpp: the code books, the block-wise round trip, the O(1) nearest-code lookup.
#include "support/catch_torch.hpp"

#include <mpx/optim/quantize.hpp>

#include <torch/torch.h>

#include <iostream>

TEST_CASE("Code books: 256 sorted values, 0 and 1 exact", "[quantize]")
{
  for (bool s : {true, false}) {
    const auto& c = s ? mpx::detail::signed_code() : mpx::detail::unsigned_code();
    CHECK(c.numel() == 256);
    CHECK(torch::all(c.slice(0, 1) > c.slice(0, 0, 255)).item<bool>());
    CHECK((c == 0).any().item<bool>());
    CHECK(c.max().item<float>() == 1.0f);
    CHECK(c.min().item<float>() == (s ? -1.0f : 0.0f));
  }
}


TEST_CASE("Block-wise quantisation round trip", "[quantize]")
{
  torch::manual_seed(0);
  auto x = torch::randn({1000, 7}) * torch::logspace(-4, 0, 7);  // columns of very different scale
  auto q = mpx::quantize(x, mpx::detail::signed_code());
  CHECK(q.codes.scalar_type() == torch::kUInt8);
  CHECK(q.codes.numel() == 7168);  // 7000 rounded up to whole blocks of 256
  auto y = mpx::dequantize(q, mpx::detail::signed_code(), x.sizes());
  const double rel = ((y - x).norm() / x.norm()).item<double>();
  std::cout << "8-bit block-wise round trip, signed code book: relative error " << rel << "\n";
  CHECK(rel < 0.02);
  CHECK(torch::equal(x.sign() * (y != 0), y.sign()));  // signs survive
  auto v = x.pow(2);
  auto qv = mpx::quantize(v, mpx::detail::unsigned_code());
  const double relv = ((mpx::dequantize(qv, mpx::detail::unsigned_code(), v.sizes()) - v).norm() / v.norm()).item<double>();
  std::cout << "8-bit block-wise round trip, unsigned code book: relative error " << relv << "\n";
  CHECK(relv < 0.02);
}



TEST_CASE("The fused CPU step's nearest-code lookup equals a search over the code book", "[quantize]")
{
  for (bool is_signed : {true, false}) {
    const auto& code = is_signed ? mpx::detail::signed_code() : mpx::detail::unsigned_code();
    const auto& look = is_signed ? mpx::detail::signed_lookup() : mpx::detail::unsigned_lookup();
    auto x = is_signed ? torch::rand({100000}) * 2 - 1 : torch::rand({100000});
    x = torch::cat({x, x * 1e-4, x * 1e-7, code, (code.narrow(0, 1, 255) + code.narrow(0, 0, 255)) / 2});  // small, exact, midpoints
    const auto q = mpx::quantize(x, code);  // the tensor path: searchsorted
    auto xs = x.contiguous();
    int bad = 0;
    // quantize() normalises by block maxima; compare on the normalised values it used
    const std::int64_t n = x.numel(), blocks = (n + mpx::quant_block - 1) / mpx::quant_block;
    auto padded = torch::cat({xs, torch::zeros({blocks * mpx::quant_block - n})}).view({blocks, mpx::quant_block});
    auto normed = (padded / q.absmax.unsqueeze(1)).clamp(-1, 1).reshape(-1);
    auto codes = q.codes.reshape(-1).to(torch::kLong).contiguous();
    auto na = normed.contiguous();
    const float* xp = na.data_ptr<float>();
    const int64_t* cp = codes.data_ptr<int64_t>();
    for (std::int64_t i = 0; i < n; ++i) bad += look(xp[i]) != cp[i];
    CHECK(bad == 0);
  }
}

