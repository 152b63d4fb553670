// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file examples/moondream/lanczos.hpp
/// Lanczos-3 resampling of uint8 images, as the reference's PIL path resizes (`Image.resize(size,
/// Image.LANCZOS)`; moondream-spec §6.3): separable, horizontal pass first, each output sample a window of
/// input samples weighted by sinc(x)·sinc(x/3) with the window widened by the downscale factor (so a
/// shrink averages, it does not alias), the weights normalised to sum 1 and applied in 22-bit fixed point
/// with rounding, the intermediate image rounded and clipped to uint8. Written from that description;
/// `tests/image.test.cpp` compares it with Pillow's output on generated images.
/// Shape legend: C channels, H, W input height/width, h, w output height/width.

#include <torch/torch.h>  // at::Tensor

#include <algorithm>  // std::max, std::min
#include <cmath>      // std::sin
#include <cstdint>    // std::int32_t, std::int64_t, std::uint8_t
#include <vector>     // std::vector

namespace moondream::detail
{

inline double lanczos3(double x)
{
  auto sinc = [](double t) {
    if (t == 0) return 1.0;
    const double pt = 3.14159265358979323846 * t;
    return std::sin(pt) / pt;
  };
  return x >= -3 && x < 3 ? sinc(x) * sinc(x / 3) : 0.0;
}

/// For each of `out` output samples over `in` input samples: its first input sample and its weights, in
/// fixed point with `precision_bits` fractional bits.
struct Taps
{
  static constexpr int precision_bits = 32 - 8 - 2;
  std::vector<int> first, count;
  std::vector<std::int32_t> weights;  // out x window
  int window = 0;
};

inline Taps lanczos_taps(int in, int out)
{
  const double scale = double(in) / out, filterscale = std::max(scale, 1.0), support = 3.0 * filterscale;
  Taps t;
  t.window = int(std::ceil(support)) * 2 + 1;
  t.first.resize(std::size_t(out));
  t.count.resize(std::size_t(out));
  t.weights.assign(std::size_t(out) * std::size_t(t.window), 0);
  std::vector<double> k(std::size_t(t.window));
  for (int x = 0; x < out; ++x) {
    const double center = (x + 0.5) * scale, ss = 1.0 / filterscale;
    const int xmin = std::max(int(center - support + 0.5), 0), xmax = std::min(int(center + support + 0.5), in) - xmin;
    double total = 0;
    for (int j = 0; j < xmax; ++j) total += k[std::size_t(j)] = lanczos3((j + xmin - center + 0.5) * ss);
    for (int j = 0; j < xmax; ++j) {
      const double w = total != 0 ? k[std::size_t(j)] / total : 0.0, f = w * double(1 << Taps::precision_bits);
      t.weights[std::size_t(x) * std::size_t(t.window) + std::size_t(j)] = std::int32_t(w < 0 ? f - 0.5 : f + 0.5);
    }
    t.first[std::size_t(x)] = xmin;
    t.count[std::size_t(x)] = xmax;
  }
  return t;
}

/// One pass: resamples the last dimension of a contiguous (rows, in) uint8 array to (rows, out).
inline std::vector<std::uint8_t> lanczos_rows(const std::uint8_t* src, std::int64_t rows, int in, int out, std::int64_t src_stride,
                                              std::int64_t src_step)
{
  const Taps t = lanczos_taps(in, out);
  std::vector<std::uint8_t> dst(std::size_t(rows) * std::size_t(out));
  for (std::int64_t r = 0; r < rows; ++r)
    for (int x = 0; x < out; ++x) {
      std::int64_t acc = std::int64_t(1) << (Taps::precision_bits - 1);  // rounds to nearest
      const std::int32_t* w = t.weights.data() + std::size_t(x) * std::size_t(t.window);
      const std::uint8_t* s = src + r * src_stride + std::int64_t(t.first[std::size_t(x)]) * src_step;
      for (int j = 0; j < t.count[std::size_t(x)]; ++j) acc += std::int64_t(s[j * src_step]) * w[j];
      const std::int64_t v = acc >> Taps::precision_bits;
      dst[std::size_t(r * out + x)] = std::uint8_t(v < 0 ? 0 : v > 255 ? 255 : v);
    }
  return dst;
}

/// Resizes a (C, H, W) uint8 image to (C, h, w) with Lanczos-3 (aspect ratio not kept), as PIL does.
inline at::Tensor lanczos_resize(const at::Tensor& img_CHW, int h, int w)
{
  const auto img = img_CHW.contiguous();
  const int C = int(img.size(0)), H = int(img.size(1)), W = int(img.size(2));
  std::vector<std::uint8_t> mid;  // (C, H, w)
  const std::uint8_t* src = img.data_ptr<std::uint8_t>();
  if (w != W) mid = lanczos_rows(src, std::int64_t(C) * H, W, w, W, 1);
  else mid.assign(src, src + std::size_t(C) * H * W);
  auto out = torch::empty({C, h, w}, torch::kByte);
  std::uint8_t* dst = out.data_ptr<std::uint8_t>();
  if (h == H) {
    std::copy(mid.begin(), mid.end(), dst);
    return out;
  }
  // vertical: each column of each channel is a "row" with stride w between its samples
  for (int c = 0; c < C; ++c) {
    const std::uint8_t* plane = mid.data() + std::size_t(c) * H * w;
    const auto col = lanczos_rows(plane, w, H, h, 1, w);  // (w, h): column x, output row y
    for (int x = 0; x < w; ++x)
      for (int y = 0; y < h; ++y) dst[(std::size_t(c) * h + y) * w + x] = col[std::size_t(x) * h + y];
  }
  return out;
}

}  // namespace moondream::detail
