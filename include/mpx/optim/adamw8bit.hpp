// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file optim/adamw8bit.hpp
/// `mpx::AdamW8bitOptimizer`: AdamW whose moments are stored in 8 bits, block-wise (quantize.hpp: blocks of
/// 256 values, dynamic code books). Tensors under 4096 elements keep fp32 moments (as bitsandbytes'
/// AdamW8bit does). Weight decay is decoupled. State costs about 2.03 bytes per parameter (fp32 AdamW: 8).
/// `save`/`load` round-trip the state, hyper-parameters included; `param_state`/`set_param_state` give it
/// as named fields (`Field`), which checkpoints save by parameter name.

#include <mpx/errors.hpp>  // mpx::config_error
#include <mpx/linkage.hpp>  // MPX_DECL, MPX_DEFINITIONS
#include <mpx/optim/fused_step_8bit.hpp>  // mpx::detail::fused_step_8bit
#include <mpx/optim/quantize.hpp>  // mpx::Quantized, quantize, dequantize, code books

#include <torch/torch.h>  // torch::optim::Optimizer, torch::optim::AdamWOptions

#include <cmath>          // std::pow
#include <cstdio>         // std::snprintf
#include <map>            // std::map
#include <utility>        // std::pair
#include <string>         // std::string
#include <unordered_map>  // std::unordered_map
#include <vector>         // std::vector

namespace mpx
{

/// AdamW with 8-bit block-wise moments (see the file comment).
class AdamW8bitOptimizer : public torch::optim::Optimizer
{
 public:
  AdamW8bitOptimizer(std::vector<at::Tensor> params, torch::optim::AdamWOptions options, std::int64_t min_8bit_numel = 4096);

  at::Tensor step(LossClosure closure = nullptr) override;

  /// Bytes of optimizer state held for the parameters (moments, block maxima, step counters excluded).
  std::size_t state_bytes() const;

  /// The names of a parameter's state fields, as `param_state` gives them and checkpoints save them
  /// (`<parameter>/<field>`): the step, then either the fp32 moments (tensors under `min_8bit_numel`) or
  /// each moment's 8-bit codes and block maxima.
  struct Field
  {
    static constexpr const char *step = "step", *m = "m", *v = "v";
    static constexpr const char *m_codes = "m8", *m_absmax = "m8max", *v_codes = "v8", *v_absmax = "v8max";
  };
  static constexpr const char* fields[] = {Field::step, Field::m, Field::v, Field::m_codes, Field::m_absmax, Field::v_codes, Field::v_absmax};
  /// For an fp32 moment field (`m` or `v`): the fields that hold it in 8 bits (codes, block maxima); nulls
  /// for any other field.
  static std::pair<const char*, const char*> quantized_fields(const std::string& moment)
  {
    if (moment == Field::m) return {Field::m_codes, Field::m_absmax};
    if (moment == Field::v) return {Field::v_codes, Field::v_absmax};
    return {nullptr, nullptr};
  }
  /// Whether `field` is one of the 8-bit fields (codes or block maxima).
  static bool is_quantized_field(const std::string& field)
  {
    return field == Field::m_codes || field == Field::m_absmax || field == Field::v_codes || field == Field::v_absmax;
  }

  /// Parameter `p`'s state as named tensors (`Field`); empty before its first step.
  std::map<std::string, at::Tensor> param_state(const at::Tensor& p) const;
  /// Sets parameter `p`'s state from what `param_state` gave (onto the parameter's device), or from fp32
  /// moments `m`, `v` for any parameter (quantized here when it is large); a `config_error` when a field is
  /// missing or mis-sized.
  void set_param_state(const at::Tensor& p, const std::map<std::string, at::Tensor>& f);

  /// "p<i>": parameter i's entries in the archive (built without `"p" + std::string`, which GCC 12 at -O2
  /// reports as a -Wstringop-overflow in libstdc++'s own code).
  static std::string state_key(std::int64_t i);

  /// Writes moments, steps and hyper-parameters (LibTorch's own optimizer serialisation drops the latter).
  void save(torch::serialize::OutputArchive& archive) const override;

  void load(torch::serialize::InputArchive& archive) override;

 private:
  struct State
  {
    std::int64_t step = 0;
    at::Tensor m, v;      // fp32 moments (small tensors)
    Quantized m8, v8;     // 8-bit moments
  };
  std::unordered_map<c10::TensorImpl*, State> state_;
  std::int64_t min_8bit_;
};

namespace detail
{
/// A moment kept in 8 bits (its `codes` and block maxima `absmax`, as a checkpoint holds them) as the fp32
/// moment it stands for, in `shape`: what moves to a parameter cut another way (`set_param_state` takes
/// fp32 `m`, `v`). `is_signed`: the first moment's code book, else the second's.
MPX_DECL at::Tensor dense_moment(const at::Tensor& codes, const at::Tensor& absmax, at::IntArrayRef shape, bool is_signed);
}  // namespace detail

}  // namespace mpx

#if MPX_DEFINITIONS
// ---- definitions (compiled once under MPX_SEPARATE_COMPILATION: linkage.hpp) ----

namespace mpx
{

MPX_DECL AdamW8bitOptimizer::AdamW8bitOptimizer(std::vector<at::Tensor> params, torch::optim::AdamWOptions options, std::int64_t min_8bit_numel)
    : torch::optim::Optimizer({torch::optim::OptimizerParamGroup(std::move(params))},
                              std::make_unique<torch::optim::AdamWOptions>(options)),
      min_8bit_(min_8bit_numel)
{
}

MPX_DECL at::Tensor AdamW8bitOptimizer::step(LossClosure closure)
{
  torch::NoGradGuard no_grad;
  at::Tensor loss;
  if (closure) {
    torch::AutoGradMode enable(true);
    loss = closure();
  }
  for (auto& group : param_groups()) {
    auto& o = static_cast<torch::optim::AdamWOptions&>(group.options());
    const double lr = o.lr(), b1 = std::get<0>(o.betas()), b2 = std::get<1>(o.betas()), eps = o.eps(), wd = o.weight_decay();
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      auto& s = state_[p.unsafeGetTensorImpl()];
      const auto g = p.grad().to(torch::kFloat);
      const bool eight = p.numel() >= min_8bit_;
      if (eight && p.device().is_cpu() && p.scalar_type() == at::kFloat && p.is_contiguous()) {
        ++s.step;
        const double c1 = 1 - std::pow(b1, double(s.step)), c2 = 1 - std::pow(b2, double(s.step));
        auto pd = p.detach();
        detail::fused_step_8bit(pd, g.contiguous(), s.m8, s.v8, s.step == 1, lr, b1, b2, eps, wd, c1, c2);
        continue;
      }
      at::Tensor m, v;
      if (s.step == 0) {
        m = torch::zeros_like(g);
        v = torch::zeros_like(g);
      } else if (eight) {
        m = dequantize(s.m8, detail::signed_code(), g.sizes());
        v = dequantize(s.v8, detail::unsigned_code(), g.sizes());
      } else {
        m = s.m;
        v = s.v;
      }
      ++s.step;
      m.mul_(b1).add_(g, 1 - b1);
      v.mul_(b2).addcmul_(g, g, 1 - b2);
      const double c1 = 1 - std::pow(b1, double(s.step)), c2 = 1 - std::pow(b2, double(s.step));
      p.mul_(1 - lr * wd);  // decoupled weight decay
      p.addcdiv_(m, (v / c2).sqrt_().add_(eps), -lr / c1);
      if (eight) {
        s.m8 = quantize(m, detail::signed_code());
        s.v8 = quantize(v, detail::unsigned_code());
        s.m = s.v = at::Tensor();
      } else {
        s.m = m;
        s.v = v;
      }
    }
  }
  return loss;
}

MPX_DECL std::size_t AdamW8bitOptimizer::state_bytes() const
{
  std::size_t n = 0;
  for (auto& [k, s] : state_) {
    if (s.m.defined()) n += std::size_t(s.m.numel() + s.v.numel()) * 4;
    if (s.m8.codes.defined())
      n += std::size_t(s.m8.codes.numel() + s.v8.codes.numel()) + std::size_t(s.m8.absmax.numel() + s.v8.absmax.numel()) * 4;
  }
  return n;
}

MPX_DECL std::map<std::string, at::Tensor> AdamW8bitOptimizer::param_state(const at::Tensor& p) const
{
  auto it = state_.find(p.unsafeGetTensorImpl());
  if (it == state_.end()) return {};
  const State& s = it->second;
  if (s.m.defined()) return {{Field::step, torch::tensor(s.step, torch::kLong)}, {Field::m, s.m}, {Field::v, s.v}};
  return {{Field::step, torch::tensor(s.step, torch::kLong)},
          {Field::m_codes, s.m8.codes},
          {Field::m_absmax, s.m8.absmax},
          {Field::v_codes, s.v8.codes},
          {Field::v_absmax, s.v8.absmax}};
}

MPX_DECL void AdamW8bitOptimizer::set_param_state(const at::Tensor& p, const std::map<std::string, at::Tensor>& f)
{
  auto get = [&](const char* k, std::int64_t numel) {
    auto it = f.find(k);
    if (it == f.end() || it->second.numel() != numel)
      throw config_error(std::string("mpx: AdamW8bit state '") + k + "' is missing or of another size for a parameter of " +
                         std::to_string(p.numel()) + " elements; the optimizer state does not match the model");
    return it->second.to(p.device()).clone();
  };
  State s;
  s.step = get(Field::step, 1).item<std::int64_t>();
  if (p.numel() < min_8bit_) {
    s.m = get(Field::m, p.numel()).view(p.sizes()), s.v = get(Field::v, p.numel()).view(p.sizes());
  } else if (!f.count(Field::m_codes) && f.count(Field::m)) {  // fp32 moments (re-cut for another degree): quantized here
    s.m8 = quantize(get(Field::m, p.numel()), detail::signed_code()), s.v8 = quantize(get(Field::v, p.numel()), detail::unsigned_code());
    s.m8.codes = s.m8.codes.reshape(-1), s.v8.codes = s.v8.codes.reshape(-1);
  } else {
    const std::int64_t blocks = (p.numel() + quant_block - 1) / quant_block;
    s.m8.codes = get(Field::m_codes, blocks * quant_block), s.m8.absmax = get(Field::m_absmax, blocks);
    s.v8.codes = get(Field::v_codes, blocks * quant_block), s.v8.absmax = get(Field::v_absmax, blocks);
    s.m8.numel = s.v8.numel = p.numel();
  }
  state_[p.unsafeGetTensorImpl()] = s;
}

MPX_DECL std::string AdamW8bitOptimizer::state_key(std::int64_t i)
{
  char buf[24];
  std::snprintf(buf, sizeof buf, "p%lld", static_cast<long long>(i));
  return buf;
}

MPX_DECL void AdamW8bitOptimizer::save(torch::serialize::OutputArchive& archive) const
{
  const auto& o = static_cast<const torch::optim::AdamWOptions&>(param_groups().at(0).options());
  archive.write("hyper", torch::tensor({o.lr(), std::get<0>(o.betas()), std::get<1>(o.betas()), o.eps(), o.weight_decay()},
                                       torch::kDouble));
  std::int64_t i = 0;
  for (auto& p : param_groups().at(0).params()) {
    const std::string k = state_key(i++);
    auto it = state_.find(p.unsafeGetTensorImpl());
    if (it == state_.end()) continue;
    const State& s = it->second;
    archive.write(k + ".step", torch::tensor(s.step, torch::kLong));
    if (s.m.defined()) {
      archive.write(k + ".m", s.m);
      archive.write(k + ".v", s.v);
    } else {
      archive.write(k + ".m8", s.m8.codes);
      archive.write(k + ".m8max", s.m8.absmax);
      archive.write(k + ".v8", s.v8.codes);
      archive.write(k + ".v8max", s.v8.absmax);
    }
  }
}

MPX_DECL void AdamW8bitOptimizer::load(torch::serialize::InputArchive& archive)
{
  at::Tensor h;
  archive.read("hyper", h);
  auto& o = static_cast<torch::optim::AdamWOptions&>(param_groups().at(0).options());
  auto hp = h.accessor<double, 1>();
  o.lr(hp[0]).betas({hp[1], hp[2]}).eps(hp[3]).weight_decay(hp[4]);
  std::int64_t i = 0;
  for (auto& p : param_groups().at(0).params()) {
    const std::string k = state_key(i++);
    at::Tensor step;
    if (!archive.try_read(k + ".step", step)) continue;
    State s;
    s.step = step.item<std::int64_t>();
    if (p.numel() < min_8bit_) {  // read onto the parameter's device (a CUDA run's state comes back as CUDA)
      archive.read(k + ".m", s.m);
      archive.read(k + ".v", s.v);
      s.m = s.m.to(p.device()), s.v = s.v.to(p.device());
    } else {
      archive.read(k + ".m8", s.m8.codes);
      archive.read(k + ".m8max", s.m8.absmax);
      archive.read(k + ".v8", s.v8.codes);
      archive.read(k + ".v8max", s.v8.absmax);
      for (auto* t : {&s.m8.codes, &s.m8.absmax, &s.v8.codes, &s.v8.absmax}) *t = t->to(p.device());
      s.m8.numel = s.v8.numel = p.numel();
    }
    state_[p.unsafeGetTensorImpl()] = s;
  }
}

}  // namespace mpx
namespace mpx::detail
{
MPX_DECL at::Tensor dense_moment(const at::Tensor& codes, const at::Tensor& absmax, at::IntArrayRef shape, bool is_signed)
{
  const Quantized q{codes.reshape({-1, quant_block}), absmax, c10::multiply_integers(shape)};
  return dequantize(q, is_signed ? signed_code() : unsigned_code(), shape);
}
}  // namespace mpx::detail
#endif  // MPX_DEFINITIONS
