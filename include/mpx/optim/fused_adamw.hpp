// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file optim/fused_adamw.hpp
/// `mpx::FusedAdamW`: LibTorch's AdamW — the same options, state, `save`/`load` archive and arithmetic —
/// whose step on a dense fp32 CPU parameter is one pass over the parameter, its gradient and both
/// moments. LibTorch's step runs nine tensor operations per parameter (decay, two for each moment, a
/// square root, a division, an add and the update) and allocates two temporaries; on a small model that
/// is a large share of the step (a 2 × 1M-parameter pipeline: about 2.7 ms of a 12–20 ms step). Anything
/// else — CUDA, half precision, strided or sparse tensors, amsgrad — takes the tensor path below, which is
/// LibTorch's formula. It is `StageOptimizers`' default for `Optimizer<AdamW>` (and a stage without one).
/// The one pass also sums the squares of the gradient it reads (in double): `stepped_grad_sq(p)` gives it
/// after the step, so a trainer that needs the gradient norm only to report it reads no gradient twice.
///
/// Per element, in fp32, in LibTorch's order: p ← p·(1 − lr·wd); m ← m·β1 + (1 − β1)·g;
/// v ← v·β2 + (1 − β2)·g·g; p ← p − lr/c1 · m / (√v / √c2 + ε), with c_k = 1 − β_k^step.

#include <mpx/errors.hpp>  // mpx::config_error
#include <mpx/linkage.hpp>  // MPX_DECL, MPX_DEFINITIONS

#include <torch/torch.h>  // torch::optim::AdamW

#include <ATen/Parallel.h>  // at::parallel_for

#include <cmath>          // std::pow, std::sqrt
#include <cstdint>        // std::int64_t
#include <functional>     // std::plus
#include <memory>         // std::make_unique
#include <optional>       // std::optional
#include <string>         // std::string
#include <unordered_map>  // std::unordered_map

#if defined(__SSE2__)
#include <emmintrin.h>  // _mm_*_ps: four lanes on every x86-64
#endif

namespace mpx
{

namespace detail
{
/// One step's scalars, in fp32 as LibTorch's kernels use them.
struct AdamWStep
{
  float decay, beta1, one_minus_beta1, beta2, one_minus_beta2, sqrt_c2, eps, neg_step;
};

/// The scalars of a step at `step` (counted from 1).
MPX_DECL AdamWStep adamw_step(const torch::optim::AdamWOptions& o, std::int64_t step);

/// The update of elements [i, n) (see the file comment); returns the sum of their gradients' squares.
MPX_DECL double adamw_tail(float* p, const float* g, float* m, float* v, std::int64_t i, std::int64_t n, const AdamWStep& k);

/// The update of elements [0, n), four at a time where the CPU has SSE2 (explicit lanes, because GCC
/// does not vectorise std::sqrt without -fno-math-errno); returns the sum of the gradients' squares.
MPX_DECL double adamw_span(float* p, const float* g, float* m, float* v, std::int64_t n, const AdamWStep& k);
}  // namespace detail

/// AdamW with a one-pass CPU step (see the file comment).
class FusedAdamW : public torch::optim::AdamW
{
 public:
  using torch::optim::AdamW::AdamW;

  at::Tensor step(LossClosure closure = nullptr) override;

  /// The sum of the squares of `p`'s gradient as the last `step` read it, when that step took the one
  /// pass for `p` (else nothing: the caller sums them itself).
  std::optional<double> stepped_grad_sq(const at::Tensor& p) const;

  /// Whether parameter `p`'s steps take the one-pass path: a dense contiguous fp32 CPU parameter with a
  /// gradient of its shape, no amsgrad.
  static bool fusable(const at::Tensor& p, const torch::optim::AdamWOptions& o);

 private:
  void step_one(at::Tensor& p, const torch::optim::AdamWOptions& o);

  /// The parameter's state, created (zero moments, step 0) on its first step.
  torch::optim::AdamWParamState& state_of(const at::Tensor& p, const torch::optim::AdamWOptions& o);

  static bool dense_cpu_float(const at::Tensor& t) { return t.layout() == at::kStrided && t.device().is_cpu() && t.scalar_type() == at::kFloat; }
  /// Moments the one pass can write in place (a loaded state might be anything).
  static bool fusable_state(const torch::optim::AdamWParamState& s, const at::Tensor& p);

  /// One pass, shared out across the intra-op threads; returns the sum of the gradient's squares. The writes
  /// bypass the tensors' in-place operations, so the versions autograd checks are bumped here as an
  /// in-place operation would.
  static double step_fused(at::Tensor& p, torch::optim::AdamWParamState& s, const detail::AdamWStep& k);

  /// LibTorch's formula as tensor operations (any device, dtype or layout; amsgrad).
  static void step_tensors(at::Tensor& p, torch::optim::AdamWParamState& s, const torch::optim::AdamWOptions& o);

  static std::string shape(const at::Tensor& t);

  std::unordered_map<const c10::TensorImpl*, double> grad_sq_;  // per parameter the last step took in one pass
};

}  // namespace mpx

#if MPX_DEFINITIONS
// ---- definitions (compiled once under MPX_SEPARATE_COMPILATION: linkage.hpp) ----

namespace mpx::detail
{

MPX_DECL AdamWStep adamw_step(const torch::optim::AdamWOptions& o, std::int64_t step)
{
  const auto [b1, b2] = o.betas();
  const double c1 = 1 - std::pow(b1, double(step)), c2 = 1 - std::pow(b2, double(step));
  return {float(1 - o.lr() * o.weight_decay()), float(b1), float(1 - b1), float(b2), float(1 - b2),
          float(std::sqrt(c2)), float(o.eps()), float(-o.lr() / c1)};
}

MPX_DECL double adamw_tail(float* p, const float* g, float* m, float* v, std::int64_t i, std::int64_t n, const AdamWStep& k)
{
  double sq = 0;
  for (; i < n; ++i) {
    const float gi = g[i];
    sq += double(gi) * double(gi);
    const float mi = m[i] * k.beta1 + k.one_minus_beta1 * gi;
    const float vi = v[i] * k.beta2 + k.one_minus_beta2 * gi * gi;
    m[i] = mi, v[i] = vi;
    p[i] = p[i] * k.decay + k.neg_step * (mi / (std::sqrt(vi) / k.sqrt_c2 + k.eps));
  }
  return sq;
}

MPX_DECL double adamw_span(float* p, const float* g, float* m, float* v, std::int64_t n, const AdamWStep& k)
{
  std::int64_t i = 0;
  double sq = 0;
#if defined(__SSE2__)
  __m128d sq_lo = _mm_setzero_pd(), sq_hi = _mm_setzero_pd();
  const __m128 b1 = _mm_set1_ps(k.beta1), omb1 = _mm_set1_ps(k.one_minus_beta1), b2 = _mm_set1_ps(k.beta2),
               omb2 = _mm_set1_ps(k.one_minus_beta2), sc2 = _mm_set1_ps(k.sqrt_c2), eps = _mm_set1_ps(k.eps),
               step = _mm_set1_ps(k.neg_step), decay = _mm_set1_ps(k.decay);
  for (; i + 4 <= n; i += 4) {
    const __m128 gi = _mm_loadu_ps(g + i);
    const __m128d g_lo = _mm_cvtps_pd(gi), g_hi = _mm_cvtps_pd(_mm_movehl_ps(gi, gi));
    sq_lo = _mm_add_pd(sq_lo, _mm_mul_pd(g_lo, g_lo));
    sq_hi = _mm_add_pd(sq_hi, _mm_mul_pd(g_hi, g_hi));
    const __m128 mi = _mm_add_ps(_mm_mul_ps(_mm_loadu_ps(m + i), b1), _mm_mul_ps(omb1, gi));
    const __m128 vi = _mm_add_ps(_mm_mul_ps(_mm_loadu_ps(v + i), b2), _mm_mul_ps(_mm_mul_ps(omb2, gi), gi));
    _mm_storeu_ps(m + i, mi);
    _mm_storeu_ps(v + i, vi);
    const __m128 denom = _mm_add_ps(_mm_div_ps(_mm_sqrt_ps(vi), sc2), eps);
    _mm_storeu_ps(p + i, _mm_add_ps(_mm_mul_ps(_mm_loadu_ps(p + i), decay), _mm_mul_ps(step, _mm_div_ps(mi, denom))));
  }
  double lanes[2];
  _mm_storeu_pd(lanes, _mm_add_pd(sq_lo, sq_hi));
  sq = lanes[0] + lanes[1];
#endif
  return sq + adamw_tail(p, g, m, v, i, n, k);
}

}  // namespace mpx::detail

namespace mpx
{

MPX_DECL at::Tensor FusedAdamW::step(LossClosure closure)
{
  at::NoGradGuard no_grad;
  grad_sq_.clear();
  at::Tensor loss;
  if (closure) {
    at::AutoGradMode grad_on(true);
    loss = closure();
  }
  for (auto& group : param_groups()) {
    const auto& o = static_cast<const torch::optim::AdamWOptions&>(group.options());
    for (auto& p : group.params())
      if (p.grad().defined()) step_one(p, o);
  }
  return loss;
}

MPX_DECL std::optional<double> FusedAdamW::stepped_grad_sq(const at::Tensor& p) const
{
  const auto it = grad_sq_.find(p.unsafeGetTensorImpl());
  if (it == grad_sq_.end()) return std::nullopt;
  return it->second;
}

MPX_DECL bool FusedAdamW::fusable(const at::Tensor& p, const torch::optim::AdamWOptions& o)
{
  const at::Tensor& g = p.grad();
  return !o.amsgrad() && dense_cpu_float(p) && p.is_contiguous() && g.defined() && dense_cpu_float(g) && g.sizes() == p.sizes();
}

MPX_DECL void FusedAdamW::step_one(at::Tensor& p, const torch::optim::AdamWOptions& o)
{
  if (p.grad().is_sparse())
    throw config_error("mpx::FusedAdamW: a parameter of shape " + shape(p) +
                       " has a sparse gradient; AdamW needs dense gradients (use torch::optim::SparseAdam for it)");
  auto& s = state_of(p, o);
  s.step(s.step() + 1);
  if (fusable(p, o) && fusable_state(s, p)) grad_sq_[p.unsafeGetTensorImpl()] = step_fused(p, s, detail::adamw_step(o, s.step()));
  else step_tensors(p, s, o);
}

MPX_DECL torch::optim::AdamWParamState& FusedAdamW::state_of(const at::Tensor& p, const torch::optim::AdamWOptions& o)
{
  auto& slot = state_[c10::guts::to_string(p.unsafeGetTensorImpl())];
  if (!slot) {
    auto s = std::make_unique<torch::optim::AdamWParamState>();
    s->exp_avg(torch::zeros_like(p, at::MemoryFormat::Preserve));
    s->exp_avg_sq(torch::zeros_like(p, at::MemoryFormat::Preserve));
    if (o.amsgrad()) s->max_exp_avg_sq(torch::zeros_like(p, at::MemoryFormat::Preserve));
    slot = std::move(s);
  }
  return static_cast<torch::optim::AdamWParamState&>(*slot);
}

MPX_DECL bool FusedAdamW::fusable_state(const torch::optim::AdamWParamState& s, const at::Tensor& p)
{
  for (const at::Tensor* t : {&s.exp_avg(), &s.exp_avg_sq()})
    if (!t->defined() || !dense_cpu_float(*t) || !t->is_contiguous() || t->sizes() != p.sizes()) return false;
  return true;
}

MPX_DECL double FusedAdamW::step_fused(at::Tensor& p, torch::optim::AdamWParamState& s, const detail::AdamWStep& k)
{
  const at::Tensor g = p.grad().contiguous();
  at::Tensor &m = s.exp_avg(), &v = s.exp_avg_sq();
  for (at::Tensor* t : {&p, &m, &v}) t->unsafeGetTensorImpl()->bump_version();
  float* pp = p.data_ptr<float>();
  const float* gp = g.data_ptr<float>();
  float *mp = m.data_ptr<float>(), *vp = v.data_ptr<float>();
  return at::parallel_reduce(
      0, p.numel(), 1 << 16, 0.0,
      [&](std::int64_t b, std::int64_t e, double) { return detail::adamw_span(pp + b, gp + b, mp + b, vp + b, e - b, k); },
      std::plus<double>());
}

MPX_DECL void FusedAdamW::step_tensors(at::Tensor& p, torch::optim::AdamWParamState& s, const torch::optim::AdamWOptions& o)
{
  const auto [b1, b2] = o.betas();
  const double c1 = 1 - std::pow(b1, double(s.step())), c2 = 1 - std::pow(b2, double(s.step()));
  const at::Tensor& g = p.grad();
  if (o.weight_decay() != 0) p.mul_(1 - o.lr() * o.weight_decay());
  s.exp_avg().mul_(b1).add_(g, 1 - b1);
  s.exp_avg_sq().mul_(b2).addcmul_(g, g, 1 - b2);
  at::Tensor second = s.exp_avg_sq();
  if (o.amsgrad()) second = at::max_out(s.max_exp_avg_sq(), s.max_exp_avg_sq(), s.exp_avg_sq());
  p.addcdiv_(s.exp_avg(), (second.sqrt() / std::sqrt(c2)).add_(o.eps()), -o.lr() / c1);
}

MPX_DECL std::string FusedAdamW::shape(const at::Tensor& t)
{
  std::string out = "[";
  for (auto d : t.sizes()) out += (out.size() > 1 ? ", " : "") + std::to_string(d);
  return out + "]";
}

}  // namespace mpx
#endif  // MPX_DEFINITIONS
