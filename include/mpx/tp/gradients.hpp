// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file tp/gradients.hpp
/// A tensor-parallel module's gradients after its backward. `norm_terms` is the one rule for counting each
/// parameter once in the global gradient norm: every shard counts, a piece that several ranks share counts
/// on the first of them, and a replicated parameter on the group's first rank only — summed over the
/// group, each parameter counts once, not N times (the runtime's StageSet counts a stage's gradients with
/// it; `local_gradient_sq` is its sum). Two kinds of gradient are partial on each rank and must be summed
/// over the group before the optimizer steps: key/value heads shared by several ranks
/// (`sum_shared_gradients`), and under sequence parallelism every replicated parameter
/// (`sum_replicated_gradients`).

#include <mpx/linkage.hpp>   // MPX_DECL, MPX_DEFINITIONS
#include <mpx/tp/cut.hpp>    // mpx::tp::Cut, cut_parameters, counted_ranges
#include <mpx/tp/group.hpp>  // mpx::tp::GroupPtr, current, all_reduce

#include <torch/torch.h>  // torch::nn::Module

#include <cstdint>  // int64_t
#include <utility>  // std::move
#include <vector>   // std::vector

namespace mpx::tp
{

/// A gradient this rank counts in the global norm: a parameter's whole, or (a parameter whose pieces other
/// ranks also hold) rows [start, start + length) of it along `dim`.
struct NormTerm
{
  NormTerm(at::Tensor p) : param(std::move(p)) {}  // NOLINT: a whole parameter converts
  NormTerm(at::Tensor p, int64_t d, int64_t s, int64_t n) : param(std::move(p)), dim(d), start(s), length(n) {}
  at::Tensor param;
  int64_t dim = -1, start = 0, length = 0;  ///< dim -1: the whole gradient
  at::Tensor grad() const { return dim < 0 ? param.grad() : param.grad().narrow(dim, start, length); }
};

/// What rank `g->rank` counts of `m`'s parameters in the global gradient norm (see the file comment), in the
/// order of `m.named_parameters()`.
MPX_DECL std::vector<NormTerm> norm_terms(const torch::nn::Module& m, const GroupPtr& g = current());

/// Whether some parameter of `m` has a shared part (its gradient needs `sum_shared_gradients`).
MPX_DECL bool has_shared_cut(const torch::nn::Module& m);

/// This rank's share of the squared gradient norm of `m`: the sum of the squares of its `norm_terms`
/// (in double).
MPX_DECL double local_gradient_sq(const torch::nn::Module& m, const GroupPtr& g = current());

/// Under grouped-query attention with fewer key/value heads than ranks, the ranks sharing a head each hold
/// the gradient of their own query heads' use of it: sums every shared piece's gradient over the ranks
/// that hold it (one all-reduce for the whole module, each piece placed at its place in the whole part).
MPX_DECL void sum_shared_gradients(const torch::nn::Module& m, const GroupPtr& g = current());

/// Under sequence parallelism every replicated parameter (LayerNorm, a row-parallel bias, positions) sees
/// 1/N of the sequence: sums their gradients over the group, so that each holds the whole gradient.
MPX_DECL void sum_replicated_gradients(const torch::nn::Module& m, const GroupPtr& g = current());

}  // namespace mpx::tp

#if MPX_DEFINITIONS
// ---- definitions (compiled once under MPX_SEPARATE_COMPILATION: linkage.hpp) ----

namespace mpx::tp
{
MPX_DECL std::vector<NormTerm> norm_terms(const torch::nn::Module& m, const GroupPtr& g)
{
  const auto cuts = cut_parameters(m);
  std::vector<NormTerm> out;
  for (const auto& p : m.named_parameters()) {
    const Cut* c = cut_of(cuts, p.key());
    if (c == nullptr) {
      if (g->rank == 0) out.emplace_back(p.value());  // replicated: counted once
    } else if (!c->shared()) {
      out.emplace_back(p.value());
    } else {  // a shared piece counts on the first rank holding it
      for (auto [start, length] : counted_ranges(*c, p.value().size(c->dim), g->rank, g->size)) out.emplace_back(p.value(), c->dim, start, length);
    }
  }
  return out;
}

MPX_DECL bool has_shared_cut(const torch::nn::Module& m)
{
  for (const auto& [name, c] : cut_parameters(m))
    if (c.shared()) return true;
  return false;
}

MPX_DECL double local_gradient_sq(const torch::nn::Module& m, const GroupPtr& g)
{
  double sq = 0;
  for (const auto& t : norm_terms(m, g))
    if (t.param.grad().defined()) sq += t.grad().to(at::kDouble).pow(2).sum().item<double>();
  return sq;
}

MPX_DECL void sum_shared_gradients(const torch::nn::Module& m, const GroupPtr& g)
{
  if (g->size == 1) return;
  struct Shared
  {
    at::Tensor mine;      // this rank's piece of the gradient (a view: summed in place)
    int64_t dim, offset;  // where it sits in its whole part
    at::Tensor full;      // the whole part, zero but for this piece
  };
  std::vector<Shared> shared;
  const auto cuts = cut_parameters(m);
  for (const auto& p : m.named_parameters()) {
    auto grad = p.value().grad();
    const Cut* c = cut_of(cuts, p.key());
    if (!grad.defined() || c == nullptr || !c->shared()) continue;
    for (const auto& piece : detail::pieces_of(*c, whole_size(grad.size(c->dim), *c, g->size), g->rank, g->size)) {
      if (piece.share == 1) continue;
      auto sizes = grad.sizes().vec();
      sizes[std::size_t(c->dim)] = piece.full;
      Shared sh{grad.narrow(c->dim, piece.local_offset, piece.size), c->dim, piece.piece * piece.size, torch::zeros(sizes, grad.options())};
      sh.full.narrow(c->dim, sh.offset, piece.size).copy_(sh.mine);
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
  const auto cuts = cut_parameters(m);
  for (const auto& p : m.named_parameters()) {
    if (!p.value().grad().defined() || cut_of(cuts, p.key()) != nullptr) continue;
    auto grad = p.value().mutable_grad();
    all_reduce(*g, grad, "sum_replicated_gradients (a sequence-parallel replicated parameter's gradient)");
  }
}

}  // namespace mpx::tp
#endif  // MPX_DEFINITIONS
