// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file lora/adapters.hpp
/// LoRA fine-tuning as a model transform (arXiv 2106.09685): `mpx::lora::apply(module, options)` freezes
/// every parameter of `module` and gives each chosen linear a low-rank adapter, `lora_a` (r × in) and
/// `lora_b` (out × r, zero: the model starts as it was), whose term `alpha/r · B·A·x` adds to the linear's
/// output (tp/adapter.hpp). The model code stays single-device and unchanged: call it on a stage's module
/// where the stage is built (a Trainer's `make`), before the Trainer takes the module, and the rest follows
/// from the adapters being the only parameters that require a gradient: only they get gradients, optimizer
/// state, data-parallel reduction and ZeRO shards; checkpoints save them (with
/// `CheckpointOptions::trainable_only`, them alone). Under tensor parallelism each adapter is cut to match
/// its linear (a column-parallel linear's B by rows, a row-parallel one's A by columns), so TP = N trains
/// what one process trains.
///
/// Which linears: those of mpx's `tp::ColumnLinear` and `tp::RowLinear` (a plain linear in a group of one)
/// whose name matches `Options::targets` in full (an ECMAScript regular expression; empty: all of them),
/// and of `Options::kinds`. A name is the module's path in `module`, or, given the stage's global names
/// (`named_weights()`), its weight's global name without ".weight", so that patterns and random draws are
/// the same in every layout. A `torch::nn::Linear` has no place for an adapter (its forward cannot be
/// extended): one that a pattern names is an error that says to build it as `tp::ColumnLinear`.
/// Each A is drawn as `kaiming_uniform(a = √5)` draws (U(±1/√in)) from a generator seeded by
/// `Options::seed` and the linear's name: the same adapters whatever the pipeline split or degree.
///
/// `fold(module)` merges every adapter into its weight in place (W += alpha/r · B·A, B then zero);
/// `merged(weights, alpha)` does it on whole tensors by name, for an export that loads as the plain model.

#include <mpx/errors.hpp>     // mpx::config_error
#include <mpx/linkage.hpp>    // MPX_DECL, MPX_DEFINITIONS
#include <mpx/tp/layers.hpp>  // mpx::tp::ColumnLinearImpl, RowLinearImpl

#include <torch/torch.h>  // torch::nn::Module

#include <cstdint>  // std::uint64_t
#include <map>      // std::map
#include <string>   // std::string
#include <vector>   // std::vector

namespace mpx::lora
{

/// Which kinds of linear take adapters.
enum class Kinds
{
  all,     ///< column- and row-parallel linears
  column,  ///< tp::ColumnLinear only (in a transformer: qkv, fc1, the head)
  row,     ///< tp::RowLinear only (proj, fc2)
};

struct Options
{
  int64_t rank = 8;     ///< r
  double alpha = 8;     ///< the adapter's term is scaled by alpha / r (alpha = r: unscaled, as moondream's own adapters)
  double dropout = 0;   ///< on the adapter's input
  std::string targets;  ///< a regular expression over the linears' names (see the file comment); empty: every one
  Kinds kinds = Kinds::all;
  std::uint64_t seed = 0;  ///< the adapters' A draws (with each linear's name)
  /// A non-empty `targets` that matches no linear of the module is an error; false: allowed (one pipeline
  /// stage may hold none of the targets; the caller checks the pattern against the whole model).
  bool require_match = true;
};

/// What `apply` did.
struct Report
{
  std::vector<std::string> adapted;         ///< the linears given an adapter, by name
  std::vector<std::string> not_adaptable;   ///< torch::nn::Linear modules left alone (no pattern named them)
  int64_t adapter_parameters = 0, frozen_parameters = 0;  ///< elements on this rank
};

/// Adds adapters to `m`'s linears and freezes everything else (see the file comment). `names`: the module's
/// parameters under their global names (a stage's `named_weights()`), or empty: names within `m`.
MPX_DECL Report apply(torch::nn::Module& m, const Options& o, const std::map<std::string, at::Tensor>& names = {});

/// Merges every adapter of `m` into its weight (each rank its own piece), leaving B zero.
MPX_DECL void fold(torch::nn::Module& m);

/// Whether `name` is an adapter's parameter ("....lora_a" or "....lora_b").
MPX_DECL bool is_adapter(const std::string& name);

/// Whole tensors by name with every adapter merged into its weight (W + alpha/r · B·A, r from A's rows) and
/// the adapters' own tensors dropped: what loads as the plain model.
MPX_DECL std::map<std::string, at::Tensor> merged(std::map<std::string, at::Tensor> whole, double alpha);

}  // namespace mpx::lora

#if MPX_DEFINITIONS
// ---- definitions (compiled once under MPX_SEPARATE_COMPILATION: linkage.hpp) ----
#include <ATen/CPUGeneratorImpl.h>  // at::CPUGeneratorImpl

#include <cmath>  // std::sqrt
#include <regex>  // std::regex

namespace mpx::lora
{
namespace detail
{
/// FNV-1a: a linear's name as a seed, the same in every build.
inline std::uint64_t name_hash(const std::string& s)
{
  std::uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

/// The whole A (r × in, U(±1/√in)) and B (out × r, zero) of the linear named `name`, as `weight`'s dtype and device.
inline std::pair<at::Tensor, at::Tensor> draw(const Options& o, const std::string& name, int64_t in, int64_t out, const at::Tensor& weight)
{
  auto g = at::make_generator<at::CPUGeneratorImpl>(o.seed ^ name_hash(name));
  const double bound = 1.0 / std::sqrt(double(in));
  auto a = torch::empty({o.rank, in}, torch::kFloat).uniform_(-bound, bound, g);
  return {a.to(weight.options()), torch::zeros({out, o.rank}, weight.options())};
}

/// A module's name for patterns and draws: its weight's global name without ".weight", else its own path.
inline std::string name_of(const std::string& path, const torch::nn::Module& m, const std::map<const c10::TensorImpl*, std::string>& global)
{
  if (const auto* w = m.named_parameters(false).find("weight"); w != nullptr)
    if (auto it = global.find(w->unsafeGetTensorImpl()); it != global.end() && it->second.ends_with(".weight"))
      return it->second.substr(0, it->second.size() - 7);
  return path;
}
}  // namespace detail

MPX_DECL Report apply(torch::nn::Module& m, const Options& o, const std::map<std::string, at::Tensor>& names)
{
  if (o.rank < 1) throw config_error("mpx::lora::apply: the rank must be at least 1 (got " + std::to_string(o.rank) + ")");
  if (!(o.alpha > 0)) throw config_error("mpx::lora::apply: alpha must be positive (got " + std::to_string(o.alpha) + ")");
  if (!(o.dropout >= 0 && o.dropout < 1)) throw config_error("mpx::lora::apply: the dropout must be in [0, 1) (got " + std::to_string(o.dropout) + ")");
  std::regex pattern;
  try {
    pattern = std::regex(o.targets.empty() ? std::string(".*") : o.targets, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    throw config_error("mpx::lora::apply: the targets pattern '" + o.targets + "' is not a regular expression (" + e.what() + ")");
  }
  std::map<const c10::TensorImpl*, std::string> global;
  for (const auto& [n, t] : names) global[t.unsafeGetTensorImpl()] = n;
  // which linears, before anything changes: a failed apply leaves the module as it was
  Report r;
  std::vector<std::pair<std::string, torch::nn::Module*>> chosen;
  std::string example = "(none: the module has no mpx linear)";
  for (const auto& item : m.named_modules("", /*include_self=*/true)) {
    torch::nn::Module& child = *item.value();
    const std::string name = detail::name_of(item.key(), child, global);
    const bool column = dynamic_cast<tp::ColumnLinearImpl*>(&child) != nullptr, row = dynamic_cast<tp::RowLinearImpl*>(&child) != nullptr;
    if (!column && !row) {
      if (dynamic_cast<torch::nn::LinearImpl*>(&child) == nullptr) continue;
      if (!o.targets.empty() && std::regex_match(name, pattern))
        throw config_error("mpx::lora::apply: '" + name + "' matches the targets but is a torch::nn::Linear, which cannot take an adapter; build it as "
                           "mpx::tp::ColumnLinear (a plain linear in a group of one), or narrow the pattern '" + o.targets + "'");
      r.not_adaptable.push_back(name);
      continue;
    }
    if (example.starts_with("(none")) example = name;
    if ((column && o.kinds == Kinds::row) || (row && o.kinds == Kinds::column) || !std::regex_match(name, pattern)) continue;
    if (column ? dynamic_cast<tp::ColumnLinearImpl&>(child).lora.defined() : dynamic_cast<tp::RowLinearImpl&>(child).lora.defined())
      throw config_error("mpx::lora::apply: '" + name + "' has an adapter already; apply once per model (fold merges adapters into the weights)");
    chosen.emplace_back(name, &child);
  }
  if (chosen.empty() && !o.targets.empty() && o.require_match)
    throw config_error("mpx::lora::apply: no ColumnLinear or RowLinear" + std::string(o.kinds == Kinds::all ? "" : " of the kind asked") +
                       " matches the targets '" + o.targets + "'; the linears are named like '" + example + "'");
  for (auto& p : m.parameters()) p.requires_grad_(false), r.frozen_parameters += p.numel();
  for (auto& [name, child] : chosen) {
    auto* column = dynamic_cast<tp::ColumnLinearImpl*>(child);
    auto* row = dynamic_cast<tp::RowLinearImpl*>(child);
    const int64_t in = column ? column->options.in_features() : row->options.in_features();
    const int64_t out = column ? column->options.out_features() : row->options.out_features();
    const auto [a, b] = detail::draw(o, name, in, out, column ? column->weight : row->weight);
    const double scale = o.alpha / double(o.rank);
    column ? column->adapt(a, b, scale, o.dropout) : row->adapt(a, b, scale, o.dropout);
    const auto& ad = column ? column->lora : row->lora;
    r.adapter_parameters += ad.a.numel() + ad.b.numel();
    r.adapted.push_back(name);
  }
  return r;
}

MPX_DECL void fold(torch::nn::Module& m)
{
  for (const auto& child : m.modules(/*include_self=*/true)) {
    auto* column = dynamic_cast<tp::ColumnLinearImpl*>(child.get());
    auto* row = dynamic_cast<tp::RowLinearImpl*>(child.get());
    if ((column && column->form.base.defined()) || (row && row->form.base.defined()))
      throw config_error("mpx::lora::fold: a linear's base is held quantized (packed); merge under quant::Unpacked, or merge whole tensors (lora::merged)");
  }
  for (const auto& child : m.modules(/*include_self=*/true)) {
    if (auto* c = dynamic_cast<tp::ColumnLinearImpl*>(child.get())) tp::fold(c->weight, c->lora);
    if (auto* r = dynamic_cast<tp::RowLinearImpl*>(child.get())) tp::fold(r->weight, r->lora);
  }
}

MPX_DECL bool is_adapter(const std::string& name) { return name.ends_with(".lora_a") || name.ends_with(".lora_b") || name == "lora_a" || name == "lora_b"; }

MPX_DECL std::map<std::string, at::Tensor> merged(std::map<std::string, at::Tensor> whole, double alpha)
{
  torch::NoGradGuard ng;
  std::map<std::string, at::Tensor> out;
  for (const auto& [name, t] : whole) {
    if (is_adapter(name)) continue;
    out[name] = t;
    if (!name.ends_with("weight")) continue;
    const std::string base = name.substr(0, name.size() - 6);  // "….", or "" for a bare "weight"
    auto a = whole.find(base + "lora_a"), b = whole.find(base + "lora_b");
    if (a == whole.end() || b == whole.end()) continue;
    const auto product = torch::mm(b->second.to(at::kFloat), a->second.to(at::kFloat)) * (alpha / double(a->second.size(0)));
    if (product.sizes() != t.sizes())
      throw config_error("mpx::lora::merged: " + base + "lora_b·lora_a is " + c10::str(product.sizes()) + ", its weight " + c10::str(t.sizes()) +
                         "; merge whole tensors (tp::unshard the pieces first)");
    out[name] = (t.to(at::kFloat) + product).to(t.scalar_type());
  }
  return out;
}

}  // namespace mpx::lora
#endif  // MPX_DEFINITIONS
