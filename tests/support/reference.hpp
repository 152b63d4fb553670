// SPDX-License-Identifier: Apache-2.0
#pragma once
// The single-process reference every runtime test compares against: the tiny model's stages chained in one
// process, micro-batch after micro-batch, on the same data with the same optimizer, learning rate and
// clipping as the trainer. One helper for the multi-process parity tests (runtime.test.cpp) and the
// on-device test (on_device.test.cpp).
#include "tiny_transformer.hpp"

#include <mpx/mpx.hpp>

#include <cmath>
#include <memory>
#include <vector>

namespace test
{
/// How the reference trains.
struct ReferenceOptions
{
  mpx::WarmupCosine lr;
  double clip_norm = 0;
  long steps = 5;
  int rows = 12;          ///< batch rows per replica
  int microbatches = 4;   ///< per replica
  int replicas = 1;       ///< a data-parallel run's global batch, replica slice by replica slice
  long skip_step = -1;    ///< the step whose update is skipped everywhere (an inf under the loss scaler)
  bool bf16 = false;      ///< each stage's forward under bf16 autocast, as on the ranks
};

/// What each step measured.
struct ReferenceRun
{
  std::vector<double> losses, grad_norms;
};

/// Trains `stages` (in order) with their `optimizers` for `o.steps` steps on tiny::make_batch data.
inline ReferenceRun train_reference(std::vector<tiny::Model>& stages, std::vector<std::unique_ptr<torch::optim::Optimizer>>& optimizers,
                                    const ReferenceOptions& o, const tiny::Config& c)
{
  ReferenceRun run;
  std::vector<at::Tensor> params;
  for (auto& st : stages)
    for (auto& p : st->parameters())
      if (p.requires_grad()) params.push_back(p);  // a frozen stage's get no gradient, not even a zero one
  for (long step = 0; step < o.steps; ++step) {
    // The gradient of the global batch's mean loss, summed replica slice by replica slice (the sum the
    // data-parallel all-reduce forms; with AdamW a different summation order would move the parameters
    // whose exact gradient is zero, such as attention key biases, by rounding noise).
    double total = 0;
    std::vector<std::vector<at::Tensor>> partial;
    for (int r = 0; r < o.replicas; ++r) {
      auto batch = tiny::make_batch(c, o.rows, step, r, o.replicas);
      for (auto& mb : mpx::slice_microbatches(batch, o.microbatches)) {
        auto x = mb.tokens;
        for (auto& st : stages) {  // each stage's forward in its own autocast region, as on the ranks
          mpx::AutocastGuard autocast(c10::DeviceType::CPU, o.bf16, at::kBFloat16);
          x = st->forward(x);
        }
        auto loss = tiny::loss(x, mb) / double(o.microbatches * o.replicas);
        loss.backward();
        total += loss.item<double>();
      }
      partial.emplace_back();
      for (auto& p : params) {
        partial.back().push_back(p.grad().defined() ? p.grad().clone() : torch::zeros_like(p));
        p.mutable_grad() = at::Tensor();
      }
    }
    for (std::size_t k = 0; k < params.size(); ++k) {
      at::Tensor g = partial[0][k].clone();
      for (std::size_t r = 1; r < partial.size(); ++r) g += partial[r][k];
      params[k].mutable_grad() = g;
    }
    double sq = 0;
    for (auto& p : params)
      if (p.grad().defined()) sq += p.grad().to(torch::kDouble).pow(2).sum().item<double>();
    const double norm = std::sqrt(sq);
    if (step != o.skip_step && o.clip_norm > 0 && norm > o.clip_norm)
      for (auto& p : params)
        if (p.grad().defined()) p.mutable_grad().mul_(o.clip_norm / (norm + 1e-6));
    if (step != o.skip_step)  // the step whose gradients were not finite: no update anywhere
      for (auto& opt : optimizers) {
        for (auto& g : opt->param_groups()) g.options().set_lr(o.lr(step));
        opt->step();
      }
    for (auto& p : params) p.mutable_grad() = at::Tensor();
    run.losses.push_back(total);
    run.grad_norms.push_back(norm);
  }
  return run;
}
}  // namespace test
