// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file runtime/lr.hpp
/// Learning-rate schedule: linear warm-up from 0 to the peak over `warmup` steps, then cosine decay to
/// `min_ratio * peak` at `total` steps (held there after).

#include <algorithm>  // std::min
#include <cmath>      // std::cos

namespace mpx
{

struct WarmupCosine
{
  double peak = 1e-3;
  long warmup = 0;
  long total = 1;
  double min_ratio = 0.0;

  /// The rate for 0-based optimizer step `step`.
  double operator()(long step) const
  {
    if (warmup > 0 && step < warmup) return peak * double(step + 1) / double(warmup);
    if (total <= warmup) return peak;
    const double t = std::min(1.0, double(step - warmup) / double(total - warmup));
    const double pi = 3.14159265358979323846;
    return peak * (min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + std::cos(pi * t)));
  }
};

}  // namespace mpx
