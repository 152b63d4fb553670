// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file optim/quantize.hpp
/// Tensors in 8 bits, block-wise, as AdamW8bit (adamw8bit.hpp) keeps its moments: each block of 256 values
/// keeps its absolute maximum in fp32 and one byte per value, an index into a 256-entry code book — a
/// signed one for the first moment, an unsigned one for the second. Both code books are dynamic:
/// log-spaced from 1e-7 to 0.1, then linear to 1, so small values keep their scale and values near the
/// block maximum keep about 0.5% precision. `CodeLookup` finds a value's nearest code in O(1) for the
/// fused CPU step.

#include <mpx/linkage.hpp>  // MPX_DECL, MPX_DEFINITIONS

#include <torch/torch.h>  // at::Tensor, torch::searchsorted

#include <algorithm>  // std::lower_bound, std::sort
#include <cmath>      // std::pow, std::isnan
#include <cstdint>    // std::int64_t, std::uint16_t
#include <cstring>    // std::memcpy
#include <vector>     // std::vector

namespace mpx
{

namespace detail
{
/// The code books: 256 sorted values in [-1, 1] (signed) or [0, 1] (unsigned).
MPX_DECL at::Tensor dynamic_code(bool is_signed);
MPX_DECL const at::Tensor& signed_code();
MPX_DECL const at::Tensor& unsigned_code();
}  // namespace detail

/// A tensor in 8 bits, block-wise (see the file comment).
struct Quantized
{
  at::Tensor codes;   ///< uint8, numel rounded up to whole blocks
  at::Tensor absmax;  ///< fp32, one per block
  std::int64_t numel = 0;
};

inline constexpr std::int64_t quant_block = 256;

/// Quantizes `x` with the code book `code` (ascending).
MPX_DECL Quantized quantize(const at::Tensor& x, const at::Tensor& code);

/// The fp32 values of a quantized tensor, in `shape`.
MPX_DECL at::Tensor dequantize(const Quantized& q, const at::Tensor& code, at::IntArrayRef shape);

namespace detail
{
/// Nearest-code lookup in O(1): a table indexed by the upper 16 bits of a float (sign, exponent, 7
/// mantissa bits) gives the first code at or above the bucket's smallest value; a value then needs at
/// most a step or two forward. Ties go to the lower code, as in `quantize`.
struct CodeLookup
{
  std::vector<float> code;
  std::vector<std::uint16_t> first;  // per bucket: first index with code >= the bucket's minimum
  explicit CodeLookup(const at::Tensor& c);
  int operator()(float x) const;
};
MPX_DECL const CodeLookup& signed_lookup();
MPX_DECL const CodeLookup& unsigned_lookup();
}  // namespace detail

}  // namespace mpx

#if MPX_DEFINITIONS
// ---- definitions (compiled once under MPX_SEPARATE_COMPILATION: linkage.hpp) ----

namespace mpx::detail
{

MPX_DECL at::Tensor dynamic_code(bool is_signed)
{
  std::vector<float> pos;
  const int logs = is_signed ? 32 : 64, lins = is_signed ? 96 : 191;
  for (int j = 0; j < logs; ++j) pos.push_back(float(std::pow(10.0, -7.0 + 6.0 * j / logs)));  // [1e-7, 0.1)
  for (int i = 0; i < lins; ++i) pos.push_back(float(0.1 + 0.9 * i / (lins - 1)));             // [0.1, 1]
  std::vector<float> all{0.0f};
  all.insert(all.end(), pos.begin(), pos.end());
  if (is_signed)
    for (std::size_t k = 1; k < pos.size(); ++k) all.push_back(-pos[k]);  // 127 negatives
  std::sort(all.begin(), all.end());
  return torch::tensor(all);
}

MPX_DECL const at::Tensor& signed_code()
{
  static const at::Tensor c = dynamic_code(true);
  return c;
}

MPX_DECL const at::Tensor& unsigned_code()
{
  static const at::Tensor c = dynamic_code(false);
  return c;
}

}  // namespace mpx::detail

namespace mpx
{

MPX_DECL Quantized quantize(const at::Tensor& x, const at::Tensor& code)
{
  Quantized q;
  q.numel = x.numel();
  auto flat = x.detach().reshape(-1).to(torch::kFloat);
  const std::int64_t blocks = (q.numel + quant_block - 1) / quant_block;
  if (blocks * quant_block != q.numel) flat = torch::cat({flat, torch::zeros({blocks * quant_block - q.numel}, flat.options())});
  const at::Tensor c = code.to(flat.device());  // the code book lives on CPU; a CUDA moment needs a copy
  auto b = flat.view({blocks, quant_block});
  q.absmax = b.abs().amax(1).clamp_min(1e-30f);
  auto norm = (b / q.absmax.unsqueeze(1)).clamp(-1, 1);
  auto hi = torch::searchsorted(c, norm).clamp(0, c.numel() - 1);
  auto lo = (hi - 1).clamp_min(0);
  auto nearer_lo = (norm - c.index({lo})).abs() <= (c.index({hi}) - norm).abs();
  q.codes = torch::where(nearer_lo, lo, hi).to(torch::kUInt8);
  return q;
}

MPX_DECL at::Tensor dequantize(const Quantized& q, const at::Tensor& code, at::IntArrayRef shape)
{
  auto v = code.to(q.codes.device()).index({q.codes.to(torch::kLong)}) * q.absmax.unsqueeze(1);
  return v.reshape(-1).narrow(0, 0, q.numel).view(shape);
}

}  // namespace mpx

namespace mpx::detail
{

MPX_DECL CodeLookup::CodeLookup(const at::Tensor& c)
    : code(c.data_ptr<float>(), c.data_ptr<float>() + c.numel()), first(65536)
{
  for (std::uint32_t k = 0; k < 65536; ++k) {
    const std::uint32_t bits = (k & 0x8000) ? ((k << 16) | 0xFFFF) : (k << 16);  // most negative / smallest positive
    float lo;
    std::memcpy(&lo, &bits, 4);
    if (std::isnan(lo)) lo = 0;
    first[k] = std::uint16_t(std::lower_bound(code.begin(), code.end(), lo) - code.begin());
  }
}

MPX_DECL int CodeLookup::operator()(float x) const
{
  std::uint32_t bits;
  std::memcpy(&bits, &x, 4);
  int i = first[bits >> 16];
  const int n = int(code.size());
  while (i < n && code[std::size_t(i)] < x) ++i;
  if (i >= n) return n - 1;
  if (i == 0) return 0;
  return (x - code[std::size_t(i) - 1]) <= (code[std::size_t(i)] - x) ? i - 1 : i;
}

MPX_DECL const CodeLookup& signed_lookup()
{
  static const CodeLookup l(signed_code());
  return l;
}

MPX_DECL const CodeLookup& unsigned_lookup()
{
  static const CodeLookup l(unsigned_code());
  return l;
}

}  // namespace mpx::detail
#endif  // MPX_DEFINITIONS
