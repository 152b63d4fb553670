// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file tp/adapter.hpp
/// A low-rank adapter (LoRA, arXiv 2106.09685) on a linear of layers.hpp: the linear's output gains
/// `scale · B·A·dropout(x)`, with A (r × in) and B (out × r) the adapter's parameters `lora_a`, `lora_b`
/// and scale = alpha / r. Under tensor parallelism each is cut to match its linear's weight, so that
/// neither the input nor the output of the rank-r product is ever whole on a rank where the weight's is not:
/// - column-parallel (output features cut): A whole on every rank, B's rows cut as the weight's (per fused
///   part). `h = A·x` is the same on every rank; `copy_to(h)` (all-reduce of its gradient) makes A's and x's
///   gradients whole on each, so A is an ordinary replicated parameter. With sequence parallelism x is this
///   rank's sequence shard: `gather_sequence(h)` (reduce-scatter of its gradient), A's gradient is then
///   partial and summed with the other replicated ones (gradients.hpp).
/// - row-parallel (input features cut): A's columns cut as the weight's, B whole. `h = reduce_from(A·x)`
///   (an all-reduce of r features per token) is whole on every rank; `B·h` adds to the summed output. With
///   sequence parallelism `reduce_scatter_sequence(A·x)` and B's gradient is partial, summed as above.
/// In a group of one both are the plain `x·Aᵀ·Bᵀ·scale`. `fold` merges an adapter into its weight
/// (W += scale·B·A, each rank its own piece: both cuts keep the product local) and zeroes B.
/// `lora/adapters.hpp` adds adapters to a model's linears (`mpx::lora::apply`).

#include <mpx/linkage.hpp>    // MPX_DECL, MPX_DEFINITIONS
#include <mpx/tp/dropout.hpp>  // mpx::tp::dropout, Region
#include <mpx/tp/group.hpp>    // mpx::tp::GroupPtr
#include <mpx/tp/ops.hpp>      // mpx::tp::copy_to, reduce_from, gather_sequence, reduce_scatter_sequence

#include <torch/torch.h>  // at::Tensor

namespace mpx::tp
{

/// One linear's adapter as this rank holds it (see the file comment); undefined tensors: no adapter.
struct Adapter
{
  at::Tensor a, b;     ///< lora_a (r × in, or its columns under a row cut), lora_b (out × r, or its rows under a column cut)
  double scale = 0;    ///< alpha / r
  double dropout = 0;  ///< on the adapter's input only (the base linear sees x)
  bool defined() const { return a.defined(); }
};

/// The adapter's term of a column-parallel linear's output (this rank's output features), from the linear's
/// input `x` as it arrives: replicated, or with `sequence_parallel` this rank's sequence shard (dim 1).
MPX_DECL at::Tensor column_delta(const Adapter& ad, const at::Tensor& x, bool sequence_parallel, bool training, const GroupPtr& g);

/// The adapter's term of a row-parallel linear's output (whole features; with `sequence_parallel` this
/// rank's sequence shard), from this rank's input features `x`.
MPX_DECL at::Tensor row_delta(const Adapter& ad, const at::Tensor& x, bool sequence_parallel, bool training, const GroupPtr& g);

/// Merges `ad` into `weight` (this rank's piece): weight += scale·B·A, then B = 0, so that the output is
/// unchanged and the adapter adds nothing until it trains again.
MPX_DECL void fold(at::Tensor& weight, Adapter& ad);

}  // namespace mpx::tp

#if MPX_DEFINITIONS
// ---- definitions (compiled once under MPX_SEPARATE_COMPILATION: linkage.hpp) ----
namespace mpx::tp
{

MPX_DECL at::Tensor column_delta(const Adapter& ad, const at::Tensor& x, bool sequence_parallel, bool training, const GroupPtr& g)
{
  const auto in = dropout(x, ad.dropout, training, sequence_parallel ? Region::sharded : Region::replicated, g);
  const auto h = torch::nn::functional::linear(in, ad.a);
  const auto whole = sequence_parallel ? gather_sequence(h, 1, g) : copy_to(h, g);
  return torch::nn::functional::linear(whole, ad.b) * ad.scale;
}

MPX_DECL at::Tensor row_delta(const Adapter& ad, const at::Tensor& x, bool sequence_parallel, bool training, const GroupPtr& g)
{
  const auto in = dropout(x, ad.dropout, training, Region::sharded, g);
  const auto partial = torch::nn::functional::linear(in, ad.a);
  const auto h = sequence_parallel ? reduce_scatter_sequence(partial, 1, g) : reduce_from(partial, g);
  return torch::nn::functional::linear(h, ad.b) * ad.scale;
}

MPX_DECL void fold(at::Tensor& weight, Adapter& ad)
{
  if (!ad.defined()) return;
  torch::NoGradGuard ng;
  weight.add_(torch::mm(ad.b.to(at::kFloat), ad.a.to(at::kFloat)).to(weight.scalar_type()), ad.scale);
  ad.b.zero_();
}

}  // namespace mpx::tp
#endif  // MPX_DEFINITIONS
