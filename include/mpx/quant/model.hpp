// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file quant/model.hpp
/// A model's linears in fewer bits, as model transforms (the model code stays single-device and unchanged;
/// call them on a stage's module where the stage is built, as `lora::apply`):
/// - `quantize_frozen(m, spec)`: every frozen mpx linear of `m` (`tp::ColumnLinear`, `tp::RowLinear`)
///   holds its weight packed (QLoRA's quantized base: nf4, int8, int4 or bf16; tp/quantized.hpp), its
///   parameter emptied; after `lora::apply`, the adapters train on the quantized base.
/// - `fake_quantize(m, spec)`: every mpx linear whose weight trains is trained quantization-aware (int8 or
///   int4): the forward uses the weight's round trip through the format, the gradient passes straight
///   through, and the weights learnt keep their accuracy once exported in the format.
/// - `Unpacked`: for its lifetime every packed base of a module is a whole weight again, for an export or a
///   merge that reads the weights; then the parameters are emptied again.
/// Embeddings, norms and `torch::nn::Linear` modules keep their precision (a report lists the linears).

#include <mpx/errors.hpp>         // mpx::config_error
#include <mpx/linkage.hpp>        // MPX_DECL, MPX_DEFINITIONS
#include <mpx/quant/formats.hpp>  // mpx::quant::Spec
#include <mpx/tp/layers.hpp>      // mpx::tp::ColumnLinearImpl, RowLinearImpl

#include <torch/torch.h>  // torch::nn::Module

#include <cstdint>  // std::int64_t
#include <string>   // std::string
#include <vector>   // std::vector

namespace mpx::quant
{

/// What a transform did, on this rank.
struct Report
{
  std::vector<std::string> linears;           ///< the linears changed, by path in the module
  std::int64_t weights = 0;                   ///< their weights' elements
  std::int64_t bytes_before = 0, bytes_after = 0;  ///< their weights' bytes (quantize_frozen: packed)
};

/// Holds every frozen mpx linear's weight of `m` packed as `s` (see the file comment). Throws before
/// changing anything when a linear's base is packed already.
MPX_DECL Report quantize_frozen(torch::nn::Module& m, const Spec& s);

/// Trains every mpx linear of `m` whose weight trains quantization-aware as `s` (int8 or int4).
MPX_DECL Report fake_quantize(torch::nn::Module& m, const Spec& s);

/// Every packed base of a module whole again while this lives (see the file comment).
class Unpacked
{
 public:
  explicit Unpacked(torch::nn::Module& m);
  ~Unpacked();
  Unpacked(const Unpacked&) = delete;
  Unpacked& operator=(const Unpacked&) = delete;

 private:
  std::vector<std::pair<at::Tensor*, const tp::WeightForm*>> packed_;
};

}  // namespace mpx::quant

#if MPX_DEFINITIONS
// ---- definitions (compiled once under MPX_SEPARATE_COMPILATION: linkage.hpp) ----
namespace mpx::quant
{
namespace detail
{
/// Calls f(path, weight, form, quantize_base, fake_quantize) for every mpx linear of `m`.
template <class F>
void for_each_linear(torch::nn::Module& m, F&& f)
{
  for (const auto& item : m.named_modules("", /*include_self=*/true)) {
    if (auto* c = dynamic_cast<tp::ColumnLinearImpl*>(item.value().get())) f(item.key(), *c);
    if (auto* r = dynamic_cast<tp::RowLinearImpl*>(item.value().get())) f(item.key(), *r);
  }
}
}  // namespace detail

MPX_DECL Report quantize_frozen(torch::nn::Module& m, const Spec& s)
{
  Report r;
  if (!s.defined()) return r;
  detail::for_each_linear(m, [&](const std::string& path, auto& l) {
    if (l.form.base.defined()) throw config_error("mpx::quant::quantize_frozen: " + path + " is held quantized already; quantize a model once");
  });
  detail::for_each_linear(m, [&](const std::string& path, auto& l) {
    if (l.weight.requires_grad()) return;
    const std::int64_t before = l.weight.numel() * std::int64_t(l.weight.element_size());
    r.weights += l.weight.numel();
    l.quantize_base(s);
    r.linears.push_back(path.empty() ? "(the module)" : path);
    r.bytes_before += before, r.bytes_after += l.form.base.bytes();
  });
  return r;
}

MPX_DECL Report fake_quantize(torch::nn::Module& m, const Spec& s)
{
  Report r;
  if (!s.defined()) return r;
  detail::for_each_linear(m, [&](const std::string& path, auto& l) {
    if (!l.weight.requires_grad()) return;
    l.fake_quantize(s);
    r.linears.push_back(path.empty() ? "(the module)" : path);
    r.weights += l.weight.numel();
    r.bytes_before += l.weight.numel() * std::int64_t(l.weight.element_size());
    r.bytes_after += quant::quantize(l.weight.detach().narrow(0, 0, 1), s).bytes() * l.weight.size(0);
  });
  return r;
}

MPX_DECL Unpacked::Unpacked(torch::nn::Module& m)
{
  detail::for_each_linear(m, [&](const std::string&, auto& l) {
    if (!l.form.base.defined()) return;
    tp::unpack_base(l.weight, l.form, true);
    packed_.emplace_back(&l.weight, &l.form);
  });
}

MPX_DECL Unpacked::~Unpacked()
{
  for (auto& [w, f] : packed_) tp::unpack_base(*w, *f, false);
}

}  // namespace mpx::quant
#endif  // MPX_DEFINITIONS
