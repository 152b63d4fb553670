// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file quant/formats.hpp
/// A linear's weight (out × in) in fewer bits: the formats of a quantized frozen base (QLoRA, arXiv
/// 2305.14314), of quantization-aware training and of a quantized export. Every format works along the
/// rows (one output feature's weights): a rank that holds whole rows, or a slice of each row cut at a
/// whole number of groups, quantizes its piece exactly as one process quantizes the whole tensor.
/// - `bf16`: the values rounded to bfloat16.
/// - `int8`, `int4`: symmetric integers, one fp32 scale per group of `group` values of a row (0: one per
///   row, "per channel"): scale = max|w| / qmax, q = round(w / scale) in [-qmax, qmax] (qmax 127 or 7).
///   int8 codes are int8; int4 codes are q + 8 in 4 bits, two to a byte (the even column in the low nibble).
/// - `nf4`: NormalFloat-4 of the QLoRA paper: each block of `group` (64) values of a row keeps its absolute
///   maximum c; a value is the index of the nearest of 16 levels (the normal distribution's quantiles,
///   scaled to [-1, 1], 0 exact) to w / c, two to a byte as int4. With `double_quant` the block maxima are
///   quantized again: c = code·step + mean with an int8 code per block and fp32 step and mean per row (the
///   paper uses groups of 256 blocks and 8-bit floats; per row keeps rows independent, as above). About
///   4.16 bits per weight where the paper's groups give 4.13.
/// A row whose length is not a whole number of groups ends in a shorter group (its codes padded). Where a
/// rank holds a slice of each row, the statistics over a whole row (int8/int4 per channel, nf4's double
/// quantization) come from `Rows`, which reduces them over the slices' holders.

#include <mpx/errors.hpp>      // mpx::config_error
#include <mpx/linkage.hpp>     // MPX_DECL, MPX_DEFINITIONS
#include <mpx/quant/spec.hpp>  // mpx::quant::Format, Spec, parse, name_of

#include <torch/torch.h>  // at::Tensor

#include <cstdint>     // std::int64_t
#include <functional>  // std::function
#include <string>      // std::string

namespace mpx::quant
{

/// A weight in a format: what a quantized base holds and a quantized export stores.
struct Packed
{
  Spec spec;
  at::Tensor codes;                  ///< bf16 (out, in); int8 (out, in); int4/nf4 uint8 (out, padded in / 2)
  at::Tensor scales;                 ///< int8/int4 fp32 (out, groups); nf4 fp32 (out, blocks), or int8 codes with double_quant
  at::Tensor scale_step, scale_mean; ///< nf4 with double_quant: fp32 (out, 1)
  std::int64_t cols = 0;             ///< in features (codes may be padded to whole groups)
  bool defined() const { return codes.defined(); }
  /// Bytes held (codes and scales).
  std::int64_t bytes() const;
};

/// Row statistics made whole where each holder has a slice of every row: both reduce a (rows × k) tensor
/// in place over the holders (max: element-wise maximum; sum: element-wise sum). Empty: the rows are whole.
struct Rows
{
  std::function<void(at::Tensor&)> max, sum;
};

/// `w` (out × in) in format `s`; `rows` as above.
MPX_DECL Packed quantize(const at::Tensor& w, const Spec& s, const Rows& rows = {});

/// The weight a packed one stands for, as `dtype` (out × cols).
MPX_DECL at::Tensor dequantize(const Packed& p, at::ScalarType dtype = at::kFloat);

/// dequantize(quantize(w)): what the quantized weight computes with, as w's dtype, without gradient.
MPX_DECL at::Tensor round_trip(const at::Tensor& w, const Spec& s, const Rows& rows = {});

/// NF4's 16 levels, ascending, in [-1, 1] with 0 among them (fp32).
MPX_DECL const at::Tensor& nf4_levels();

}  // namespace mpx::quant

#if MPX_DEFINITIONS
// ---- definitions (compiled once under MPX_SEPARATE_COMPILATION: linkage.hpp) ----
#include <algorithm>  // std::max, std::min
#include <cmath>      // std::sqrt
#include <vector>     // std::vector

namespace mpx::quant
{
namespace detail
{
inline bool is_int(Format f) { return f == Format::int8 || f == Format::int4; }
inline std::int64_t qmax_of(Format f) { return f == Format::int8 ? 127 : 7; }

/// `w` as fp32 (out × in) padded with zeros to whole groups of `g`.
inline at::Tensor padded(const at::Tensor& w, std::int64_t g)
{
  auto f = w.detach().to(at::kFloat).contiguous();
  const std::int64_t pad = (g - f.size(1) % g) % g;
  return pad == 0 ? f : torch::constant_pad_nd(f, {0, pad});
}

/// Values below 16 (uint8, an even count per row) two to a byte, the even column in the low nibble.
inline at::Tensor pack_nibbles(const at::Tensor& n)
{
  const auto v = n.view({n.size(0), -1, 2});
  return (v.select(2, 0) + v.select(2, 1) * 16).contiguous();
}

inline at::Tensor unpack_nibbles(const at::Tensor& p)
{
  return torch::stack({p.remainder(16), p.div(16, "floor")}, 2).view({p.size(0), -1});
}

/// Per row, the maximum of `t` (rows × k, ≥ 0) over the whole row (this slice's, then `rows.max`).
inline at::Tensor row_max(const at::Tensor& t, const Rows& rows)
{
  auto m = std::get<0>(t.max(1, /*keepdim=*/true)).contiguous();
  if (rows.max) rows.max(m);
  return m;
}

/// nf4's block maxima `c` (out × blocks) as stored: fp32, or with double quantization int8 codes, a step
/// and a mean per row; returns the maxima as the dequantizer sees them.
inline at::Tensor quantize_maxima(Packed& p, const at::Tensor& c, const Rows& rows)
{
  if (!p.spec.double_quant) return p.scales = c;
  auto stats = torch::stack({c.to(at::kDouble).sum(1), torch::full({c.size(0)}, double(c.size(1)), c.options().dtype(at::kDouble))}, 1).contiguous();
  if (rows.sum) rows.sum(stats);
  const auto mean = (stats.select(1, 0) / stats.select(1, 1)).to(at::kFloat).unsqueeze(1);
  const auto step = (row_max((c - mean).abs(), rows) / 127).clamp_min(1e-30);
  p.scales = torch::round((c - mean) / step).clamp(-127, 127).to(at::kChar);
  p.scale_step = step, p.scale_mean = mean;
  return p.scales.to(at::kFloat) * step + mean;
}

inline at::Tensor maxima_of(const Packed& p)
{
  return p.spec.double_quant ? p.scales.to(at::kFloat) * p.scale_step + p.scale_mean : p.scales;
}
}  // namespace detail

MPX_DECL std::int64_t Packed::bytes() const
{
  std::int64_t n = 0;
  for (const auto* t : {&codes, &scales, &scale_step, &scale_mean})
    if (t->defined()) n += t->numel() * std::int64_t(t->element_size());
  return n;
}

MPX_DECL const at::Tensor& nf4_levels()
{
  // the paper's construction: quantiles of N(0, 1) at evenly spaced probabilities from 1 - δ to 1/2,
  // δ = (1/32 + 1/30) / 2, eight for the positive half and seven for the negative, 0 between, scaled to ±1
  static const at::Tensor levels = [] {
    const double top = 1 - 0.5 * (1.0 / 32 + 1.0 / 30);
    auto quantile = [](const at::Tensor& p) { return torch::erfinv(p * 2 - 1) * std::sqrt(2.0); };
    const auto pos = quantile(torch::linspace(top, 0.5, 9, torch::kDouble).narrow(0, 0, 8));
    const auto neg = -quantile(torch::linspace(top, 0.5, 8, torch::kDouble).narrow(0, 0, 7));
    auto v = torch::cat({pos, neg, torch::zeros({1}, torch::kDouble)});
    v = std::get<0>((v / v.abs().max()).sort());
    return v.to(at::kFloat);
  }();
  return levels;
}

namespace detail
{
/// Rows per piece: quantize and dequantize work on about 2^20 values at a time, so that their temporaries
/// (int64 indices among them) stay small beside the weight (a vocabulary head's are 100 MiB at width 512).
/// Every holder of a row-parallel linear has the same width: the same pieces, the same reductions.
inline std::int64_t rows_per_piece(std::int64_t cols) { return std::max<std::int64_t>(1, (std::int64_t(1) << 20) / std::max<std::int64_t>(cols, 1)); }

/// quantize's work on whole rows of w (int8, int4, nf4).
inline Packed quantize_rows(const at::Tensor& w, const Spec& s, const Rows& rows)
{
  Packed p;
  p.spec = s, p.cols = w.size(1);
  const std::int64_t g = s.group == 0 ? w.size(1) + w.size(1) % 2 : s.group;
  const auto x = padded(w, g);
  const auto blocks = x.view({x.size(0), -1, g});
  if (is_int(s.format)) {
    const auto amax = s.group == 0 ? row_max(x.abs(), rows).unsqueeze(2) : blocks.abs().amax(2, /*keepdim=*/true);
    const auto scale = (amax / double(qmax_of(s.format))).clamp_min(1e-30);
    const auto q = torch::round(blocks / scale).clamp(-qmax_of(s.format), qmax_of(s.format)).view({x.size(0), -1});
    p.scales = scale.squeeze(2).contiguous();
    p.codes = s.format == Format::int8 ? q.narrow(1, 0, p.cols).to(at::kChar).contiguous() : pack_nibbles((q + 8).to(at::kByte));
    return p;
  }
  const auto c = quantize_maxima(p, blocks.abs().amax(2), rows);  // nf4
  const auto scaled = blocks / torch::where(c > 0, c, torch::ones_like(c)).unsqueeze(2);
  const auto lv = nf4_levels().to(x.device());
  const auto mids = (lv.narrow(0, 0, 15) + lv.narrow(0, 1, 15)) / 2;
  p.codes = pack_nibbles(torch::bucketize(scaled.contiguous(), mids).to(at::kByte).view({x.size(0), -1}));
  return p;
}

/// dequantize's work on a packed piece (int8, int4, nf4), fp32.
inline at::Tensor dequantize_rows(const Packed& p)
{
  const std::int64_t rows = p.codes.size(0);
  at::Tensor values;  // (rows, padded cols) before scaling
  if (p.spec.format == Format::int8) values = p.codes.to(at::kFloat);
  else if (p.spec.format == Format::int4) values = unpack_nibbles(p.codes).to(at::kFloat) - 8;
  else values = nf4_levels().to(p.codes.device()).take(unpack_nibbles(p.codes).to(at::kLong));
  const auto scale = p.spec.format == Format::nf4 ? maxima_of(p) : p.scales;
  const std::int64_t groups = scale.size(1);
  if (values.size(1) < groups) throw config_error("mpx::quant::dequantize: " + c10::str(values.sizes()) + " codes for " + std::to_string(groups) + " scales");
  const std::int64_t width = p.spec.group == 0 ? values.size(1) : p.spec.group;
  if (values.size(1) != groups * width) values = torch::constant_pad_nd(values, {0, groups * width - values.size(1)});
  return (values.view({rows, groups, width}) * scale.unsqueeze(2)).view({rows, -1}).narrow(1, 0, p.cols);
}

/// Rows [from, from + n) of a packed weight.
inline Packed rows_of(const Packed& p, std::int64_t from, std::int64_t n)
{
  Packed part = p;
  for (auto* t : {&part.codes, &part.scales, &part.scale_step, &part.scale_mean})
    if (t->defined()) *t = t->narrow(0, from, n);
  return part;
}
}  // namespace detail

MPX_DECL Packed quantize(const at::Tensor& w, const Spec& s, const Rows& rows)
{
  torch::NoGradGuard ng;
  if (w.dim() != 2) throw config_error("mpx::quant::quantize: a linear's weight (out × in) is 2-d; got " + c10::str(w.sizes()));
  if (!s.defined()) throw config_error("mpx::quant::quantize: format fp32 keeps the weight as it is; nothing to quantize");
  if (s.format != Format::bf16 && (s.group < 0 || s.group == 1 || s.group % 2 != 0 || (s.format == Format::nf4 && s.group == 0)))
    throw config_error("mpx::quant::quantize: group " + std::to_string(s.group) + " for " + name_of(s) + ": give an even group of at least 2" +
                       (s.format == Format::nf4 ? "" : ", or 0 for one scale per row"));
  if (s.format == Format::bf16) {
    Packed p;
    p.spec = s, p.cols = w.size(1), p.codes = w.detach().to(at::kBFloat16).contiguous();
    return p;
  }
  const std::int64_t step = detail::rows_per_piece(w.size(1));
  std::vector<Packed> parts;
  for (std::int64_t r = 0; r < w.size(0) || parts.empty(); r += step) parts.push_back(detail::quantize_rows(w.narrow(0, r, std::min(step, w.size(0) - r)), s, rows));
  if (parts.size() == 1) return parts.front();
  Packed p = parts.front();
  auto joined = [&](at::Tensor Packed::*t) {
    std::vector<at::Tensor> ts;
    for (auto& q : parts) ts.push_back(q.*t);
    return torch::cat(ts, 0);
  };
  p.codes = joined(&Packed::codes), p.scales = joined(&Packed::scales);
  if (p.scale_step.defined()) p.scale_step = joined(&Packed::scale_step), p.scale_mean = joined(&Packed::scale_mean);
  return p;
}

MPX_DECL at::Tensor dequantize(const Packed& p, at::ScalarType dtype)
{
  torch::NoGradGuard ng;
  if (!p.defined()) throw config_error("mpx::quant::dequantize: no packed weight");
  if (p.spec.format == Format::bf16) return p.codes.to(dtype);
  const std::int64_t rows = p.codes.size(0), step = detail::rows_per_piece(p.cols);
  auto out = torch::empty({rows, p.cols}, p.codes.options().dtype(dtype));
  for (std::int64_t r = 0; r < rows; r += step) {
    const std::int64_t n = std::min(step, rows - r);
    out.narrow(0, r, n).copy_(detail::dequantize_rows(detail::rows_of(p, r, n)));
  }
  return out;
}

MPX_DECL at::Tensor round_trip(const at::Tensor& w, const Spec& s, const Rows& rows)
{
  if (!s.defined()) return w.detach();
  return dequantize(quantize(w, s, rows), w.scalar_type());
}

}  // namespace mpx::quant
#endif  // MPX_DEFINITIONS
