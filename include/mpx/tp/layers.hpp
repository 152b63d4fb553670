// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file tp/layers.hpp
/// Tensor-parallel building blocks, ordinary LibTorch modules that split themselves over the current
/// `tp::Group` (group.hpp) when built, and are their plain counterparts in a group of one:
/// - `ColumnLinear(in, out)`: the output features split N ways (a fused projection split per part:
///   `parts = {q, k, v}` takes this rank's share of each), input replicated (or, with sequence
///   parallelism, gathered from sequence shards); optionally gathers its output.
/// - `RowLinear(in, out)`: the input features split N ways, partial outputs summed (or reduce-scattered
///   to sequence shards); the bias is added once, after the sum.
/// - `VocabEmbedding(V, D)`: rows of the table split N ways; ids outside this rank's range look up zeros,
///   and the sum over the group is the full lookup.
/// - `cross_entropy(local_logits, targets)`: the loss over vocabulary-split logits without gathering them
///   (max, sum of exponentials and the target's logit reduced over the group).
/// A split parameter is this rank's shard of the full tensor the unsplit module draws with the same seed (the
/// full module is drawn, then cut), so TP = N starts from TP = 1's weights. Each block is a `SplitModule`:
/// it lists its split parameters (`splits()`), which the runtime uses to count gradient norms once per shard,
/// and which `unshard`/`shard` use to move weights between degrees by name.

#include <mpx/tp/ops.hpp>  // mpx::tp::copy_to, reduce_from, gather_from, ...

#include <torch/torch.h>  // torch::nn

#include <algorithm>  // std::find
#include <cmath>    // std::sqrt
#include <numeric>  // std::accumulate
#include <string>   // std::string
#include <vector>   // std::vector

namespace mpx::tp
{

/// How one parameter is split: along `dim`, in `parts` (the sizes along dim of the fused parts, each
/// split N ways; one part for a plain split).
struct Split
{
  std::string name;  ///< the parameter's name in its module ("weight")
  int64_t dim = 0;
  std::vector<int64_t> parts;  ///< full sizes; empty: one part, the whole dimension
};

/// A module that holds split parameters (see the file comment).
struct SplitModule
{
  virtual ~SplitModule() = default;
  virtual std::vector<Split> splits() const = 0;
  virtual const GroupPtr& group() const = 0;
  /// Whether it runs sequence-parallel (its replicated neighbours' gradients are then partial).
  virtual bool sequence_parallel() const { return false; }
};

/// Shard `rank` of `size` of full tensor `full` under `s` (each part's rank-th size-th along s.dim).
inline at::Tensor shard(const at::Tensor& full, const Split& s, int rank, int size)
{
  const std::vector<int64_t> parts = s.parts.empty() ? std::vector<int64_t>{full.size(s.dim)} : s.parts;
  std::vector<at::Tensor> mine;
  int64_t off = 0;
  for (auto p : parts) {
    const auto n = shard_size(p, size, "a split part of '" + s.name + "'");
    mine.push_back(full.narrow(s.dim, off + rank * n, n));
    off += p;
  }
  return torch::cat(mine, s.dim).clone();
}
/// This rank's shard of full tensor `full` under `s`.
inline at::Tensor shard(const at::Tensor& full, const Split& s, const Group& g) { return shard(full, s, g.rank, g.size); }

/// The full tensor whose shards under `s` are `shards` (shard r of shards.size(), in order): `shard`'s inverse.
inline at::Tensor join(const std::vector<at::Tensor>& shards, const Split& s)
{
  const auto n = int64_t(shards.size());
  const int64_t local_size = shards.at(0).size(s.dim);
  const std::vector<int64_t> parts = s.parts.empty() ? std::vector<int64_t>{local_size * n} : s.parts;
  std::vector<at::Tensor> out;
  int64_t off = 0;
  for (auto p : parts) {
    const auto each = p / n;
    for (auto& sh : shards) out.push_back(sh.narrow(s.dim, off, each));
    off += each;
  }
  return torch::cat(out, s.dim);
}

/// The full tensor of which every member holds `local` under `s` (a collective over the group).
inline at::Tensor unshard(const at::Tensor& local, const Split& s, const Group& g)
{
  return join(all_gather(g, local.detach(), "unshard (all-gather of a split parameter)"), s);
}

struct ColumnLinearOptions
{
  ColumnLinearOptions(int64_t in, int64_t out) : in_features_(in), out_features_(out) {}
  TORCH_ARG(int64_t, in_features);
  TORCH_ARG(int64_t, out_features);
  TORCH_ARG(bool, bias) = true;
  TORCH_ARG(bool, gather_output) = false;       ///< all-gather the output (one part only)
  TORCH_ARG(std::vector<int64_t>, parts) = {};  ///< fused parts' sizes (sum = out_features); empty: one
  TORCH_ARG(bool, sequence_parallel) = false;   ///< the input arrives split along dim 1 (the sequence)
};

/// Output features split (see the file comment).
struct ColumnLinearImpl : torch::nn::Module, SplitModule
{
  ColumnLinearImpl(int64_t in, int64_t out) : ColumnLinearImpl(ColumnLinearOptions(in, out)) {}
  explicit ColumnLinearImpl(const ColumnLinearOptions& o) : options(o), group_(current())
  {
    const auto& parts = o.parts();
    if (!parts.empty() && std::accumulate(parts.begin(), parts.end(), int64_t(0)) != o.out_features())
      throw config_error("mpx::tp::ColumnLinear: the parts' sizes must add up to out_features (" + std::to_string(o.out_features()) + ")");
    if (o.gather_output() && parts.size() > 1)
      throw config_error("mpx::tp::ColumnLinear: gather_output needs a single part; gather the parts after splitting them");
    torch::nn::Linear full(torch::nn::LinearOptions(o.in_features(), o.out_features()).bias(o.bias()));  // the unsplit draw
    weight = register_parameter("weight", shard(full->weight.detach(), {"weight", 0, parts}, *group_));
    if (o.bias()) bias = register_parameter("bias", shard(full->bias.detach(), {"bias", 0, parts}, *group_));
  }
  torch::Tensor forward(const torch::Tensor& x)
  {
    const auto in = options.sequence_parallel() ? gather_sequence(x, 1, group_) : copy_to(x, group_);
    auto y = torch::nn::functional::linear(in, weight, bias);
    return options.gather_output() ? gather_from(y, -1, group_) : y;
  }
  bool sequence_parallel() const override { return options.sequence_parallel() && group_->size > 1; }
  std::vector<Split> splits() const override
  {
    std::vector<Split> s{{"weight", 0, options.parts()}};
    if (options.bias()) s.push_back({"bias", 0, options.parts()});
    return s;
  }
  const GroupPtr& group() const override { return group_; }

  ColumnLinearOptions options;
  torch::Tensor weight, bias;

 private:
  GroupPtr group_;
};
TORCH_MODULE(ColumnLinear);

struct RowLinearOptions
{
  RowLinearOptions(int64_t in, int64_t out) : in_features_(in), out_features_(out) {}
  TORCH_ARG(int64_t, in_features);
  TORCH_ARG(int64_t, out_features);
  TORCH_ARG(bool, bias) = true;
  TORCH_ARG(bool, input_is_split) = true;      ///< the input is a column-parallel output; false: split it here
  TORCH_ARG(bool, sequence_parallel) = false;  ///< reduce-scatter the output along dim 1 instead of all-reducing
};

/// Input features split (see the file comment).
struct RowLinearImpl : torch::nn::Module, SplitModule
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
    const auto in = options.input_is_split() ? x : scatter_to(x, -1, group_);
    auto partial = torch::nn::functional::linear(in, weight);
    auto y = options.sequence_parallel() ? reduce_scatter_sequence(partial, 1, group_) : reduce_from(partial, group_);
    return bias.defined() ? y + bias : y;
  }
  std::vector<Split> splits() const override { return {{"weight", 1, {}}}; }
  bool sequence_parallel() const override { return options.sequence_parallel() && group_->size > 1; }
  const GroupPtr& group() const override { return group_; }

  RowLinearOptions options;
  torch::Tensor weight, bias;

 private:
  GroupPtr group_;
};
TORCH_MODULE(RowLinear);

/// The sizes of the full tensor of which `local` is one member's shard under `s` (every part splits evenly).
inline std::vector<int64_t> unsplit_sizes(const at::Tensor& local, const Split& s, const Group& g)
{
  auto sizes = local.sizes().vec();
  sizes[std::size_t(s.dim)] *= g.size;
  return sizes;
}

/// Lookup of `ids` in a vocabulary-split table: `local` holds rows [rank·R, (rank+1)·R) of the full
/// (V, D) table; ids outside them look up zeros, and the sum over the group (an all-reduce, or with
/// `sequence_parallel` a reduce-scatter along dim 1) is the full lookup. A raw table parameter (one that
/// is not a VocabEmbedding) uses it directly.
inline torch::Tensor vocab_embedding(const torch::Tensor& local, const torch::Tensor& ids, const GroupPtr& g = current(),
                                     bool sequence_parallel = false)
{
  if (g->size == 1) return torch::embedding(local, ids);
  const int64_t rows = local.size(0), lo = g->rank * rows;
  const auto outside = (ids < lo).logical_or(ids >= lo + rows);
  auto e = torch::embedding(local, (ids - lo).masked_fill(outside, 0)).masked_fill(outside.unsqueeze(-1), 0.0);
  return sequence_parallel ? reduce_scatter_sequence(e, 1, g) : reduce_from(e, g);
}

/// Rows of the table split (see the file comment).
struct VocabEmbeddingImpl : torch::nn::Module, SplitModule
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
  std::vector<Split> splits() const override { return {{"weight", 0, {}}}; }
  const GroupPtr& group() const override { return group_; }
  bool sequence_parallel() const override { return sequence_parallel_ && group_->size > 1; }

  int64_t vocab, rows = 0;
  torch::Tensor weight;

 private:
  bool sequence_parallel_;
  GroupPtr group_;
};
TORCH_MODULE(VocabEmbedding);

/// Mean cross-entropy of vocabulary-split logits `local` (..., V/N) against `targets` (...), skipping
/// `ignore_index`; the full logits are never gathered. In a group of one, torch's cross_entropy.
inline torch::Tensor cross_entropy(const torch::Tensor& local, const torch::Tensor& targets, int64_t ignore_index = -100,
                                   const GroupPtr& g = current())
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

/// Every split parameter of `m` and its submodules: full name → its split (and the group it is split over).
inline std::vector<std::pair<std::string, Split>> split_parameters(const torch::nn::Module& m)
{
  std::vector<std::pair<std::string, Split>> out;
  auto add = [&](const torch::nn::Module* mod, const std::string& prefix) {
    if (const auto* s = dynamic_cast<const SplitModule*>(mod); s && s->group()->size > 1)
      for (auto sp : s->splits()) out.emplace_back(prefix + sp.name, sp);
  };
  add(&m, "");  // the module itself (which need not be held by a shared_ptr)
  for (const auto& item : m.named_modules("", /*include_self=*/false)) add(item.value().get(), item.key() + ".");
  return out;
}

/// This rank's share of the squared gradient norm of `m`: its split parameters' squares, and the replicated
/// ones' on the group's first rank only — summed over the group, each parameter counts once (not N times).
inline double local_gradient_sq(const torch::nn::Module& m, const GroupPtr& g = current())
{
  std::vector<std::string> split;
  for (auto& [name, s] : split_parameters(m)) split.push_back(name);
  double sq = 0;
  for (const auto& p : m.named_parameters()) {
    if (!p.value().grad().defined()) continue;
    const bool is_split = std::find(split.begin(), split.end(), p.key()) != split.end();
    if (is_split || g->rank == 0) sq += p.value().grad().to(at::kDouble).pow(2).sum().item<double>();
  }
  return sq;
}

/// Under sequence parallelism every replicated parameter (LayerNorm, a row-parallel bias, positions) sees
/// 1/N of the sequence: sums their gradients over the group, so that each holds the full gradient.
inline void sum_replicated_gradients(const torch::nn::Module& m, const GroupPtr& g = current())
{
  if (g->size == 1) return;
  std::vector<std::string> split;
  for (auto& [name, s] : split_parameters(m)) split.push_back(name);
  for (const auto& p : m.named_parameters()) {
    if (!p.value().grad().defined() || std::find(split.begin(), split.end(), p.key()) != split.end()) continue;
    auto grad = p.value().mutable_grad();
    all_reduce(*g, grad, "sum_replicated_gradients (a sequence-parallel replicated parameter's gradient)");
  }
}

}  // namespace mpx::tp
