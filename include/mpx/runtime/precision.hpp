// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file runtime/precision.hpp
/// Mixed precision. `AutocastGuard` turns on autocast for one region (a `Precision<BF16>` stage's forward
/// and its recomputation): bf16 on CPU and CUDA, fp16 on CUDA only (LibTorch's CPU autocast is bf16-only).
/// Master weights and gradients stay fp32. `LossScaler` is the dynamic loss scale (LibTorch has no C++
/// GradScaler): the trainer multiplies the loss by `scale()`, divides the gradients back, and every rank
/// of the pipeline and of the replicas agrees on whether any gradient was inf/NaN, so all skip the same
/// step; then the scale backs off, and it grows again after `interval` good steps.
///
/// NOTE: in LibTorch 1.13, `nn::LayerNorm` with fp32 weights fails on a bf16 input under CPU autocast;
/// run norms in fp32 inside the region: `mpx::AutocastGuard off(at::kCPU, false); ln(x.to(torch::kFloat))`.

#include <mpx/torch/version.hpp>  // MPX_TORCH_AT_LEAST

#include <ATen/autocast_mode.h>  // at::autocast
#include <torch/torch.h>         // at::ScalarType

namespace mpx
{

/// RAII autocast for one device type; nests (an inner guard with `enabled = false` makes an fp32 region).
class AutocastGuard
{
 public:
  AutocastGuard(c10::DeviceType device, bool enabled, at::ScalarType dtype = at::kBFloat16) : device_(device)
  {
#if MPX_TORCH_AT_LEAST(2, 4)
    was_enabled_ = at::autocast::is_autocast_enabled(device);
    was_dtype_ = at::autocast::get_autocast_dtype(device);
    at::autocast::set_autocast_dtype(device, dtype);
    at::autocast::set_autocast_enabled(device, enabled);
#else
    if (device == c10::DeviceType::CPU) {
      was_enabled_ = at::autocast::is_cpu_enabled();
      was_dtype_ = at::autocast::get_autocast_cpu_dtype();
      at::autocast::set_autocast_cpu_dtype(dtype);  // first: it throws for dtypes CPU autocast lacks
      at::autocast::set_cpu_enabled(enabled);
    } else {
      was_enabled_ = at::autocast::is_enabled();
      was_dtype_ = at::autocast::get_autocast_gpu_dtype();
      at::autocast::set_autocast_gpu_dtype(dtype);
      at::autocast::set_enabled(enabled);
    }
#endif
    at::autocast::increment_nesting();
  }
  ~AutocastGuard()
  {
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
#if MPX_TORCH_AT_LEAST(2, 4)
    at::autocast::set_autocast_enabled(device_, was_enabled_);
    at::autocast::set_autocast_dtype(device_, was_dtype_);
#else
    if (device_ == c10::DeviceType::CPU) {
      at::autocast::set_cpu_enabled(was_enabled_);
      at::autocast::set_autocast_cpu_dtype(was_dtype_);
    } else {
      at::autocast::set_enabled(was_enabled_);
      at::autocast::set_autocast_gpu_dtype(was_dtype_);
    }
#endif
  }
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  c10::DeviceType device_;
  bool was_enabled_ = false;
  at::ScalarType was_dtype_ = at::kBFloat16;
};

/// How the loss is scaled (configuration: `TrainOptions::scaler`); the running scale is `LossScaler`'s.
struct LossScaling
{
  bool enabled = false;
  double init = 65536.0;   ///< the first scale
  double growth = 2.0;     ///< factor after `interval` good steps
  double backoff = 0.5;    ///< factor after a step with an inf/NaN gradient
  long interval = 2000;    ///< good steps before the scale grows
};

/// Dynamic loss scaling (see the file comment): the running state of one run, built from its `LossScaling`.
class LossScaler
{
 public:
  explicit LossScaler(LossScaling config = {}) : c_(config), scale_(config.init) {}

  const LossScaling& config() const { return c_; }
  bool enabled() const { return c_.enabled; }
  double scale() const { return c_.enabled ? scale_ : 1.0; }
  long skipped() const { return skipped_; }
  long good_steps() const { return good_; }
  /// Restores the state a checkpoint recorded (scale, skipped and good steps since the last change).
  void restore(double scale, long skipped, long good)
  {
    if (c_.enabled) scale_ = scale;
    skipped_ = skipped;
    good_ = good;
  }

  /// After the ranks agreed on `found_inf`: true if the step must be skipped.
  bool update(bool found_inf)
  {
    if (!c_.enabled) return found_inf;
    if (found_inf) {
      scale_ *= c_.backoff;
      good_ = 0;
      ++skipped_;
      return true;
    }
    if (++good_ >= c_.interval) {
      scale_ *= c_.growth;
      good_ = 0;
    }
    return false;
  }

 private:
  LossScaling c_;
  double scale_;
  long good_ = 0;
  long skipped_ = 0;
};

}  // namespace mpx
