// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file examples/moondream/image.hpp
/// Moondream's image preprocessing (moondream-spec.md §6): overlapping crops of a large image, their
/// normalisation and patches, and the stitching of the local crops' features into one grid.
/// Shape legend: H, W image height/width; N crops; C channels; P patches (729 = 27 x 27); D features.

#include "config.hpp"   // moondream::VisionConfig
#include "lanczos.hpp"  // moondream::detail::lanczos_resize

#include <torch/torch.h>  // torch::nn::functional::interpolate

#include <cmath>    // std::ceil, std::floor, std::sqrt
#include <utility>  // std::pair

namespace moondream
{

/// Rows and columns of local crops for an h x w image (§6.2), with md2's geometry unless `v` says otherwise.
inline std::pair<int, int> select_tiling(int h, int w, const VisionConfig& v = {})
{
  const int margin_px = v.overlap_margin * v.enc_patch_size, window_px = (v.grid() - 2 * v.overlap_margin) * v.enc_patch_size;
  const int max = v.max_crops;
  const double H = h - 2 * margin_px, W = w - 2 * margin_px;
  if (H <= window_px || W <= window_px) return {1, 1};
  const int min_h = int(std::ceil(H / window_px)), min_w = int(std::ceil(W / window_px));
  if (min_h * min_w > max) {
    const double r = std::sqrt(double(max) / (min_h * min_w));
    return {std::max(1, int(std::floor(min_h * r))), std::max(1, int(std::floor(min_w * r)))};
  }
  int th = std::max(min_h, int(std::floor(std::sqrt(max * H / W))));
  int tw = std::max(min_w, int(std::floor(std::sqrt(max * W / H))));
  if (th * tw > max) {
    if (tw > th) tw = max / th;
    else th = max / tw;
  }
  return {th, tw};
}

/// The crops of an image: index 0 the whole image at crop x crop, then the local crops row-major.
struct Crops
{
  at::Tensor pixels;  ///< (N, C, crop, crop) uint8
  int rows = 1, cols = 1;
};

namespace detail
{
/// Resizes an (C, H, W) uint8 image to h x w (aspect ratio not kept) with Lanczos-3, as the reference's
/// PIL path does (§6.3; lanczos.hpp).
inline at::Tensor resize(const at::Tensor& img_CHW, int h, int w) { return lanczos_resize(img_CHW, h, w); }
}  // namespace detail

/// Overlapping crops of an (H, W, C) uint8 image (§6.3).
inline Crops overlap_crops(const at::Tensor& img_HWC, const VisionConfig& v = {})
{
  const int crop_size = v.crop_size, margin_px = v.overlap_margin * v.enc_patch_size;
  const int window_px = (v.grid() - 2 * v.overlap_margin) * v.enc_patch_size;
  const int h = int(img_HWC.size(0)), w = int(img_HWC.size(1));
  auto [th, tw] = select_tiling(h, w, v);
  auto chw = img_HWC.permute({2, 0, 1}).contiguous();
  std::vector<at::Tensor> crops{detail::resize(chw, crop_size, crop_size)};
  auto big = detail::resize(chw, th * window_px + 2 * margin_px, tw * window_px + 2 * margin_px);
  for (int i = 0; i < th; ++i)
    for (int j = 0; j < tw; ++j) crops.push_back(big.narrow(1, i * window_px, crop_size).narrow(2, j * window_px, crop_size));
  return {torch::stack(crops), th, tw};
}

/// uint8 crops to [-1, 1]: mean = std = 0.5 per channel, computed in bf16 as the reference does (§6.3.4), then
/// widened to fp32.
inline at::Tensor normalize(const at::Tensor& crops_NCHW)
{
  return ((crops_NCHW.to(torch::kBFloat16) / 255.0 - 0.5) / 0.5).to(torch::kFloat);
}

/// (N, C, 378, 378) to (N, 729, C*14*14): patches row-major; inside a patch channel, then y, then x (§6.3.5).
inline at::Tensor patchify(const at::Tensor& x_NCHW, const VisionConfig& v = {})
{
  const auto N = x_NCHW.size(0), C = x_NCHW.size(1);
  const int grid = v.grid(), patch_size = v.enc_patch_size;
  return x_NCHW.reshape({N, C, grid, patch_size, grid, patch_size})
      .permute({0, 2, 4, 1, 3, 5})
      .reshape({N, grid * grid, C * patch_size * patch_size});
}

/// Stitches the local crops' (rows*cols, 27, 27, D) features into one seamless (19*rows+8, 19*cols+8, D)
/// grid: each tile keeps its rows/cols [4, 23), plus its outer margin on the border of the mosaic (§6.4).
inline at::Tensor reconstruct(const at::Tensor& tiles_T27x27D, int rows, int cols, const VisionConfig& v = {})
{
  const int grid = v.grid(), m = v.overlap_margin, keep = grid - 2 * m;  // 27, 4, 19 for md2
  const auto D = tiles_T27x27D.size(3);
  auto out = torch::zeros({keep * rows + 2 * m, keep * cols + 2 * m, D}, tiles_T27x27D.options());
  for (int t = 0; t < rows * cols; ++t) {
    const int ty = t / cols, tx = t % cols;
    const int y0 = ty == 0 ? 0 : m, y1 = ty == rows - 1 ? grid : grid - m;
    const int x0 = tx == 0 ? 0 : m, x1 = tx == cols - 1 ? grid : grid - m;
    out.narrow(0, ty * keep + y0, y1 - y0).narrow(1, tx * keep + x0, x1 - x0).copy_(tiles_T27x27D[t].narrow(0, y0, y1 - y0).narrow(1, x0, x1 - x0));
  }
  return out;
}

/// The stitched grid pooled back to 27 x 27 and flattened: (729, D).
inline at::Tensor pool_tokens(const at::Tensor& stitched_HWD, const VisionConfig& v = {})
{
  const int grid = v.grid();
  auto x = stitched_HWD.permute({2, 0, 1}).unsqueeze(0);  // (1, D, H, W)
  x = torch::nn::functional::adaptive_avg_pool2d(x, torch::nn::functional::AdaptiveAvgPool2dFuncOptions({grid, grid}));
  return x.squeeze(0).permute({1, 2, 0}).reshape({grid * grid, -1});
}

}  // namespace moondream
