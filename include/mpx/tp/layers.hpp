// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file tp/layers.hpp
/// Tensor-parallel building blocks, ordinary LibTorch modules that cut themselves over the current
/// `tp::Group` (group.hpp) when built, and are their plain counterparts in a group of one:
/// - `ColumnLinear(in, out)`: the output features cut N ways (a fused projection cut per part:
///   `parts = {q, k, v}` takes this rank's share of each; with `units = {H, K, K}` heads, a part of fewer
///   heads than ranks is shared, each head held by N / K adjacent ranks, and `sum_shared_gradients` sums
///   their gradients), input replicated (or, with sequence parallelism, gathered from sequence shards);
///   optionally gathers its output.
/// - `RowLinear(in, out)`: the input features cut N ways, partial outputs summed (or reduce-scattered
///   to sequence shards); the bias is added once, after the sum.
/// - `VocabEmbedding(V, D)`: rows of the table cut N ways; ids outside this rank's range look up zeros,
///   and the sum over the group is the full lookup.
/// - `cross_entropy(local_logits, targets)`: the loss over vocabulary-sharded logits without gathering them
///   (max, sum of exponentials and the target's logit reduced over the group).
/// A cut parameter is this rank's shard of the whole tensor the plain module draws with the same seed (the
/// whole module is drawn, then cut), so TP = N starts from TP = 1's weights. Each block is a `CutModule`
/// (cut.hpp): it lists its cuts, which the runtime uses to count gradient norms once per shard
/// (gradients.hpp), and which `unshard`/`shard` use to move weights between degrees by name. Both linears
/// take a low-rank adapter (`adapt`; adapter.hpp cuts its A and B to match the weight; lora/adapters.hpp
/// adds adapters to a model's linears), and a weight in fewer bits (`quantize_base`: a frozen base held
/// packed; `fake_quantize`: quantization-aware training; quantized.hpp, quant/model.hpp).

#include <mpx/errors.hpp>    // mpx::config_error
#include <mpx/linkage.hpp>   // MPX_DECL, MPX_DEFINITIONS
#include <mpx/tp/adapter.hpp>  // mpx::tp::Adapter, column_delta, row_delta
#include <mpx/tp/cut.hpp>    // mpx::tp::Cut, CutModule, shard
#include <mpx/tp/group.hpp>  // mpx::tp::Group, current, shard_size
#include <mpx/tp/ops.hpp>    // mpx::tp::copy_to, reduce_from, gather_from, ...
#include <mpx/tp/quantized.hpp>  // mpx::tp::WeightForm, base_linear, used_weight, pack_base

#include <torch/torch.h>  // torch::nn

#include <algorithm>  // std::all_of
#include <numeric>    // std::accumulate
#include <string>     // std::string
#include <vector>     // std::vector

namespace mpx::tp
{

/// Throws unless `a` (r × in) and `b` (out × r) fit a linear of `in` → `out` features without an adapter.
inline void check_adaptable(const char* what, const Adapter& present, const at::Tensor& a, const at::Tensor& b, int64_t in, int64_t out)
{
  if (present.defined()) throw config_error(std::string("mpx::tp::") + what + "::adapt: the linear has an adapter already; fold it or build the model again");
  if (a.dim() != 2 || b.dim() != 2 || a.size(0) < 1 || a.size(1) != in || b.size(0) != out || b.size(1) != a.size(0))
    throw config_error(std::string("mpx::tp::") + what + "::adapt: A must be (r, " + std::to_string(in) + ") and B (" + std::to_string(out) +
                       ", r), r >= 1; got A " + c10::str(a.sizes()) + ", B " + c10::str(b.sizes()));
}

struct ColumnLinearOptions
{
  ColumnLinearOptions(int64_t in, int64_t out) : in_features_(in), out_features_(out) {}
  TORCH_ARG(int64_t, in_features);
  TORCH_ARG(int64_t, out_features);
  TORCH_ARG(bool, bias) = true;
  TORCH_ARG(bool, gather_output) = false;       ///< all-gather the output (one part only)
  TORCH_ARG(std::vector<int64_t>, parts) = {};  ///< fused parts' sizes (sum = out_features); empty: one
  /// Per part, how many indivisible units (attention heads) it holds; empty: any even cut. A part with
  /// fewer units than ranks is shared: each unit is held by N / units adjacent ranks (grouped-query key/value
  /// heads), which needs N to be a multiple of the units.
  TORCH_ARG(std::vector<int64_t>, units) = {};
  TORCH_ARG(bool, sequence_parallel) = false;   ///< the input arrives sharded along dim 1 (the sequence)
};

/// Output features cut (see the file comment).
struct ColumnLinearImpl : torch::nn::Module, CutModule
{
  ColumnLinearImpl(int64_t in, int64_t out) : ColumnLinearImpl(ColumnLinearOptions(in, out)) {}
  explicit ColumnLinearImpl(const ColumnLinearOptions& o) : options(o), group_(current())
  {
    const auto& parts = o.parts();
    if (!parts.empty() && std::accumulate(parts.begin(), parts.end(), int64_t(0)) != o.out_features())
      throw config_error("mpx::tp::ColumnLinear: the parts' sizes must add up to out_features (" + std::to_string(o.out_features()) + ")");
    if (o.gather_output() && (parts.size() > 1 || !o.units().empty()))
      throw config_error("mpx::tp::ColumnLinear: gather_output needs a single part without units; gather the parts after cutting them");
    cut_ = {"weight", 0, parts, shares_of(o, group_->size)};
    torch::nn::Linear full(torch::nn::LinearOptions(o.in_features(), o.out_features()).bias(o.bias()));  // the whole draw
    weight = register_parameter("weight", shard(full->weight.detach(), cut_, *group_));
    if (o.bias()) bias = register_parameter("bias", shard(full->bias.detach(), {"bias", 0, parts, cut_.shares}, *group_));
  }
  /// How many ranks hold each part's pieces at degree n (see ColumnLinearOptions::units).
  static std::vector<int64_t> shares_of(const ColumnLinearOptions& o, int n)
  {
    const auto& units = o.units();
    if (units.empty()) return {};
    if (units.size() != std::max<std::size_t>(o.parts().size(), 1))
      throw config_error("mpx::tp::ColumnLinear: give units for every part (" + std::to_string(o.parts().size()) + "), or none");
    std::vector<int64_t> shares;
    for (auto u : units) {
      if (u <= 0 || (u % n != 0 && n % u != 0))
        throw config_error("mpx::tp::ColumnLinear: a part of " + std::to_string(u) + " units (heads) cannot be cut over " + std::to_string(n) +
                           " ranks: the degree must divide the units, or be a multiple of them (each unit then held by degree / units ranks)");
      shares.push_back(u >= n ? 1 : n / u);
    }
    if (std::all_of(shares.begin(), shares.end(), [](int64_t x) { return x == 1; })) return {};
    return shares;
  }
  torch::Tensor forward(const torch::Tensor& x)
  {
    const bool sp = options.sequence_parallel();
    auto y = form.base.defined() ? base_linear(sp ? gather_sequence(x, 1, group_) : copy_to(x, group_), form.base, bias)
             : sp ? gathered_linear(x, used_weight(weight, form), bias, 1, group_)  // keeps the shard, not the gathered input
                  : torch::nn::functional::linear(copy_to(x, group_), used_weight(weight, form), bias);
    if (lora.defined()) y = y + column_delta(lora, x, sequence_parallel(), is_training(), group_);
    return options.gather_output() ? gather_from(y, -1, group_) : y;
  }
  /// Adds a low-rank adapter from the whole `a` (r × in) and `b` (out × r): A kept whole, B's rows cut as
  /// the weight's (adapter.hpp).
  void adapt(const at::Tensor& a, const at::Tensor& b, double scale, double dropout)
  {
    check_adaptable("ColumnLinear", lora, a, b, options.in_features(), options.out_features());
    lora.a = register_parameter("lora_a", a.detach().clone());
    lora.b = register_parameter("lora_b", shard(b.detach(), {"lora_b", 0, cut_.parts, cut_.shares}, *group_));
    lora.scale = scale, lora.dropout = dropout;
  }
  /// Holds the frozen weight packed as `s` (quantized.hpp), or trains it quantization-aware.
  void quantize_base(const quant::Spec& s) { pack_base(*this, weight, form, s, {}); }
  void fake_quantize(const quant::Spec& s) { form.trained = checked_trainable(form, weight, s); }
  bool sequence_parallel() const override { return options.sequence_parallel() && group_->size > 1; }
  std::vector<Cut> cuts() const override
  {
    std::vector<Cut> s{cut_};
    if (options.bias()) s.push_back({"bias", 0, cut_.parts, cut_.shares});
    if (lora.defined()) s.push_back({"lora_b", 0, cut_.parts, cut_.shares});
    return s;
  }
  const GroupPtr& group() const override { return group_; }

  ColumnLinearOptions options;
  torch::Tensor weight, bias;
  Adapter lora;     ///< none unless adapted
  WeightForm form;  ///< the weight as it is, unless quantized

 private:
  GroupPtr group_;
  Cut cut_;
};
TORCH_MODULE(ColumnLinear);

struct RowLinearOptions
{
  RowLinearOptions(int64_t in, int64_t out) : in_features_(in), out_features_(out) {}
  TORCH_ARG(int64_t, in_features);
  TORCH_ARG(int64_t, out_features);
  TORCH_ARG(bool, bias) = true;
  TORCH_ARG(bool, input_is_sharded) = true;      ///< the input is a column-parallel output; false: shard it here
  TORCH_ARG(bool, sequence_parallel) = false;  ///< reduce-scatter the output along dim 1 instead of all-reducing
};

/// Input features cut (see the file comment).
struct RowLinearImpl : torch::nn::Module, CutModule
{
  RowLinearImpl(int64_t in, int64_t out) : RowLinearImpl(RowLinearOptions(in, out)) {}
  explicit RowLinearImpl(const RowLinearOptions& o) : options(o), group_(current())
  {
    torch::nn::Linear full(torch::nn::LinearOptions(o.in_features(), o.out_features()).bias(o.bias()));
    weight = register_parameter("weight", shard(full->weight.detach(), {"weight", 1, {}}, *group_));
    if (o.bias()) bias = register_parameter("bias", full->bias.detach().clone());  // replicated
  }
  torch::Tensor forward(const torch::Tensor& x)
  {
    const auto in = options.input_is_sharded() ? x : scatter_to(x, -1, group_);
    auto partial = form.base.defined() ? base_linear(in, form.base, {}) : torch::nn::functional::linear(in, used_weight(weight, form, group_));
    auto y = options.sequence_parallel() ? reduce_scatter_sequence(partial, 1, group_) : reduce_from(partial, group_);
    if (lora.defined()) y = y + row_delta(lora, in, options.sequence_parallel(), is_training(), group_);
    return bias.defined() ? y + bias : y;
  }
  /// Adds a low-rank adapter from the whole `a` (r × in) and `b` (out × r): A's columns cut as the
  /// weight's, B kept whole (adapter.hpp).
  void adapt(const at::Tensor& a, const at::Tensor& b, double scale, double dropout)
  {
    check_adaptable("RowLinear", lora, a, b, options.in_features(), options.out_features());
    lora.a = register_parameter("lora_a", shard(a.detach(), {"lora_a", 1, {}}, *group_));
    lora.b = register_parameter("lora_b", b.detach().clone());
    lora.scale = scale, lora.dropout = dropout;
  }
  /// As ColumnLinear's, with the statistics of each whole row from the group.
  void quantize_base(const quant::Spec& s) { pack_base(*this, weight, form, s, rows_over(group_)); }
  void fake_quantize(const quant::Spec& s) { form.trained = checked_trainable(form, weight, s); }
  std::vector<Cut> cuts() const override
  {
    if (lora.defined()) return {{"weight", 1, {}}, {"lora_a", 1, {}}};
    return {{"weight", 1, {}}};
  }
  bool sequence_parallel() const override { return options.sequence_parallel() && group_->size > 1; }
  const GroupPtr& group() const override { return group_; }

  RowLinearOptions options;
  torch::Tensor weight, bias;
  Adapter lora;     ///< none unless adapted
  WeightForm form;  ///< the weight as it is, unless quantized

 private:
  GroupPtr group_;
};
TORCH_MODULE(RowLinear);

/// The sizes of the full tensor of which `local` is one member's shard under `s`.

/// Lookup of `ids` in a vocabulary-sharded table: `local` holds rows [rank·R, (rank+1)·R) of the full
/// (V, D) table; ids outside them look up zeros, and the sum over the group (an all-reduce, or with
/// `sequence_parallel` a reduce-scatter along dim 1) is the full lookup. A raw table parameter (one that
/// is not a VocabEmbedding) uses it directly.
MPX_DECL torch::Tensor vocab_embedding(const torch::Tensor& local, const torch::Tensor& ids, const GroupPtr& g = current(),
                                     bool sequence_parallel = false);

/// Rows of the table cut (see the file comment).
struct VocabEmbeddingImpl : torch::nn::Module, CutModule
{
  /// Drawn as torch::nn::Embedding(V, D) draws (standard normal).
  VocabEmbeddingImpl(int64_t vocab, int64_t dim) : VocabEmbeddingImpl(torch::nn::Embedding(vocab, dim)->weight.detach()) {}
  /// This rank's rows of the full table `full` (V, D), e.g. `torch::randn({V, D}) * 0.02`.
  explicit VocabEmbeddingImpl(const torch::Tensor& full, bool sequence_parallel = false)
      : vocab(full.size(0)), sequence_parallel_(sequence_parallel), group_(current())
  {
    rows = shard_size(vocab, group_->size, "the vocabulary of a VocabEmbedding");
    weight = register_parameter("weight", shard(full.detach(), {"weight", 0, {}}, *group_));
  }
  torch::Tensor forward(const torch::Tensor& ids) { return vocab_embedding(weight, ids, group_, sequence_parallel_); }
  std::vector<Cut> cuts() const override { return {{"weight", 0, {}}}; }
  const GroupPtr& group() const override { return group_; }
  bool sequence_parallel() const override { return sequence_parallel_ && group_->size > 1; }

  int64_t vocab, rows = 0;
  torch::Tensor weight;

 private:
  bool sequence_parallel_;
  GroupPtr group_;
};
TORCH_MODULE(VocabEmbedding);

/// Mean cross-entropy of vocabulary-sharded logits `local` (..., V/N) against `targets` (...), skipping
/// `ignore_index`; the full logits are never gathered. In a group of one, torch's cross_entropy.
MPX_DECL torch::Tensor cross_entropy(const torch::Tensor& local, const torch::Tensor& targets, int64_t ignore_index = -100,
                                   const GroupPtr& g = current());

}  // namespace mpx::tp

#if MPX_DEFINITIONS
// ---- definitions (compiled once under MPX_SEPARATE_COMPILATION: linkage.hpp) ----

namespace mpx::tp
{

MPX_DECL torch::Tensor vocab_embedding(const torch::Tensor& local, const torch::Tensor& ids, const GroupPtr& g,
                                     bool sequence_parallel)
{
  if (g->size == 1) return torch::embedding(local, ids);
  const int64_t rows = local.size(0), lo = g->rank * rows;
  const auto outside = (ids < lo).logical_or(ids >= lo + rows);
  auto e = torch::embedding(local, (ids - lo).masked_fill(outside, 0)).masked_fill(outside.unsqueeze(-1), 0.0);
  return sequence_parallel ? reduce_scatter_sequence(e, 1, g) : reduce_from(e, g);
}

MPX_DECL torch::Tensor cross_entropy(const torch::Tensor& local, const torch::Tensor& targets, int64_t ignore_index,
                                   const GroupPtr& g)
{
  const auto V = local.size(-1);
  if (g->size == 1)
    return torch::nn::functional::cross_entropy(local.reshape({-1, V}), targets.reshape({-1}),
                                                torch::nn::functional::CrossEntropyFuncOptions().ignore_index(ignore_index));
  const auto x = local.reshape({-1, V});
  const auto t = targets.reshape({-1});
  auto m = std::get<0>(x.detach().max(-1, true)).contiguous();
  all_reduce_max(*g, m, "cross_entropy (the logits' maximum)");
  const auto z = x - m;                                      // the maximum only steadies exp: no gradient through it
  const auto sum_exp = reduce_from(z.exp().sum(-1), g);      // sum over the whole vocabulary
  const int64_t lo = g->rank * V;
  const auto mine = (t >= lo).logical_and(t < lo + V);       // the target's logit lives here
  const auto target_z = reduce_from(z.gather(-1, (t - lo).clamp(0, V - 1).unsqueeze(-1)).squeeze(-1) * mine, g);
  const auto valid = t != ignore_index;
  const auto per = (sum_exp.log() - target_z) * valid;
  return per.sum() / valid.sum();
}
}  // namespace mpx::tp
#endif  // MPX_DEFINITIONS
