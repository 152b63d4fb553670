// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file examples/moondream/quantize.hpp
/// moondream in fewer bits (mpx::quant):
/// - `--base-precision nf4|int8|bf16` with `--lora`: every frozen linear of every stage (the text decoder's
///   and the head; the vision encoder's when frozen) holds its weight packed (QLoRA), dequantized for each
///   use. The export merges the adapters into the dequantized base: the model the adapters trained on.
/// - `--qat int4|int4/gN|int8`: every trained linear is trained quantization-aware. The export adds
///   `model/quantized/` (mpx::quant::pack_weights: packed integers and scales, format in the metadata);
///   the held-out accuracy is then the quantized model's, so that with `--steps 0` from trained weights it is
///   post-training quantization's (the baseline).
/// `load_weights` reads plain or packed weights into a model (moondream_query, the evaluation).

#include "config.hpp"   // moondream::Config
#include "recipe.hpp"   // moondream::Options
#include "weights.hpp"  // moondream::read_weights, assign, expected_shapes

#include <mpx/mpx.hpp>

#include <filesystem>  // std::filesystem
#include <map>         // std::map
#include <set>         // std::set
#include <string>      // std::string

namespace moondream
{

/// Stops before anything is built when --base-precision or --qat is not a format they take, or they do not
/// fit the run (a quantized base needs --lora's frozen base; quantization-aware training trains the weights).
inline void check_quantization(const Options& o)
{
  mpx::quant::Spec base, qat;
  try {
    base = mpx::quant::parse(o.base_precision);
    if (!o.qat.empty()) qat = mpx::quant::parse(o.qat);
  } catch (const mpx::config_error& e) {
    throw mpx::config_error(std::string("moondream_train: --base-precision / --qat: ") + e.what());
  }
  if (base.defined() && o.lora <= 0)
    throw mpx::config_error("moondream_train: --base-precision " + o.base_precision + " holds the frozen base under LoRA adapters; add --lora RANK, or keep fp32");
  if (!o.qat.empty() && qat.format != mpx::quant::Format::int4 && qat.format != mpx::quant::Format::int8)
    throw mpx::config_error("moondream_train: --qat " + o.qat + ": quantization-aware training takes int4 (int4/g32, int4/g64, int4/g128) or int8");
  if (!o.qat.empty() && o.lora > 0)
    throw mpx::config_error("moondream_train: --qat trains every weight quantization-aware, --lora trains adapters on a frozen base; for a base in fewer "
                            "bits under --lora use --base-precision");
}

/// Stage module `m` (after apply_lora) in the precisions asked.
template <class M>
void apply_quantization(const Options& o, M& m)
{
  mpx::quant::quantize_frozen(m, mpx::quant::parse(o.base_precision));
  if (!o.qat.empty()) mpx::quant::fake_quantize(m, mpx::quant::parse(o.qat));
}

/// The global names of `m`'s weights trained quantization-aware (what the quantized export packs).
template <class M>
std::set<std::string> quantization_aware(M& m)
{
  std::map<const c10::TensorImpl*, std::string> global;
  for (const auto& [n, t] : m.named_weights()) global[t.unsafeGetTensorImpl()] = n;
  std::set<std::string> out;
  for (const auto& child : m.modules(/*include_self=*/true)) {
    const at::Tensor* w = nullptr;
    if (auto* c = dynamic_cast<mpx::tp::ColumnLinearImpl*>(child.get()); c && c->form.trained.defined()) w = &c->weight;
    if (auto* r = dynamic_cast<mpx::tp::RowLinearImpl*>(child.get()); r && r->form.trained.defined()) w = &r->weight;
    if (w != nullptr)
      if (auto it = global.find(w->unsafeGetTensorImpl()); it != global.end()) out.insert(it->second);
  }
  return out;
}

/// Writes the quantized export of whole weights `whole` (global names), those named in `aware` packed as --qat's format.
inline void write_quantized(const Options& o, const std::string& file, const std::map<std::string, at::Tensor>& whole, const std::set<std::string>& aware)
{
  std::filesystem::create_directories(std::filesystem::path(file).parent_path());
  std::map<std::string, at::Tensor> cpu;
  for (const auto& [n, t] : whole) cpu[n] = t.detach().to(at::kCPU).to(at::kFloat);
  mpx::save_safetensors(file, mpx::quant::pack_weights(cpu, aware, mpx::quant::parse(o.qat)),
                        {{"format", "pt"}, {"quantization", mpx::quant::name_of(mpx::quant::parse(o.qat))}});
}

/// Reads `path` (a file or a directory of .safetensors) into `m`: plain weights (read_weights), or a
/// quantized export (metadata `quantization`), whose packed linears `m` then holds packed (frozen).
/// Returns what it read, for a log line.
template <class M>
std::string load_weights(const std::string& path, const Config& c, M& m)
{
  std::string format;
  std::map<std::string, at::Tensor> tensors;
  for (const auto& f : weight_files(path)) {
    auto st = mpx::load_safetensors(f);
    auto q = st.metadata.find("quantization");
    if (q == st.metadata.end()) continue;
    if (!format.empty() && format != q->second) throw mpx::config_error("moondream: the files at " + path + " mix formats (" + format + ", " + q->second + ")");
    format = q->second;
    tensors.merge(st.tensors);
  }
  if (format.empty()) {
    assign(read_weights(path, c), m.named_weights());
    return "weights " + path;
  }
  auto read = mpx::quant::read_packed(tensors, format);
  const Shapes want = expected_shapes(c);
  std::vector<std::string> wrong;
  for (const auto& [n, shape] : want) {
    auto plain = read.plain.find(n);
    auto packed = read.packed.find(n);
    const bool fits = plain != read.plain.end() ? plain->second.sizes().vec() == shape
                      : packed != read.packed.end() ? shape.size() == 2 && packed->second.codes.size(0) == shape[0] && packed->second.cols == shape[1]
                                                    : false;
    if (!fits) wrong.push_back(n);
  }
  for (const auto& [n, t] : read.plain)
    if (!want.count(n)) wrong.push_back(n + " (not in the model)");
  for (const auto& [n, p] : read.packed)
    if (!want.count(n)) wrong.push_back(n + " (not in the model)");
  if (!wrong.empty())
    throw mpx::config_error("moondream: the quantized weights at " + path + " do not fit config " + c.name + " (" + std::to_string(wrong.size()) + " tensors, e.g. " +
                            wrong.front() + "); pass the config they were exported with");
  const auto params = m.named_weights();
  torch::NoGradGuard ng;
  for (const auto& [n, t] : read.plain)
    if (auto it = params.find(n); it != params.end()) it->second.copy_(t.to(it->second.scalar_type()));
  mpx::quant::install_packed(m, read.packed, params);
  return "weights " + path + " (" + std::to_string(read.packed.size()) + " linears in " + format + ")";
}

}  // namespace moondream
