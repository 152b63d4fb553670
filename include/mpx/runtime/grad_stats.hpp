// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file runtime/grad_stats.hpp
/// The end of a step's arithmetic over gradients: `unscale` divides them by the loss scale, `local_grad_sq`
/// sums their squares on this rank, `reduce_step` (or `start_reduce_step`, then `finish_reduce_step`, to
/// overlap it with an optimizer step that does not depend on it) is the step's one collective over the whole world — the
/// loss (last stage, mean over replicas), the squared global gradient norm (each stage counted once per
/// replica: replicas hold equal gradients after their all-reduce) and the number of ranks that saw an
/// inf/NaN, so that every rank makes the same skip decision — and `clip` scales the gradients so that the
/// global norm is at most the limit. Gradients are given per stage, as lists of parameters. When every rank
/// of the world runs on one host the collective is a sum through shared memory (`ShmSum`, from
/// `make_world_sum`, shm_links.hpp), else a Gloo all-reduce.

#include <mpx/errors.hpp>  // mpx::peer_error
#include <mpx/tp/gradients.hpp>  // mpx::tp::NormTerm
#include <mpx/runtime/wire/shm_sum.hpp>  // mpx::ShmSum
#include <mpx/runtime/world/world.hpp>   // mpx::World
#include <mpx/torch/process_group.hpp>  // mpx::detail::wait_bounded
#include <mpx/linkage.hpp>  // MPX_DECL, MPX_DEFINITIONS

#include <torch/torch.h>  // torch::stack, torch::zeros

#include <cmath>   // std::isfinite, std::sqrt
#include <limits>  // std::numeric_limits
#include <optional>  // std::optional
#include <string>  // std::string
#include <utility>  // std::move
#include <vector>  // std::vector

namespace mpx
{

using StageParameters = std::vector<std::vector<at::Tensor>>;  ///< per stage this rank holds, its parameters

/// Divides every gradient by `scale` (the loss scale), in place.
MPX_DECL void unscale(const StageParameters& stages, double scale);

using StageNormTerms = std::vector<std::vector<tp::NormTerm>>;  ///< per stage this rank holds, what it counts (tp/gradients.hpp)

/// Sum of squares of this rank's gradients (fp32 norms, squared and summed in double; one host sync). An
/// inf/NaN anywhere makes it inf/NaN, so one pass finds both. `summed(param)` may give a whole gradient's
/// sum of squares that was already taken (`StageOptimizers::stepped_grad_sq`: FusedAdamW's pass); those
/// gradients are not read again.
template <class Summed>
double local_grad_sq(const StageNormTerms& stages, Summed&& summed)
{
  double sq = 0;
  std::vector<at::Tensor> norms;
  for (auto& ts : stages)
    for (auto& t : ts) {
      if (!t.param.grad().defined()) continue;
      if (const std::optional<double> known = t.dim < 0 ? summed(t.param) : std::nullopt) sq += *known;
      else norms.push_back(t.grad().norm());
    }
  return norms.empty() ? sq : sq + torch::stack(norms).to(at::kDouble).pow(2).sum().template item<double>();
}
MPX_DECL double local_grad_sq(const StageNormTerms& stages);
MPX_DECL double local_grad_sq(const StageParameters& stages);

/// What the step's collective agreed on, the same on every rank.
struct StepReduction
{
  double loss = 0;          ///< mean loss over the global batch
  double grad_norm = 0;     ///< global gradient norm (inf when some rank saw inf/NaN)
  bool found_inf = false;   ///< some rank's gradients were not finite
};

/// The step's all-reduce over the world, started (see the file comment): `loss_sum` is this replica's
/// summed loss (defined on the last stage's rank only), `sq` this rank's `local_grad_sq`; through `shm`
/// when it is given (every rank must give one, or none).
struct PendingReduction
{
  at::Tensor values;  ///< loss / replicas, squared norm / replicas, ranks that saw inf/NaN
  c10::intrusive_ptr<c10d::Work> work;
  long step = 0;
  ShmSum* shm = nullptr;
};
MPX_DECL PendingReduction start_reduce_step(World& w, const at::Tensor& loss_sum, double sq, long step, ShmSum* shm = nullptr);
/// Waits for a started reduction (with the run's timeout) and reads what every rank agreed on.
MPX_DECL StepReduction finish_reduce_step(World& w, PendingReduction& p);
/// The step's one all-reduce over the world, started and waited for; `step` names the step in errors.
MPX_DECL StepReduction reduce_step(World& w, const at::Tensor& loss_sum, double sq, long step, ShmSum* shm = nullptr);

/// The factor that makes the global norm `norm` at most `limit` (1: no clipping, or `limit` 0).
inline double clip_factor(double norm, double limit) { return limit <= 0 || norm <= limit ? 1.0 : limit / (norm + 1e-6); }

/// Scales every gradient so that the global norm `norm` becomes at most `limit` (0: no clipping).
MPX_DECL void clip(const StageParameters& stages, double norm, double limit);

}  // namespace mpx

#if MPX_DEFINITIONS
// ---- definitions (compiled once under MPX_SEPARATE_COMPILATION: linkage.hpp) ----

namespace mpx
{
MPX_DECL void unscale(const StageParameters& stages, double scale)
{
  for (auto& ps : stages)
    for (auto& p : ps)
      if (p.grad().defined()) p.mutable_grad().mul_(1.0 / scale);
}

MPX_DECL double local_grad_sq(const StageNormTerms& stages)
{
  return local_grad_sq(stages, [](const at::Tensor&) { return std::optional<double>(); });
}

MPX_DECL double local_grad_sq(const StageParameters& stages)
{
  StageNormTerms terms;
  for (auto& ps : stages) terms.emplace_back(ps.begin(), ps.end());
  return local_grad_sq(terms);
}

MPX_DECL PendingReduction start_reduce_step(World& w, const at::Tensor& loss_sum, double sq, long step, ShmSum* shm)
{
  const bool found_inf = !std::isfinite(sq);
  PendingReduction p{torch::empty({3}, torch::kDouble), {}, step, shm};
  auto* v = p.values.data_ptr<double>();
  v[0] = loss_sum.defined() ? loss_sum.template item<double>() / w.replicas : 0.0;
  v[1] = found_inf ? 0.0 : sq / w.replicas;
  v[2] = found_inf ? 1.0 : 0.0;
  if (shm) {
    shm->arrive(v, 3);
    return p;
  }
  std::vector<at::Tensor> rv{p.values};
  try {
    p.work = w.world->allreduce(rv);
  } catch (const std::exception& e) {
    throw peer_error("mpx: rank " + std::to_string(w.env.rank) + ", step " + std::to_string(step) +
                     ", the end-of-step all-reduce (loss, gradient norm) did not start: " + e.what());
  }
  return p;
}

MPX_DECL StepReduction finish_reduce_step(World& w, PendingReduction& p)
{
  if (p.shm) {
    p.shm->finish(p.values.data_ptr<double>(), [&] {
      return "mpx: rank " + std::to_string(w.env.rank) + ", step " + std::to_string(p.step) + ", the end-of-step sum (loss, gradient norm) over shared memory";
    });
  } else {
    try {
      detail::wait_bounded(p.work, p.values.device(), w.timeout);
    } catch (const std::exception& e) {
      throw peer_error("mpx: rank " + std::to_string(w.env.rank) + ", step " + std::to_string(p.step) +
                       ", the end-of-step all-reduce (loss, gradient norm): a peer did not arrive: " + e.what());
    }
  }
  const auto* v = p.values.data_ptr<double>();
  StepReduction r;
  r.loss = v[0];
  r.found_inf = v[2] > 0;
  r.grad_norm = r.found_inf ? std::numeric_limits<double>::infinity() : std::sqrt(v[1]);
  return r;
}

MPX_DECL StepReduction reduce_step(World& w, const at::Tensor& loss_sum, double sq, long step, ShmSum* shm)
{
  auto p = start_reduce_step(w, loss_sum, sq, step, shm);
  return finish_reduce_step(w, p);
}

MPX_DECL void clip(const StageParameters& stages, double norm, double limit)
{
  const double c = clip_factor(norm, limit);
  if (c == 1.0) return;
  for (auto& ps : stages)
    for (auto& p : ps)
      if (p.grad().defined()) p.mutable_grad().mul_(c);
}

}  // namespace mpx
#endif  // MPX_DEFINITIONS
