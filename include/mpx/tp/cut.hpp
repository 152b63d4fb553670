// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file tp/cut.hpp
/// How a parameter is cut over a tensor-parallel group, and the arithmetic of its shards. A `Cut` says along
/// which dimension and in which fused parts (q, k, v) a tensor is divided N ways; a rank's *shard* is its
/// piece of each part, side by side. `shard` cuts a whole tensor, `join` puts the shards back together,
/// `unshard` does it over the group (a collective). A `CutModule` lists the cuts of the parameters it holds
/// (the blocks of layers.hpp are such modules), and `cut_parameters` collects them over a module tree: what
/// the runtime counts in gradient norms (gradients.hpp) and what a checkpoint records, so that weights move
/// between degrees by name.

#include <mpx/errors.hpp>     // mpx::config_error
#include <mpx/linkage.hpp>    // MPX_DECL, MPX_DEFINITIONS
#include <mpx/tp/group.hpp>   // mpx::tp::Group, GroupPtr, shard_size

#include <torch/torch.h>  // torch::nn::Module, torch::cat

#include <algorithm>  // std::any_of
#include <cstdint>    // int64_t
#include <string>     // std::string
#include <utility>    // std::pair
#include <vector>     // std::vector

namespace mpx::tp
{

/// How one parameter is cut: along `dim`, in `parts` (the sizes along dim of the fused parts, each cut N
/// ways; one part for a plain cut). A part may be *shared*: with `shares[i]` = s > 1, part i is cut into
/// N / s pieces and each piece is held by s adjacent ranks (rank r holds piece r / s) — the key/value heads
/// of grouped-query attention when there are fewer of them than ranks.
struct Cut
{
  std::string name;  ///< the parameter's name in its module ("weight")
  int64_t dim = 0;
  std::vector<int64_t> parts;        ///< whole sizes; empty: one part, the whole dimension
  std::vector<int64_t> shares = {};  ///< per part, the ranks holding each of its pieces; empty: 1 each

  int64_t share(std::size_t part) const { return part < shares.size() ? shares[part] : 1; }
  bool shared() const { return std::any_of(shares.begin(), shares.end(), [](int64_t s) { return s > 1; }); }
};

namespace detail
{
/// One part of a cut parameter as one rank holds it: the whole part's size, how many ranks hold each
/// piece, this rank's piece (offset within the whole part, size) and where it sits in the local tensor.
struct PartPiece
{
  int64_t full = 0, share = 1, piece = 0, size = 0, local_offset = 0;
};
/// The pieces rank `rank` of `size` holds under `c`, part by part; `full` is the whole dimension's size
/// when `c` has one part (empty `parts`).
MPX_DECL std::vector<PartPiece> pieces_of(const Cut& c, int64_t full, int rank, int size);
}  // namespace detail

/// A module that holds cut parameters (see the file comment).
struct CutModule
{
  virtual ~CutModule() = default;
  virtual std::vector<Cut> cuts() const = 0;
  virtual const GroupPtr& group() const = 0;
  /// Whether it runs sequence-parallel (its replicated neighbours' gradients are then partial).
  virtual bool sequence_parallel() const { return false; }
};

/// Shard `rank` of `size` of whole tensor `full` under `c` (each part's piece rank / share, of size / share).
MPX_DECL at::Tensor shard(const at::Tensor& full, const Cut& c, int rank, int size);
/// This rank's shard of whole tensor `full` under `c`.
inline at::Tensor shard(const at::Tensor& full, const Cut& c, const Group& g) { return shard(full, c, g.rank, g.size); }

/// The size along `c.dim` of the whole tensor of which a member of a group of `size` holds `local_size`.
MPX_DECL int64_t whole_size(int64_t local_size, const Cut& c, int size);

/// The sizes of the whole tensor of which `local` is one member's shard under `c`.
MPX_DECL std::vector<int64_t> whole_sizes(const at::Tensor& local, const Cut& c, const Group& g);

/// The whole tensor whose shards under `c` are `shards` (shard r of shards.size(), in order): `shard`'s
/// inverse (a shared piece is taken from the first rank that holds it).
MPX_DECL at::Tensor join(const std::vector<at::Tensor>& shards, const Cut& c);

/// The whole tensor of which every member holds `local` under `c` (a collective over the group).
MPX_DECL at::Tensor unshard(const at::Tensor& local, const Cut& c, const Group& g);

/// Every cut parameter of `m` and its submodules: full name → its cut.
MPX_DECL std::vector<std::pair<std::string, Cut>> cut_parameters(const torch::nn::Module& m);

/// The cut of parameter `name` among `cuts` (`cut_parameters`), or null: a replicated parameter.
MPX_DECL const Cut* cut_of(const std::vector<std::pair<std::string, Cut>>& cuts, const std::string& name);

/// The ranges [start, start + length) along `c.dim` of a local shard (of `local_size` along it) that rank
/// `rank` of `size` counts in norms: all of it, except the pieces of shared parts that a lower rank also
/// holds (each piece counts once, on the first of the ranks that hold it). Adjacent ranges are merged.
MPX_DECL std::vector<std::pair<int64_t, int64_t>> counted_ranges(const Cut& c, int64_t local_size, int rank, int size);

}  // namespace mpx::tp

#if MPX_DEFINITIONS
// ---- definitions (compiled once under MPX_SEPARATE_COMPILATION: linkage.hpp) ----
#include <numeric>  // std::accumulate

namespace mpx::tp::detail
{
MPX_DECL std::vector<PartPiece> pieces_of(const Cut& c, int64_t full, int rank, int size)
{
  const std::vector<int64_t> parts = c.parts.empty() ? std::vector<int64_t>{full} : c.parts;
  std::vector<PartPiece> out;
  int64_t local = 0;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    PartPiece p;
    p.full = parts[i], p.share = c.share(i);
    if (p.share < 1 || size % p.share != 0)
      throw config_error("mpx::tp: part " + std::to_string(i) + " of '" + c.name + "' is shared by " + std::to_string(p.share) +
                         " ranks, which does not divide the group of " + std::to_string(size));
    p.size = shard_size(p.full, int(size / p.share), "a cut part of '" + c.name + "'");
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
MPX_DECL at::Tensor shard(const at::Tensor& full, const Cut& c, int rank, int size)
{
  std::vector<at::Tensor> mine;
  int64_t off = 0;
  for (const auto& p : detail::pieces_of(c, full.size(c.dim), rank, size)) {
    mine.push_back(full.narrow(c.dim, off + p.piece * p.size, p.size));
    off += p.full;
  }
  return torch::cat(mine, c.dim).clone();
}

MPX_DECL int64_t whole_size(int64_t local_size, const Cut& c, int size)
{
  if (!c.parts.empty()) return std::accumulate(c.parts.begin(), c.parts.end(), int64_t(0));
  return local_size * (size / c.share(0));
}

MPX_DECL std::vector<int64_t> whole_sizes(const at::Tensor& local, const Cut& c, const Group& g)
{
  auto sizes = local.sizes().vec();
  sizes[std::size_t(c.dim)] = whole_size(local.size(c.dim), c, g.size);
  return sizes;
}

MPX_DECL at::Tensor join(const std::vector<at::Tensor>& shards, const Cut& c)
{
  const int n = int(shards.size());
  const auto full = whole_size(shards.at(0).size(c.dim), c, n);
  std::vector<at::Tensor> out;
  for (const auto& p : detail::pieces_of(c, full, 0, n))
    for (int64_t piece = 0; piece < n / p.share; ++piece) out.push_back(shards[std::size_t(piece * p.share)].narrow(c.dim, p.local_offset, p.size));
  return torch::cat(out, c.dim);
}

MPX_DECL at::Tensor unshard(const at::Tensor& local, const Cut& c, const Group& g)
{
  return join(all_gather(g, local.detach(), "unshard (all-gather of a cut parameter)"), c);
}

MPX_DECL std::vector<std::pair<std::string, Cut>> cut_parameters(const torch::nn::Module& m)
{
  std::vector<std::pair<std::string, Cut>> out;
  auto add = [&](const torch::nn::Module* mod, const std::string& prefix) {
    if (const auto* s = dynamic_cast<const CutModule*>(mod); s && s->group()->size > 1)
      for (auto c : s->cuts()) out.emplace_back(prefix + c.name, c);
  };
  add(&m, "");  // the module itself (which need not be held by a shared_ptr)
  for (const auto& item : m.named_modules("", /*include_self=*/false)) add(item.value().get(), item.key() + ".");
  return out;
}

MPX_DECL const Cut* cut_of(const std::vector<std::pair<std::string, Cut>>& cuts, const std::string& name)
{
  for (const auto& [n, c] : cuts)
    if (n == name) return &c;
  return nullptr;
}

MPX_DECL std::vector<std::pair<int64_t, int64_t>> counted_ranges(const Cut& c, int64_t local_size, int rank, int size)
{
  std::vector<std::pair<int64_t, int64_t>> out;
  for (const auto& p : detail::pieces_of(c, whole_size(local_size, c, size), rank, size)) {
    if (rank % p.share != 0) continue;
    if (!out.empty() && out.back().first + out.back().second == p.local_offset) out.back().second += p.size;
    else out.emplace_back(p.local_offset, p.size);
  }
  return out;
}

}  // namespace mpx::tp
#endif  // MPX_DEFINITIONS
