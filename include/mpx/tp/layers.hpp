// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file tp/layers.hpp
/// Tensor-parallel building blocks, ordinary LibTorch modules that split themselves over the current
/// `tp::Group` (group.hpp) when built, and are their plain counterparts in a group of one:
/// - `ColumnLinear(in, out)`: the output features split N ways (a fused projection split per part:
///   `parts = {q, k, v}` takes this rank's share of each; with `units = {H, K, K}` heads, a part of fewer
///   heads than ranks is shared, each head held by N / K adjacent ranks, and `sum_shared_gradients` sums
///   their gradients), input replicated (or, with sequence parallelism, gathered from sequence shards);
///   optionally gathers its output.
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
#include <mpx/runtime/linkage.hpp>  // MPX_DECL, MPX_DEFINITIONS

#include <torch/torch.h>  // torch::nn

#include <algorithm>  // std::find_if, std::any_of, std::all_of
#include <cmath>    // std::sqrt
#include <numeric>  // std::accumulate
#include <string>   // std::string
#include <utility>  // std::pair
#include <vector>   // std::vector

namespace mpx::tp
{

/// How one parameter is split: along `dim`, in `parts` (the sizes along dim of the fused parts, each
/// split N ways; one part for a plain split). A part may be *shared*: with `shares[i]` = s > 1, part i is
/// cut into N / s pieces and each piece is held by s adjacent ranks (rank r holds piece r / s) — the
/// key/value heads of grouped-query attention when there are fewer of them than ranks.
struct Split
{
  std::string name;  ///< the parameter's name in its module ("weight")
  int64_t dim = 0;
  std::vector<int64_t> parts;   ///< full sizes; empty: one part, the whole dimension
  std::vector<int64_t> shares = {};  ///< per part, the ranks holding each of its pieces; empty: 1 each

  int64_t share(std::size_t part) const { return part < shares.size() ? shares[part] : 1; }
  bool shared() const { return std::any_of(shares.begin(), shares.end(), [](int64_t s) { return s > 1; }); }
};

namespace detail
{
/// One part of a split parameter as one rank holds it: the full part's size, how many ranks hold each
/// piece, this rank's piece (offset within the full part, size) and where it sits in the local tensor.
struct PartPiece
{
  int64_t full = 0, share = 1, piece = 0, size = 0, local_offset = 0;
};
/// The pieces rank `rank` of `size` holds under `s`, part by part; `full` is the whole dimension's size
/// when `s` has one part (empty `parts`).
MPX_DECL std::vector<PartPiece> pieces_of(const Split& s, int64_t full, int rank, int size);
}  // namespace detail

/// A module that holds split parameters (see the file comment).
struct SplitModule
{
  virtual ~SplitModule() = default;
  virtual std::vector<Split> splits() const = 0;
  virtual const GroupPtr& group() const = 0;
  /// Whether it runs sequence-parallel (its replicated neighbours' gradients are then partial).
  virtual bool sequence_parallel() const { return false; }
};

/// Shard `rank` of `size` of full tensor `full` under `s` (each part's piece rank / share, of size / share).
MPX_DECL at::Tensor shard(const at::Tensor& full, const Split& s, int rank, int size);
/// This rank's shard of full tensor `full` under `s`.
inline at::Tensor shard(const at::Tensor& full, const Split& s, const Group& g) { return shard(full, s, g.rank, g.size); }

/// The size along `s.dim` of the full tensor of which a member of a group of `size` holds `local_size`.
MPX_DECL int64_t unsplit_size(int64_t local_size, const Split& s, int size);

/// The full tensor whose shards under `s` are `shards` (shard r of shards.size(), in order): `shard`'s
/// inverse (a shared piece is taken from the first rank that holds it).
MPX_DECL at::Tensor join(const std::vector<at::Tensor>& shards, const Split& s);

/// The full tensor of which every member holds `local` under `s` (a collective over the group).
MPX_DECL at::Tensor unshard(const at::Tensor& local, const Split& s, const Group& g);

struct ColumnLinearOptions
{
  ColumnLinearOptions(int64_t in, int64_t out) : in_features_(in), out_features_(out) {}
  TORCH_ARG(int64_t, in_features);
  TORCH_ARG(int64_t, out_features);
  TORCH_ARG(bool, bias) = true;
  TORCH_ARG(bool, gather_output) = false;       ///< all-gather the output (one part only)
  TORCH_ARG(std::vector<int64_t>, parts) = {};  ///< fused parts' sizes (sum = out_features); empty: one
  /// Per part, how many indivisible units (attention heads) it holds; empty: any even split. A part with
  /// fewer units than ranks is shared: each unit is held by N / units adjacent ranks (grouped-query key/value
  /// heads), which needs N to be a multiple of the units.
  TORCH_ARG(std::vector<int64_t>, units) = {};
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
    if (o.gather_output() && (parts.size() > 1 || !o.units().empty()))
      throw config_error("mpx::tp::ColumnLinear: gather_output needs a single part without units; gather the parts after splitting them");
    split_ = {"weight", 0, parts, shares_of(o, group_->size)};
    torch::nn::Linear full(torch::nn::LinearOptions(o.in_features(), o.out_features()).bias(o.bias()));  // the unsplit draw
    weight = register_parameter("weight", shard(full->weight.detach(), split_, *group_));
    if (o.bias()) bias = register_parameter("bias", shard(full->bias.detach(), {"bias", 0, parts, split_.shares}, *group_));
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
        throw config_error("mpx::tp::ColumnLinear: a part of " + std::to_string(u) + " units (heads) cannot be split over " + std::to_string(n) +
                           " ranks: the degree must divide the units, or be a multiple of them (each unit then held by degree / units ranks)");
      shares.push_back(u >= n ? 1 : n / u);
    }
    if (std::all_of(shares.begin(), shares.end(), [](int64_t x) { return x == 1; })) return {};
    return shares;
  }
  torch::Tensor forward(const torch::Tensor& x)
  {
    auto y = options.sequence_parallel() ? gathered_linear(x, weight, bias, 1, group_)  // keeps the shard, not the gathered input
                                         : torch::nn::functional::linear(copy_to(x, group_), weight, bias);
    return options.gather_output() ? gather_from(y, -1, group_) : y;
  }
  bool sequence_parallel() const override { return options.sequence_parallel() && group_->size > 1; }
  std::vector<Split> splits() const override
  {
    std::vector<Split> s{split_};
    if (options.bias()) s.push_back({"bias", 0, split_.parts, split_.shares});
    return s;
  }
  const GroupPtr& group() const override { return group_; }

  ColumnLinearOptions options;
  torch::Tensor weight, bias;

 private:
  GroupPtr group_;
  Split split_;
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

/// The sizes of the full tensor of which `local` is one member's shard under `s`.
MPX_DECL std::vector<int64_t> unsplit_sizes(const at::Tensor& local, const Split& s, const Group& g);

/// Lookup of `ids` in a vocabulary-split table: `local` holds rows [rank·R, (rank+1)·R) of the full
/// (V, D) table; ids outside them look up zeros, and the sum over the group (an all-reduce, or with
/// `sequence_parallel` a reduce-scatter along dim 1) is the full lookup. A raw table parameter (one that
/// is not a VocabEmbedding) uses it directly.
MPX_DECL torch::Tensor vocab_embedding(const torch::Tensor& local, const torch::Tensor& ids, const GroupPtr& g = current(),
                                     bool sequence_parallel = false);

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
MPX_DECL torch::Tensor cross_entropy(const torch::Tensor& local, const torch::Tensor& targets, int64_t ignore_index = -100,
                                   const GroupPtr& g = current());

/// Every split parameter of `m` and its submodules: full name → its split (and the group it is split over).
MPX_DECL std::vector<std::pair<std::string, Split>> split_parameters(const torch::nn::Module& m);

/// The ranges [start, start + length) along `s.dim` of a local shard (of `local_size` along it) that rank
/// `rank` of `size` counts in norms: all of it, except the pieces of shared parts that a lower rank also
/// holds (each piece counts once, on the first of the ranks that hold it). Adjacent ranges are merged.
MPX_DECL std::vector<std::pair<int64_t, int64_t>> counted_ranges(const Split& s, int64_t local_size, int rank, int size);

/// This rank's share of the squared gradient norm of `m`: its split parameters' squares (a shared piece on
/// the first rank holding it only), and the replicated ones' on the group's first rank only — summed over
/// the group, each parameter counts once (not N times).
MPX_DECL double local_gradient_sq(const torch::nn::Module& m, const GroupPtr& g = current());

/// Under grouped-query attention with fewer key/value heads than ranks, the ranks sharing a head each hold
/// the gradient of their own query heads' use of it: sums every shared piece's gradient over the ranks
/// that hold it (one all-reduce for the whole module, each piece placed at its place in the full part).
MPX_DECL void sum_shared_gradients(const torch::nn::Module& m, const GroupPtr& g = current());

/// Under sequence parallelism every replicated parameter (LayerNorm, a row-parallel bias, positions) sees
/// 1/N of the sequence: sums their gradients over the group, so that each holds the full gradient.
MPX_DECL void sum_replicated_gradients(const torch::nn::Module& m, const GroupPtr& g = current());

}  // namespace mpx::tp

#if MPX_DEFINITIONS
// ---- definitions (compiled once under MPX_SEPARATE_COMPILATION: runtime/linkage.hpp) ----

namespace mpx::tp::detail
{
MPX_DECL std::vector<PartPiece> pieces_of(const Split& s, int64_t full, int rank, int size)
{
  const std::vector<int64_t> parts = s.parts.empty() ? std::vector<int64_t>{full} : s.parts;
  std::vector<PartPiece> out;
  int64_t local = 0;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    PartPiece p;
    p.full = parts[i], p.share = s.share(i);
    if (p.share < 1 || size % p.share != 0)
      throw config_error("mpx::tp: part " + std::to_string(i) + " of '" + s.name + "' is shared by " + std::to_string(p.share) +
                         " ranks, which does not divide the group of " + std::to_string(size));
    p.size = shard_size(p.full, int(size / p.share), "a split part of '" + s.name + "'");
    p.piece = rank / p.share;
    p.local_offset = local;
    local += p.size;
    out.push_back(p);
  }
  return out;
}

}  // namespace mpx::tp::detail

namespace mpx::tp
{
MPX_DECL at::Tensor shard(const at::Tensor& full, const Split& s, int rank, int size)
{
  std::vector<at::Tensor> mine;
  int64_t off = 0;
  for (const auto& p : detail::pieces_of(s, full.size(s.dim), rank, size)) {
    mine.push_back(full.narrow(s.dim, off + p.piece * p.size, p.size));
    off += p.full;
  }
  return torch::cat(mine, s.dim).clone();
}

MPX_DECL int64_t unsplit_size(int64_t local_size, const Split& s, int size)
{
  if (!s.parts.empty()) return std::accumulate(s.parts.begin(), s.parts.end(), int64_t(0));
  return local_size * (size / s.share(0));
}

MPX_DECL at::Tensor join(const std::vector<at::Tensor>& shards, const Split& s)
{
  const int n = int(shards.size());
  const auto full = unsplit_size(shards.at(0).size(s.dim), s, n);
  std::vector<at::Tensor> out;
  for (const auto& p : detail::pieces_of(s, full, 0, n))
    for (int64_t piece = 0; piece < n / p.share; ++piece) out.push_back(shards[std::size_t(piece * p.share)].narrow(s.dim, p.local_offset, p.size));
  return torch::cat(out, s.dim);
}

MPX_DECL at::Tensor unshard(const at::Tensor& local, const Split& s, const Group& g)
{
  return join(all_gather(g, local.detach(), "unshard (all-gather of a split parameter)"), s);
}

MPX_DECL std::vector<int64_t> unsplit_sizes(const at::Tensor& local, const Split& s, const Group& g)
{
  auto sizes = local.sizes().vec();
  sizes[std::size_t(s.dim)] = unsplit_size(local.size(s.dim), s, g.size);
  return sizes;
}

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

MPX_DECL std::vector<std::pair<std::string, Split>> split_parameters(const torch::nn::Module& m)
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

MPX_DECL std::vector<std::pair<int64_t, int64_t>> counted_ranges(const Split& s, int64_t local_size, int rank, int size)
{
  std::vector<std::pair<int64_t, int64_t>> out;
  for (const auto& p : detail::pieces_of(s, unsplit_size(local_size, s, size), rank, size)) {
    if (rank % p.share != 0) continue;
    if (!out.empty() && out.back().first + out.back().second == p.local_offset) out.back().second += p.size;
    else out.emplace_back(p.local_offset, p.size);
  }
  return out;
}

MPX_DECL double local_gradient_sq(const torch::nn::Module& m, const GroupPtr& g)
{
  const auto split = split_parameters(m);
  double sq = 0;
  for (const auto& p : m.named_parameters()) {
    const auto& grad = p.value().grad();
    if (!grad.defined()) continue;
    auto it = std::find_if(split.begin(), split.end(), [&](auto& sp) { return sp.first == p.key(); });
    if (it == split.end()) {
      if (g->rank == 0) sq += grad.to(at::kDouble).pow(2).sum().item<double>();
      continue;
    }
    for (auto [start, length] : counted_ranges(it->second, grad.size(it->second.dim), g->rank, g->size))
      sq += grad.narrow(it->second.dim, start, length).to(at::kDouble).pow(2).sum().item<double>();
  }
  return sq;
}

MPX_DECL void sum_shared_gradients(const torch::nn::Module& m, const GroupPtr& g)
{
  if (g->size == 1) return;
  struct Shared
  {
    at::Tensor mine;  // this rank's piece of the gradient (a view: summed in place)
    int64_t dim, offset;  // where it sits in its full part
    at::Tensor full;  // the full part, zero but for this piece
  };
  std::vector<Shared> shared;
  const auto split = split_parameters(m);
  for (const auto& p : m.named_parameters()) {
    auto grad = p.value().grad();
    auto it = std::find_if(split.begin(), split.end(), [&](auto& sp) { return sp.first == p.key(); });
    if (!grad.defined() || it == split.end() || !it->second.shared()) continue;
    const auto& s = it->second;
    for (const auto& piece : detail::pieces_of(s, unsplit_size(grad.size(s.dim), s, g->size), g->rank, g->size)) {
      if (piece.share == 1) continue;
      auto sizes = grad.sizes().vec();
      sizes[std::size_t(s.dim)] = piece.full;
      Shared sh{grad.narrow(s.dim, piece.local_offset, piece.size), s.dim, piece.piece * piece.size, torch::zeros(sizes, grad.options())};
      sh.full.narrow(s.dim, sh.offset, piece.size).copy_(sh.mine);
      shared.push_back(std::move(sh));
    }
  }
  if (shared.empty()) return;
  std::vector<at::Tensor> flat;
  for (auto& sh : shared) flat.push_back(sh.full.reshape({-1}));
  auto buffer = torch::cat(flat);
  all_reduce(*g, buffer, "sum_shared_gradients (key/value heads shared by several ranks)");
  int64_t off = 0;
  for (auto& sh : shared) {
    const auto summed = buffer.narrow(0, off, sh.full.numel()).view(sh.full.sizes());
    sh.mine.copy_(summed.narrow(sh.dim, sh.offset, sh.mine.size(sh.dim)));
    off += sh.full.numel();
  }
}

MPX_DECL void sum_replicated_gradients(const torch::nn::Module& m, const GroupPtr& g)
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
#endif  // MPX_DEFINITIONS
