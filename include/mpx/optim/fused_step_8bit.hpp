// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file optim/fused_step_8bit.hpp
/// The CPU kernel of 8-bit AdamW's step (adamw8bit.hpp): one pass over a dense fp32 parameter, its gradient
/// and its two 8-bit moments (quantize.hpp: blocks of 256, dynamic code books), block by block — dequantize,
/// update the moments and the parameter, requantize — where the tensor path makes a full-size fp32 moment
/// and several temporaries. A block with no gradient whose moments are zero (an embedding's rows that no
/// token of the batch used) gets the weight decay alone, as the arithmetic gives it, bit for bit.

#include <mpx/linkage.hpp>         // MPX_DECL, MPX_DEFINITIONS
#include <mpx/optim/quantize.hpp>  // mpx::Quantized, quant_block, code books and lookups

#include <torch/torch.h>  // at::Tensor

#include <ATen/Parallel.h>  // at::parallel_for

#include <algorithm>  // std::clamp, std::all_of, std::fill, std::min, std::max
#include <cmath>      // std::sqrt, std::abs
#include <cstdint>    // std::int64_t, std::uint8_t

namespace mpx
{

namespace detail
{
/// One AdamW step of a CPU fp32 parameter whose moments are 8-bit, fused block by block: dequantize,
/// update the moments and the parameter, requantize. Same arithmetic as the tensor path, one pass over memory.
MPX_DECL void fused_step_8bit(at::Tensor& p, const at::Tensor& g, Quantized& m8, Quantized& v8, bool first, double lr, double b1, double b2,
                            double eps, double wd, double c1, double c2);
}  // namespace detail

}  // namespace mpx

#if MPX_DEFINITIONS
// ---- definitions (compiled once under MPX_SEPARATE_COMPILATION: linkage.hpp) ----

namespace mpx::detail
{
MPX_DECL void fused_step_8bit(at::Tensor& p, const at::Tensor& g, Quantized& m8, Quantized& v8, bool first, double lr, double b1, double b2,
                            double eps, double wd, double c1, double c2)
{
  const std::int64_t n = p.numel(), blocks = (n + quant_block - 1) / quant_block;
  if (first) {
    m8.codes = torch::empty({blocks * quant_block}, torch::kUInt8), v8.codes = torch::empty({blocks * quant_block}, torch::kUInt8);
    m8.absmax = torch::empty({blocks}), v8.absmax = torch::empty({blocks});
    m8.numel = v8.numel = n;
  }
  const float* sc = signed_code().data_ptr<float>();
  const float* uc = unsigned_code().data_ptr<float>();
  const CodeLookup &sl = signed_lookup(), &ul = unsigned_lookup();
  float* pp = p.data_ptr<float>();
  const float* gp = g.data_ptr<float>();
  std::uint8_t *mc = m8.codes.data_ptr<std::uint8_t>(), *vc = v8.codes.data_ptr<std::uint8_t>();
  float *ma = m8.absmax.data_ptr<float>(), *va = v8.absmax.data_ptr<float>();
  const float fb1 = float(b1), fb2 = float(b2), f1b1 = float(1 - b1), f1b2 = float(1 - b2), decay = float(1 - lr * wd), fc2 = float(c2),
              feps = float(eps), step_size = float(-lr / c1);
  const int zero_s = sl(0.0f), zero_u = ul(0.0f);
  at::parallel_for(0, blocks, 16, [&](std::int64_t b0, std::int64_t b1_) {
    float m[quant_block], v[quant_block];
    for (std::int64_t b = b0; b < b1_; ++b) {
      const std::int64_t off = b * quant_block, len = std::min(quant_block, n - off);
      // A block with no gradient and both moments zero (an embedding's rows no token of the batch used):
      // the moments stay zero and the update is the weight decay alone — what the loop below computes,
      // bit for bit, at a fraction of the cost.
      if (std::all_of(gp + off, gp + off + len, [](float x) { return x == 0.0f; }) &&
          (first || (std::all_of(mc + off, mc + off + quant_block, [&](std::uint8_t c) { return c == zero_s; }) &&
                     std::all_of(vc + off, vc + off + quant_block, [&](std::uint8_t c) { return c == zero_u; })))) {
        for (std::int64_t i = 0; i < len; ++i) pp[off + i] *= decay;
        if (first) std::fill(mc + off, mc + off + quant_block, std::uint8_t(zero_s)), std::fill(vc + off, vc + off + quant_block, std::uint8_t(zero_u));
        ma[b] = va[b] = 1e-30f;
        continue;
      }
      float am = 0, av = 0;
      for (std::int64_t i = 0; i < len; ++i) {
        float mi = first ? 0.0f : sc[mc[off + i]] * ma[b];
        float vi = first ? 0.0f : uc[vc[off + i]] * va[b];
        const float gi = gp[off + i];
        mi = mi * fb1 + f1b1 * gi;
        vi = vi * fb2 + f1b2 * gi * gi;
        float pi = pp[off + i] * decay;
        pp[off + i] = pi + step_size * (mi / (std::sqrt(vi / fc2) + feps));
        m[i] = mi, v[i] = vi;
        am = std::max(am, std::abs(mi)), av = std::max(av, std::abs(vi));
      }
      am = std::max(am, 1e-30f), av = std::max(av, 1e-30f);
      ma[b] = am, va[b] = av;
      for (std::int64_t i = 0; i < quant_block; ++i) {
        if (i < len) {
          mc[off + i] = std::uint8_t(sl(std::clamp(m[i] / am, -1.0f, 1.0f)));
          vc[off + i] = std::uint8_t(ul(std::clamp(v[i] / av, -1.0f, 1.0f)));
        } else {  // padding of the last block: zero, as the tensor path pads
          mc[off + i] = std::uint8_t(zero_s), vc[off + i] = std::uint8_t(zero_u);
        }
      }
    }
  });
}

}  // namespace mpx::detail

#endif  // MPX_DEFINITIONS
