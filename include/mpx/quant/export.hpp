// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file quant/export.hpp
/// Quantized weights in a file (safetensors), and back into a model. A weight `<name>` (whole, out × in)
/// packed in a format (formats.hpp) is stored as
/// - `<name>.codes`: int8 (out, in) for int8; uint8 (out, padded in / 2) for int4 and nf4, the even column
///   in the low nibble (int4: q + 8);
/// - `<name>.scales`: fp32 (out, groups) — for nf4 with double quantization int8 codes of the block maxima,
///   with `<name>.scale_step` and `<name>.scale_mean` fp32 (out, 1): maximum = code · step + mean;
/// - `<name>.shape`: int64 [out, in];
/// and the file's metadata `quantization` names the format (`name_of`: "int4", "int4/g32", "int8", "nf4").
/// Every other tensor is stored as it is. `pack_weights` makes such a map from whole weights;
/// `read_packed` reads one back; `install_packed` puts packed weights into a model's linears as their frozen
/// bases, so that the model runs on them (dequantized for each use) without ever holding them whole.

#include <mpx/errors.hpp>         // mpx::config_error
#include <mpx/linkage.hpp>        // MPX_DECL, MPX_DEFINITIONS
#include <mpx/quant/formats.hpp>  // mpx::quant::Spec, Packed
#include <mpx/quant/model.hpp>    // mpx::quant::detail::for_each_linear

#include <torch/torch.h>  // at::Tensor

#include <map>     // std::map
#include <set>     // std::set
#include <string>  // std::string
#include <vector>  // std::vector

namespace mpx::quant
{

/// `whole` with the weights named in `which` packed as `s` (see the file comment). A name in `which` that
/// `whole` lacks, or a weight that is not 2-d, is an error.
MPX_DECL std::map<std::string, at::Tensor> pack_weights(const std::map<std::string, at::Tensor>& whole, const std::set<std::string>& which, const Spec& s);

/// A file's tensors split into packed weights and the rest.
struct PackedWeights
{
  std::map<std::string, Packed> packed;       ///< by the weight's name
  std::map<std::string, at::Tensor> plain;
};

/// The reverse of pack_weights, the format named by `format` (the file's `quantization` metadata). An
/// incomplete or inconsistent packed weight is an error naming it.
MPX_DECL PackedWeights read_packed(const std::map<std::string, at::Tensor>& tensors, const std::string& format);

/// Puts `packed` into `m`'s mpx linears as their frozen bases, matched by their weights' names in `names`
/// (the module's global names, `named_weights()`; empty: names within `m`). Every linear's parameters
/// named in `packed` are frozen first. Returns the names held; a packed weight no linear takes is an error.
MPX_DECL std::vector<std::string> install_packed(torch::nn::Module& m, const std::map<std::string, Packed>& packed,
                                              const std::map<std::string, at::Tensor>& names = {});

}  // namespace mpx::quant

#if MPX_DEFINITIONS
// ---- definitions (compiled once under MPX_SEPARATE_COMPILATION: linkage.hpp) ----
namespace mpx::quant
{

MPX_DECL std::map<std::string, at::Tensor> pack_weights(const std::map<std::string, at::Tensor>& whole, const std::set<std::string>& which, const Spec& s)
{
  std::map<std::string, at::Tensor> out;
  for (const auto& n : which)
    if (!whole.count(n)) throw config_error("mpx::quant::pack_weights: no weight " + n + " to pack");
  for (const auto& [n, t] : whole) {
    if (!which.count(n)) {
      out[n] = t;
      continue;
    }
    const auto p = quantize(t.detach().to(at::kCPU), s);
    out[n + ".codes"] = p.codes;
    out[n + ".shape"] = torch::tensor({t.size(0), t.size(1)}, torch::kLong);
    if (p.scales.defined()) out[n + ".scales"] = p.scales;
    if (p.scale_step.defined()) out[n + ".scale_step"] = p.scale_step, out[n + ".scale_mean"] = p.scale_mean;
  }
  return out;
}

MPX_DECL PackedWeights read_packed(const std::map<std::string, at::Tensor>& tensors, const std::string& format)
{
  const Spec s = parse(format);
  PackedWeights r;
  auto take = [&](const std::string& name, const char* part) -> at::Tensor {
    auto it = tensors.find(name + part);
    return it == tensors.end() ? at::Tensor() : it->second;
  };
  for (const auto& [n, t] : tensors) {
    if (!n.ends_with(".codes")) continue;
    const std::string name = n.substr(0, n.size() - 6);
    Packed p;
    p.spec = s, p.codes = t;
    p.scales = take(name, ".scales"), p.scale_step = take(name, ".scale_step"), p.scale_mean = take(name, ".scale_mean");
    const auto shape = take(name, ".shape");
    p.spec.double_quant = p.scale_step.defined();
    const bool scaled = s.format != Format::bf16;
    if (!shape.defined() || shape.numel() != 2 || (scaled && !p.scales.defined()) || (s.format == Format::nf4 && p.spec.double_quant != p.scale_mean.defined()))
      throw config_error("mpx::quant::read_packed: " + name + " lacks its .shape, .scales or .scale_mean beside its .codes; the file is incomplete (" + format + ")");
    p.cols = shape[1].item<int64_t>();
    const int64_t rows = shape[0].item<int64_t>();
    const bool nibbles = s.format == Format::int4 || s.format == Format::nf4;
    const auto want_codes = nibbles ? at::kByte : s.format == Format::int8 ? at::kChar : at::kBFloat16;
    if (t.dim() != 2 || t.size(0) != rows || t.scalar_type() != want_codes || (nibbles ? t.size(1) * 2 < p.cols : t.size(1) != p.cols) ||
        (scaled && (p.scales.dim() != 2 || p.scales.size(0) != rows)))
      throw config_error("mpx::quant::read_packed: " + name + "'s codes " + c10::str(t.sizes()) + " " + std::string(c10::toString(t.scalar_type())) +
                         " do not fit a " + std::to_string(rows) + " × " + std::to_string(p.cols) + " weight in " + format);
    if (s.format != Format::nf4 && p.spec.double_quant) throw config_error("mpx::quant::read_packed: " + name + " has nf4's scale_step in a " + format + " file");
    if (scaled && p.scales.size(1) != (s.group == 0 ? 1 : (p.cols + s.group - 1) / s.group))
      throw config_error("mpx::quant::read_packed: " + name + " has " + std::to_string(p.scales.size(1)) + " scales per row; " + format + " wants one per " +
                         (s.group == 0 ? std::string("row") : std::to_string(s.group) + " values"));
    r.packed[name] = std::move(p);
  }
  for (const auto& [n, t] : tensors) {
    const auto dot = n.rfind('.');
    if (dot != std::string::npos && r.packed.count(n.substr(0, dot))) continue;
    r.plain[n] = t;
  }
  return r;
}

MPX_DECL std::vector<std::string> install_packed(torch::nn::Module& m, const std::map<std::string, Packed>& packed, const std::map<std::string, at::Tensor>& names)
{
  std::map<const c10::TensorImpl*, std::string> global;
  for (const auto& [n, t] : names) global[t.unsafeGetTensorImpl()] = n;
  auto name_of_linear = [&](const std::string& path, const at::Tensor& weight) {
    auto it = global.find(weight.unsafeGetTensorImpl());
    return it != global.end() ? it->second : (path.empty() ? "weight" : path + ".weight");
  };
  std::set<std::string> linears;  // first every name, so that a file that does not fit changes nothing
  detail::for_each_linear(m, [&](const std::string& path, auto& l) { linears.insert(name_of_linear(path, l.weight)); });
  for (const auto& [n, p] : packed)
    if (!linears.count(n))
      throw config_error("mpx::quant::install_packed: " + n + " is packed, but the model has no mpx linear of that name; pass the config the weights were exported with");
  std::vector<std::string> held;
  detail::for_each_linear(m, [&](const std::string& path, auto& l) {
    const auto p = packed.find(name_of_linear(path, l.weight));
    if (p == packed.end()) return;
    for (auto& t : l.parameters()) t.requires_grad_(false);
    tp::hold_packed(l, l.weight, l.form, p->second);
    held.push_back(p->first);
  });
  return held;
}

}  // namespace mpx::quant
#endif  // MPX_DEFINITIONS
