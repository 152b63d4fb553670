// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file optim/moments.hpp
/// One parameter's optimizer state as fp32 moments shaped like the parameter, by field name, with its step
/// count — the form in which state moves between a parameter and pieces of it (ZeRO's shards:
/// runtime/zero_shard.hpp), for the optimizer kinds mpx builds:
///
/// | optimizer | moments | step |
/// |---|---|---|
/// | `torch::optim::AdamW` (and `mpx::FusedAdamW`) | `exp_avg`, `exp_avg_sq` | its step |
/// | `mpx::AdamW8bitOptimizer` | `m`, `v` (8-bit moments made dense; quantized again on the way in) | its step |
/// | `torch::optim::SGD` | `momentum_buffer` | 1 once it has one |
///
/// Step 0: no state (the parameter has not been stepped). AMSGrad and other kinds are a `config_error`.

#include <mpx/errors.hpp>           // mpx::config_error
#include <mpx/linkage.hpp>          // MPX_DECL, MPX_DEFINITIONS
#include <mpx/optim/adamw8bit.hpp>  // mpx::AdamW8bitOptimizer, mpx::detail::dense_moment
#include <mpx/optim/fused_adamw.hpp>  // mpx::FusedAdamW

#include <torch/torch.h>  // torch::optim::AdamW, torch::optim::SGD

#include <cstdint>  // std::int64_t
#include <map>      // std::map
#include <memory>   // std::unique_ptr
#include <string>   // std::string
#include <vector>   // std::vector

namespace mpx::detail
{

struct Moments
{
  std::int64_t step = 0;                     ///< 0: no state
  std::map<std::string, at::Tensor> fields;  ///< fp32, shaped like the parameter
};

/// The moment fields of `opt`'s kind (the same on every rank: what a collective over them may rely on).
MPX_DECL std::vector<std::string> moment_names(torch::optim::Optimizer& opt);
/// `p`'s state in `opt`.
MPX_DECL Moments moments_of(torch::optim::Optimizer& opt, const at::Tensor& p);
/// Sets `p`'s state in `opt` (a step of 0 leaves it without).
MPX_DECL void set_moments(torch::optim::Optimizer& opt, const at::Tensor& p, const Moments& m);
/// An optimizer of `opt`'s kind over `params` (FusedAdamW for FusedAdamW: its step differs from LibTorch's
/// AdamW's in the last bit), without state, with its first group's options.
MPX_DECL std::unique_ptr<torch::optim::Optimizer> same_kind(torch::optim::Optimizer& opt, const std::vector<at::Tensor>& params);

}  // namespace mpx::detail

#if MPX_DEFINITIONS
// ---- definitions (compiled once under MPX_SEPARATE_COMPILATION: linkage.hpp) ----

namespace mpx::detail
{

[[noreturn]] inline void moments_of_unknown_kind()
{
  throw config_error("mpx: this optimizer's state cannot be cut into shards; a Sharded<L> stage trains with mpx::Optimizer<SGD>, "
                     "<AdamW> or <AdamW8bit> (not TrainOptions::make_optimizer's, nor AMSGrad)");
}
/// How LibTorch's optimizers key a parameter's state.
inline std::string moments_key(const at::Tensor& p) { return c10::guts::to_string(p.unsafeGetTensorImpl()); }

MPX_DECL std::vector<std::string> moment_names(torch::optim::Optimizer& opt)
{
  if (dynamic_cast<AdamW8bitOptimizer*>(&opt)) return {AdamW8bitOptimizer::Field::m, AdamW8bitOptimizer::Field::v};
  if (dynamic_cast<torch::optim::AdamW*>(&opt)) return {"exp_avg", "exp_avg_sq"};
  if (dynamic_cast<torch::optim::SGD*>(&opt)) return {"momentum_buffer"};
  moments_of_unknown_kind();
}

MPX_DECL Moments moments_of(torch::optim::Optimizer& opt, const at::Tensor& p)
{
  Moments m;
  if (auto* a8 = dynamic_cast<AdamW8bitOptimizer*>(&opt)) {
    using F = AdamW8bitOptimizer::Field;
    auto f = a8->param_state(p);
    if (f.empty()) return m;
    m.step = f.at(F::step).item<std::int64_t>();
    if (f.count(F::m)) m.fields = {{F::m, f.at(F::m).view(p.sizes())}, {F::v, f.at(F::v).view(p.sizes())}};
    else m.fields = {{F::m, dense_moment(f.at(F::m_codes), f.at(F::m_absmax), p.sizes(), true)},
                     {F::v, dense_moment(f.at(F::v_codes), f.at(F::v_absmax), p.sizes(), false)}};
    return m;
  }
  auto it = opt.state().find(moments_key(p));
  const bool has = it != opt.state().end();
  if (dynamic_cast<torch::optim::AdamW*>(&opt)) {
    if (!has) return m;
    auto& s = static_cast<torch::optim::AdamWParamState&>(*it->second);
    if (s.max_exp_avg_sq().defined()) moments_of_unknown_kind();
    m.step = s.step();
    m.fields = {{"exp_avg", s.exp_avg()}, {"exp_avg_sq", s.exp_avg_sq()}};
  } else if (dynamic_cast<torch::optim::SGD*>(&opt)) {
    if (!has) return m;
    auto& s = static_cast<torch::optim::SGDParamState&>(*it->second);
    if (!s.momentum_buffer().defined()) return m;
    m.step = 1;
    m.fields = {{"momentum_buffer", s.momentum_buffer()}};
  } else {
    moments_of_unknown_kind();
  }
  return m;
}

MPX_DECL void set_moments(torch::optim::Optimizer& opt, const at::Tensor& p, const Moments& m)
{
  if (m.step == 0) return;
  auto field = [&](const std::string& n) { return m.fields.at(n).to(p.device(), p.scalar_type()).reshape(p.sizes()).clone(); };
  if (auto* a8 = dynamic_cast<AdamW8bitOptimizer*>(&opt)) {
    using F = AdamW8bitOptimizer::Field;
    a8->set_param_state(p, {{F::step, torch::tensor(m.step, torch::kLong)}, {F::m, field(F::m)}, {F::v, field(F::v)}});
  } else if (dynamic_cast<torch::optim::AdamW*>(&opt)) {
    auto s = std::make_unique<torch::optim::AdamWParamState>();
    s->step(m.step);
    s->exp_avg(field("exp_avg"));
    s->exp_avg_sq(field("exp_avg_sq"));
    opt.state()[moments_key(p)] = std::move(s);
  } else if (dynamic_cast<torch::optim::SGD*>(&opt)) {
    auto s = std::make_unique<torch::optim::SGDParamState>();
    s->momentum_buffer(field("momentum_buffer"));
    opt.state()[moments_key(p)] = std::move(s);
  } else {
    moments_of_unknown_kind();
  }
}

MPX_DECL std::unique_ptr<torch::optim::Optimizer> same_kind(torch::optim::Optimizer& opt, const std::vector<at::Tensor>& params)
{
  auto& first = opt.param_groups().front().options();
  if (dynamic_cast<AdamW8bitOptimizer*>(&opt))
    return std::make_unique<AdamW8bitOptimizer>(params, static_cast<torch::optim::AdamWOptions&>(first));
  if (dynamic_cast<FusedAdamW*>(&opt)) return std::make_unique<FusedAdamW>(params, static_cast<torch::optim::AdamWOptions&>(first));
  if (dynamic_cast<torch::optim::AdamW*>(&opt)) return std::make_unique<torch::optim::AdamW>(params, static_cast<torch::optim::AdamWOptions&>(first));
  if (dynamic_cast<torch::optim::SGD*>(&opt)) return std::make_unique<torch::optim::SGD>(params, static_cast<torch::optim::SGDOptions&>(first));
  moments_of_unknown_kind();
}

}  // namespace mpx::detail
#endif  // MPX_DEFINITIONS
