// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file runtime/checkpoint/optimizer_state.hpp
/// An optimizer's state as named tensors, `<parameter name>/<field>`, so that it is saved beside the
/// parameters in safetensors and moves with them when a checkpoint loads into another layout (recut.hpp).
///
/// | optimizer | fields per parameter |
/// |---|---|
/// | `torch::optim::AdamW` | `step`, `exp_avg`, `exp_avg_sq` (and `max_exp_avg_sq` under amsgrad) |
/// | `mpx::AdamW8bitOptimizer` | `AdamW8bitOptimizer::Field`: `step`, and `m`, `v` (fp32, small tensors) or `m8`, `m8max`, `v8`, `v8max` |
/// | `torch::optim::SGD` | `momentum_buffer` |
///
/// A parameter without state (no step yet) has no entries. Hyper-parameters are not state: they come from
/// the run's options. Another optimizer (a `TrainOptions::make_optimizer` of the user's) is not known here:
/// `named_optimizer_state` returns nothing and the caller keeps LibTorch's archive.

#include <mpx/optim/adamw8bit.hpp>  // mpx::AdamW8bitOptimizer
#include <mpx/errors.hpp>   // mpx::config_error
#include <mpx/linkage.hpp>  // MPX_DECL, MPX_DEFINITIONS

#include <torch/torch.h>  // torch::optim::AdamW, torch::optim::SGD

#include <map>       // std::map
#include <optional>  // std::optional
#include <string>    // std::string

namespace mpx
{

namespace detail
{
/// How LibTorch's optimizers key a parameter's state.
inline std::string optimizer_key(const at::Tensor& p) { return c10::guts::to_string(p.unsafeGetTensorImpl()); }

/// Whether `opt` is a kind whose state `named_optimizer_state` names (else it keeps LibTorch's archive).
MPX_DECL bool knows_optimizer(torch::optim::Optimizer& opt);

}  // namespace detail

/// `opt`'s state of `params` (name → parameter) as named tensors, or nothing for an optimizer kind this
/// does not know (see the file comment).
MPX_DECL std::optional<std::map<std::string, at::Tensor>> named_optimizer_state(torch::optim::Optimizer& opt,
                                                                              const std::map<std::string, at::Tensor>& params);

/// Sets `opt`'s state of `params` from named tensors (`find(name)`: the tensor, or an undefined one when
/// absent); a parameter with no `step` (AdamW) or `momentum_buffer` (SGD) keeps no state.
template <class Find>
void restore_optimizer_state(torch::optim::Optimizer& opt, const std::map<std::string, at::Tensor>& params, Find&& find)
{
  auto onto = [](const at::Tensor& t, const at::Tensor& p) { return t.to(p.device()).clone(); };
  auto need = [&](const std::string& k, const at::Tensor& p) {
    at::Tensor t = find(k);
    if (!t.defined() || t.sizes() != p.sizes())
      throw config_error("mpx: optimizer state '" + k + "' is missing or of another shape; the checkpoint's optimizer does not match this run's");
    return onto(t, p);
  };
  if (auto* a8 = dynamic_cast<AdamW8bitOptimizer*>(&opt)) {
    for (auto& [n, p] : params) {
      std::map<std::string, at::Tensor> fields;
      for (const char* f : AdamW8bitOptimizer::fields)
        if (at::Tensor t = find(n + "/" + f); t.defined()) fields[f] = t;
      if (fields.count(AdamW8bitOptimizer::Field::step)) a8->set_param_state(p, fields);
    }
  } else if (dynamic_cast<torch::optim::AdamW*>(&opt)) {
    for (auto& [n, p] : params) {
      at::Tensor step = find(n + "/step");
      if (!step.defined()) continue;
      auto s = std::make_unique<torch::optim::AdamWParamState>();
      s->step(step.item<std::int64_t>());
      s->exp_avg(need(n + "/exp_avg", p));
      s->exp_avg_sq(need(n + "/exp_avg_sq", p));
      if (at::Tensor mx = find(n + "/max_exp_avg_sq"); mx.defined()) s->max_exp_avg_sq(onto(mx, p));
      opt.state()[detail::optimizer_key(p)] = std::move(s);
    }
  } else if (dynamic_cast<torch::optim::SGD*>(&opt)) {
    for (auto& [n, p] : params) {
      if (!find(n + "/momentum_buffer").defined()) continue;
      auto s = std::make_unique<torch::optim::SGDParamState>();
      s->momentum_buffer(need(n + "/momentum_buffer", p));
      opt.state()[detail::optimizer_key(p)] = std::move(s);
    }
  } else {
    throw config_error("mpx: restore_optimizer_state: an optimizer kind mpx does not know; its state is a LibTorch archive");
  }
}

}  // namespace mpx

#if MPX_DEFINITIONS
// ---- definitions (compiled once under MPX_SEPARATE_COMPILATION: linkage.hpp) ----

namespace mpx::detail
{

MPX_DECL bool knows_optimizer(torch::optim::Optimizer& opt)
{
  return dynamic_cast<AdamW8bitOptimizer*>(&opt) || dynamic_cast<torch::optim::AdamW*>(&opt) || dynamic_cast<torch::optim::SGD*>(&opt);
}

}  // namespace mpx::detail

namespace mpx
{

MPX_DECL std::optional<std::map<std::string, at::Tensor>> named_optimizer_state(torch::optim::Optimizer& opt,
                                                                              const std::map<std::string, at::Tensor>& params)
{
  std::map<std::string, at::Tensor> out;
  auto state_of = [&](const at::Tensor& p) -> torch::optim::OptimizerParamState* {
    auto it = opt.state().find(detail::optimizer_key(p));
    return it == opt.state().end() ? nullptr : it->second.get();
  };
  if (auto* a8 = dynamic_cast<AdamW8bitOptimizer*>(&opt)) {
    for (auto& [n, p] : params)
      for (auto& [f, t] : a8->param_state(p)) out[n + "/" + f] = t;
  } else if (dynamic_cast<torch::optim::AdamW*>(&opt)) {
    for (auto& [n, p] : params)
      if (auto* s = static_cast<torch::optim::AdamWParamState*>(state_of(p))) {
        out[n + "/step"] = torch::tensor(s->step(), torch::kLong);
        out[n + "/exp_avg"] = s->exp_avg();
        out[n + "/exp_avg_sq"] = s->exp_avg_sq();
        if (s->max_exp_avg_sq().defined()) out[n + "/max_exp_avg_sq"] = s->max_exp_avg_sq();
      }
  } else if (dynamic_cast<torch::optim::SGD*>(&opt)) {
    for (auto& [n, p] : params)
      if (auto* s = static_cast<torch::optim::SGDParamState*>(state_of(p)); s && s->momentum_buffer().defined())
        out[n + "/momentum_buffer"] = s->momentum_buffer();
  } else {
    return std::nullopt;
  }
  return out;
}

}  // namespace mpx
#endif  // MPX_DEFINITIONS
