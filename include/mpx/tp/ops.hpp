// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file tp/ops.hpp
/// The autograd operators between tensor-parallel regions (Megatron-LM's conjugate pairs), each a
/// differentiable function of one tensor over a `tp::Group`:
/// - `copy_to(x)`: identity forward, all-reduce backward — where a replicated input enters a sharded region
///   (each rank's region uses a part; the input's gradient is the sum of the parts').
/// - `reduce_from(x)`: all-reduce forward, identity backward — where partial sums leave a sharded region
///   (a row-parallel output): the result and everything after it are replicated.
/// - `gather_from(x, dim)`: all-gather along `dim` forward, this rank's slice backward — a sharded output made
///   whole (e.g. logits to print).
/// - `scatter_to(x, dim)`: this rank's slice forward, all-gather backward — a replicated tensor sharded.
/// - Sequence parallelism (arXiv 2205.05198): `gather_sequence(x, dim)` (all-gather forward, reduce-scatter
///   backward) before a sharded region, `reduce_scatter_sequence(x, dim)` (reduce-scatter forward,
///   all-gather backward) in place of `reduce_from` after it, so that the regions between (LayerNorm,
///   residual, dropout) hold 1/N of the sequence; `gathered_linear(x, w, b, dim)` is a gather and a linear
///   in one, which keeps only the shard for its backward and gathers it again there.
/// With a group of one every operator is the identity. `slice_of(x, dim)` is this rank's slice, as a plain
/// (autograd-ordinary) narrow: under sequence parallelism, of a replicated parameter's output whose
/// gradient is then summed over the group with the others (gradients.hpp, `sum_replicated_gradients`).

#include <mpx/tp/group.hpp>  // mpx::tp::Group, all_reduce, all_gather
#include <mpx/linkage.hpp>  // MPX_DECL, MPX_DEFINITIONS

#include <torch/torch.h>  // torch::autograd::Function

namespace mpx::tp
{

namespace detail
{
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

inline GroupPtr group_of(AutogradContext* ctx) { return c10::static_intrusive_pointer_cast<Group>(ctx->saved_data["group"].toCapsule()); }

/// The sum over the group of a fresh contiguous copy of `t`.
MPX_DECL at::Tensor summed(const Group& g, const at::Tensor& t, const char* what);
/// The concatenation along `dim` of every member's `t`.
MPX_DECL at::Tensor gathered(const Group& g, const at::Tensor& t, int64_t dim, const char* what);
/// This rank's slice along `dim`.
MPX_DECL at::Tensor sliced(const Group& g, const at::Tensor& t, int64_t dim);
/// This rank's slice along `dim` of the sum over the group.
MPX_DECL at::Tensor reduce_scattered(const Group& g, const at::Tensor& t, int64_t dim, const char* what);

struct CopyTo : torch::autograd::Function<CopyTo>
{
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, GroupPtr g);
  static variable_list backward(AutogradContext* ctx, variable_list grads);
};

struct ReduceFrom : torch::autograd::Function<ReduceFrom>
{
  static at::Tensor forward(AutogradContext*, const at::Tensor& x, GroupPtr g);
  static variable_list backward(AutogradContext*, variable_list grads) { return {grads[0], at::Tensor()}; }
};

/// What happens to a tensor along one dimension: gathered from every member, this rank's slice taken, or
/// summed and sliced.
enum class Along
{
  gather,
  slice,
  reduce_scatter
};
MPX_DECL at::Tensor along(Along op, const Group& g, const at::Tensor& t, int64_t dim);

/// A conjugate pair along dimension `dim`: `Fwd` in the forward, `Bwd` on the gradient.
template <Along Fwd, Along Bwd>
struct AlongDim : torch::autograd::Function<AlongDim<Fwd, Bwd>>
{
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, GroupPtr g, int64_t dim)
  {
    ctx->saved_data["dim"] = dim;
    auto out = along(Fwd, *g, x, dim);
    ctx->saved_data["group"] = c10::IValue::make_capsule(std::move(g));
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads)
  {
    return {along(Bwd, *group_of(ctx), grads[0], ctx->saved_data["dim"].toInt()), at::Tensor(), at::Tensor()};
  }
};
/// `linear(gather_sequence(x), w, b)` that keeps only x (this rank's sequence shard) for the backward and
/// gathers it again there (Megatron-LM's sequence-parallel column linear): the gathered input, N times
/// the shard, is never held between the forward and the backward.
struct GatheredLinear : torch::autograd::Function<GatheredLinear>
{
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, GroupPtr g, int64_t dim);
  static variable_list backward(AutogradContext* ctx, variable_list grads);
};

using GatherFrom = AlongDim<Along::gather, Along::slice>;
using ScatterTo = AlongDim<Along::slice, Along::gather>;
using GatherSequence = AlongDim<Along::gather, Along::reduce_scatter>;
using ReduceScatterSequence = AlongDim<Along::reduce_scatter, Along::gather>;
}  // namespace detail

MPX_DECL at::Tensor slice_of(const at::Tensor& x, int64_t dim, const GroupPtr& g = current());
MPX_DECL at::Tensor copy_to(const at::Tensor& x, const GroupPtr& g = current());
MPX_DECL at::Tensor reduce_from(const at::Tensor& x, const GroupPtr& g = current());
MPX_DECL at::Tensor gather_from(const at::Tensor& x, int64_t dim = -1, const GroupPtr& g = current());
MPX_DECL at::Tensor scatter_to(const at::Tensor& x, int64_t dim = -1, const GroupPtr& g = current());
MPX_DECL at::Tensor gather_sequence(const at::Tensor& x, int64_t dim = 1, const GroupPtr& g = current());
MPX_DECL at::Tensor reduce_scatter_sequence(const at::Tensor& x, int64_t dim = 1, const GroupPtr& g = current());
/// `linear(gather_sequence(x, dim), w, b)`, holding only the shard x for the backward (see GatheredLinear).
MPX_DECL at::Tensor gathered_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, int64_t dim = 1, const GroupPtr& g = current());

}  // namespace mpx::tp

#if MPX_DEFINITIONS
// ---- definitions (compiled once under MPX_SEPARATE_COMPILATION: linkage.hpp) ----

namespace mpx::tp::detail
{

MPX_DECL at::Tensor summed(const Group& g, const at::Tensor& t, const char* what)
{
  auto out = t.contiguous().clone();
  all_reduce(g, out, what);
  return out;
}

MPX_DECL at::Tensor gathered(const Group& g, const at::Tensor& t, int64_t dim, const char* what)
{
  return torch::cat(all_gather(g, t, what), dim);
}

MPX_DECL at::Tensor sliced(const Group& g, const at::Tensor& t, int64_t dim)
{
  const auto n = shard_size(t.size(dim), g.size, "the sharded dimension of a tensor-parallel operand");
  return t.narrow(dim, g.rank * n, n).contiguous();
}

MPX_DECL at::Tensor reduce_scattered(const Group& g, const at::Tensor& t, int64_t dim, const char* what)
{
  return sliced(g, summed(g, t, what), dim);  // Gloo has no reduce-scatter in 1.13: an all-reduce, then the slice
}

MPX_DECL at::Tensor CopyTo::forward(AutogradContext* ctx, const at::Tensor& x, GroupPtr g)
{
  ctx->saved_data["group"] = c10::IValue::make_capsule(std::move(g));
  return x.view_as(x);
}

MPX_DECL variable_list CopyTo::backward(AutogradContext* ctx, variable_list grads)
{
  return {summed(*group_of(ctx), grads[0], "backward of copy_to (the input gradient's all-reduce)"), at::Tensor()};
}

MPX_DECL at::Tensor ReduceFrom::forward(AutogradContext*, const at::Tensor& x, GroupPtr g)
{
  return summed(*g, x, "reduce_from (a row-parallel output's all-reduce)");
}

MPX_DECL at::Tensor along(Along op, const Group& g, const at::Tensor& t, int64_t dim)
{
  switch (op) {
    case Along::gather: return gathered(g, t, dim, "all-gather along a dimension");
    case Along::slice: return sliced(g, t, dim);
    default: return reduce_scattered(g, t, dim, "reduce-scatter along a dimension (an all-reduce, then the slice)");
  }
}

MPX_DECL at::Tensor GatheredLinear::forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, GroupPtr g, int64_t dim)
{
  ctx->save_for_backward({x, w});
  ctx->saved_data["dim"] = dim;
  ctx->saved_data["bias"] = b.defined();
  auto y = torch::nn::functional::linear(gathered(*g, x.contiguous(), dim, "the sequence-parallel column linear's all-gather"), w, b);
  ctx->saved_data["group"] = c10::IValue::make_capsule(std::move(g));
  return y;
}

MPX_DECL variable_list GatheredLinear::backward(AutogradContext* ctx, variable_list grads)
{
  const auto saved = ctx->get_saved_variables();
  const auto &x = saved[0], &w = saved[1];
  const auto g = group_of(ctx);
  const auto dim = ctx->saved_data["dim"].toInt();
  const auto gy = grads[0];  // (..., out/N), in the forward's compute dtype (autocast: bf16)
  const auto full = gathered(*g, x.contiguous(), dim, "backward of the sequence-parallel column linear (its input gathered again)");
  const auto gy2 = gy.reshape({-1, gy.size(-1)});
  auto gw = gy2.t().matmul(full.reshape({-1, full.size(-1)}).to(gy.scalar_type())).to(w.scalar_type());
  auto gb = ctx->saved_data["bias"].toBool() ? gy2.sum(0).to(w.scalar_type()) : at::Tensor();
  auto gx = reduce_scattered(*g, gy.matmul(w.to(gy.scalar_type())), dim, "backward of the sequence-parallel column linear (reduce-scatter)");
  return {gx.to(x.scalar_type()), gw, gb, at::Tensor(), at::Tensor()};
}

}  // namespace mpx::tp::detail

namespace mpx::tp
{

MPX_DECL at::Tensor slice_of(const at::Tensor& x, int64_t dim, const GroupPtr& g)
{
  if (g->size == 1) return x;
  const auto n = shard_size(x.size(dim), g->size, "the sliced dimension");
  return x.narrow(dim, g->rank * n, n);
}

MPX_DECL at::Tensor copy_to(const at::Tensor& x, const GroupPtr& g)
{
  return g->size == 1 ? x : detail::CopyTo::apply(x, g);
}

MPX_DECL at::Tensor reduce_from(const at::Tensor& x, const GroupPtr& g)
{
  return g->size == 1 ? x : detail::ReduceFrom::apply(x, g);
}

MPX_DECL at::Tensor gather_from(const at::Tensor& x, int64_t dim, const GroupPtr& g)
{
  return g->size == 1 ? x : detail::GatherFrom::apply(x, g, dim < 0 ? dim + x.dim() : dim);
}

MPX_DECL at::Tensor scatter_to(const at::Tensor& x, int64_t dim, const GroupPtr& g)
{
  return g->size == 1 ? x : detail::ScatterTo::apply(x, g, dim < 0 ? dim + x.dim() : dim);
}

MPX_DECL at::Tensor gather_sequence(const at::Tensor& x, int64_t dim, const GroupPtr& g)
{
  return g->size == 1 ? x : detail::GatherSequence::apply(x, g, dim < 0 ? dim + x.dim() : dim);
}

MPX_DECL at::Tensor reduce_scatter_sequence(const at::Tensor& x, int64_t dim, const GroupPtr& g)
{
  return g->size == 1 ? x : detail::ReduceScatterSequence::apply(x, g, dim < 0 ? dim + x.dim() : dim);
}

MPX_DECL at::Tensor gathered_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, int64_t dim, const GroupPtr& g)
{
  if (g->size == 1) return torch::nn::functional::linear(x, w, b);
  return detail::GatheredLinear::apply(x, w, b, g, dim < 0 ? dim + x.dim() : dim);
}

}  // namespace mpx::tp
#endif  // MPX_DEFINITIONS
