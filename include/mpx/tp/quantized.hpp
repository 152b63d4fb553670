// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file tp/quantized.hpp
/// The weight of a linear of layers.hpp in fewer bits (formats: quant/formats.hpp), in one of two ways:
/// - a quantized frozen base (QLoRA): the weight is held packed, as buffers of the linear
///   (`weight_codes`, `weight_scales`, and with nf4's double quantization `weight_scale_step`,
///   `weight_scale_mean`), and its parameter is emptied. Each use dequantizes it for the product, and the
///   backward dequantizes it again rather than keeping it (`base_linear`): the whole weight never outlives
///   one linear's forward or backward. Gradients flow to the input only (to adapters, earlier layers).
/// - quantization-aware training: the weight trains in full precision, and the forward uses its round trip
///   through the format with a straight-through gradient (`used_weight`: w + (q(w) − w) detached), so
///   the model learns weights that keep their accuracy once stored in the format.
/// A row-parallel linear's rank holds a slice of every row: the statistics over a whole row come from the
/// group (`rows_over`), so that every degree quantizes as one process does where the slices are whole groups.

#include <mpx/linkage.hpp>        // MPX_DECL, MPX_DEFINITIONS
#include <mpx/quant/formats.hpp>  // mpx::quant::Spec, Packed, Rows
#include <mpx/tp/group.hpp>       // mpx::tp::GroupPtr

#include <torch/torch.h>  // torch::nn::Module

namespace mpx::tp
{

/// How a linear holds its weight besides the plain parameter (see the file comment).
struct WeightForm
{
  quant::Packed base;  ///< the frozen base, packed (the parameter then empty)
  quant::Spec trained; ///< quantization-aware training: the forward's weight is its round trip through this
  at::ScalarType dtype = at::kFloat;  ///< the parameter's dtype while packed
};

/// The row statistics of a linear whose rank holds a slice of every row (reduced over `g`).
MPX_DECL quant::Rows rows_over(const GroupPtr& g);

/// The weight for the forward: `weight`, or under quantization-aware training its round trip with a
/// straight-through gradient (`rows_group`: a row-parallel linear's group, whose ranks hold slices of its rows).
MPX_DECL at::Tensor used_weight(const at::Tensor& weight, const WeightForm& f, const GroupPtr& rows_group = GroupPtr());

/// x·Wᵀ + bias with W the packed base, dequantized as x's dtype for the product and again in the backward.
MPX_DECL at::Tensor base_linear(const at::Tensor& x, const quant::Packed& p, const at::Tensor& bias);

/// Packs `weight` (frozen) as `s` into `f.base`, registers the packed tensors as `m`'s buffers and
/// empties the parameter. Throws when already packed, trained, or `weight` requires a gradient.
MPX_DECL void pack_base(torch::nn::Module& m, at::Tensor& weight, WeightForm& f, const quant::Spec& s, const quant::Rows& rows);

/// Holds `p` (a weight packed elsewhere, e.g. read from a quantized export) as the linear's frozen base: as
/// pack_base after its quantize. Throws when `p`'s shape is not `weight`'s.
MPX_DECL void hold_packed(torch::nn::Module& m, at::Tensor& weight, WeightForm& f, quant::Packed p);

/// `s` when it can train `weight` quantization-aware (int8 or int4, the weight trains, its base not packed); else throws.
MPX_DECL quant::Spec checked_trainable(const WeightForm& f, const at::Tensor& weight, const quant::Spec& s);

/// Puts the dequantized base back into the emptied parameter (`true`), or empties it again (`false`).
MPX_DECL void unpack_base(at::Tensor& weight, const WeightForm& f, bool whole);

}  // namespace mpx::tp

#if MPX_DEFINITIONS
// ---- definitions (compiled once under MPX_SEPARATE_COMPILATION: linkage.hpp) ----
#include <mpx/errors.hpp>  // mpx::config_error

namespace mpx::tp
{
namespace detail
{
/// y = x·dequantize(p)ᵀ; the backward dequantizes p again (its tensors are kept, not the weight).
struct BaseLinear : torch::autograd::Function<BaseLinear>
{
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const quant::Packed* p)
  {
    ctx->saved_data["codes"] = p->codes;
    for (auto [name, t] : {std::pair{"scales", &p->scales}, {"step", &p->scale_step}, {"mean", &p->scale_mean}})
      if (t->defined()) ctx->saved_data[name] = *t;
    ctx->saved_data["format"] = int64_t(p->spec.format), ctx->saved_data["group"] = p->spec.group;
    ctx->saved_data["double_quant"] = p->spec.double_quant, ctx->saved_data["cols"] = p->cols;
    return torch::nn::functional::linear(x, quant::dequantize(*p, x.scalar_type()));
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx, torch::autograd::variable_list grads)
  {
    auto& d = ctx->saved_data;
    auto tensor = [&](const char* name) { return d.count(name) ? d[name].toTensor() : at::Tensor(); };
    quant::Packed p;
    p.codes = tensor("codes"), p.scales = tensor("scales"), p.scale_step = tensor("step"), p.scale_mean = tensor("mean");
    p.spec.format = quant::Format(d["format"].toInt()), p.spec.group = d["group"].toInt();
    p.spec.double_quant = d["double_quant"].toBool(), p.cols = d["cols"].toInt();
    const auto& g = grads[0];
    return {torch::matmul(g, quant::dequantize(p, g.scalar_type())), {}};
  }
};
}  // namespace detail

MPX_DECL quant::Rows rows_over(const GroupPtr& g)
{
  if (g == nullptr || g->size == 1) return {};
  return {[g](at::Tensor& t) { all_reduce_max(*g, t, "all-reduce (max) of a quantized weight's row statistics"); },
          [g](at::Tensor& t) { all_reduce(*g, t, "all-reduce of a quantized weight's row statistics"); }};
}

MPX_DECL at::Tensor used_weight(const at::Tensor& weight, const WeightForm& f, const GroupPtr& rows_group)
{
  if (!f.trained.defined()) return weight;
  return weight + (quant::round_trip(weight, f.trained, rows_over(rows_group)) - weight).detach();
}

MPX_DECL at::Tensor base_linear(const at::Tensor& x, const quant::Packed& p, const at::Tensor& bias)
{
  const auto y = detail::BaseLinear::apply(x, &p);
  return bias.defined() ? y + bias : y;
}

MPX_DECL void pack_base(torch::nn::Module& m, at::Tensor& weight, WeightForm& f, const quant::Spec& s, const quant::Rows& rows)
{
  if (f.base.defined()) throw config_error("mpx::tp: the linear's base is quantized already (" + quant::name_of(f.base.spec) + "); quantize once per model");
  hold_packed(m, weight, f, quant::quantize(weight, s, rows));
}

MPX_DECL void hold_packed(torch::nn::Module& m, at::Tensor& weight, WeightForm& f, quant::Packed p)
{
  if (f.base.defined()) throw config_error("mpx::tp: the linear's base is quantized already (" + quant::name_of(f.base.spec) + "); quantize once per model");
  if (f.trained.defined() || weight.requires_grad())
    throw config_error("mpx::tp: only a frozen weight is held quantized (this one trains: freeze it, or train adapters on it)");
  if (weight.dim() != 2 || p.codes.size(0) != weight.size(0) || p.cols != weight.size(1))
    throw config_error("mpx::tp: a packed weight of " + std::to_string(p.codes.size(0)) + " × " + std::to_string(p.cols) + " for a linear of " +
                       c10::str(weight.sizes()) + "; pack the weight of this model's config");
  for (auto* t : {&p.codes, &p.scales, &p.scale_step, &p.scale_mean})
    if (t->defined()) *t = t->to(weight.device());
  f.base = std::move(p);
  f.dtype = weight.scalar_type();
  m.register_buffer("weight_codes", f.base.codes);
  for (auto [name, t] : {std::pair{"weight_scales", &f.base.scales}, {"weight_scale_step", &f.base.scale_step}, {"weight_scale_mean", &f.base.scale_mean}})
    if (t->defined()) m.register_buffer(name, *t);
  unpack_base(weight, f, false);
}

MPX_DECL quant::Spec checked_trainable(const WeightForm& f, const at::Tensor& weight, const quant::Spec& s)
{
  if (s.format != quant::Format::int8 && s.format != quant::Format::int4)
    throw config_error("mpx::tp: quantization-aware training takes int8 or int4 (got " + quant::name_of(s) + ")");
  if (f.base.defined() || !weight.requires_grad())
    throw config_error("mpx::tp: quantization-aware training needs a weight that trains; this one is frozen" + std::string(f.base.defined() ? " and packed" : ""));
  return s;
}

MPX_DECL void unpack_base(at::Tensor& weight, const WeightForm& f, bool whole)
{
  if (!f.base.defined()) return;
  torch::NoGradGuard ng;
  weight.set_data(whole ? quant::dequantize(f.base, f.dtype) : torch::empty({0}, f.base.codes.options().dtype(f.dtype)));
}

}  // namespace mpx::tp
#endif  // MPX_DEFINITIONS
