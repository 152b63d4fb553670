// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file torch/shaped.hpp
/// `mpx::Shaped<D...>`: an `at::Tensor` whose boundary declares its shape (shape.hpp): write it where a
/// boundary would say `torch::Tensor` — a field `(mpx::Shaped<mpx::any, 729, 64>, embeds)`, or a module's
/// `using output_type = mpx::Ranked<3>;` — and the receiving stage checks each arrived tensor's rank and
/// fixed extents. It is a tensor in every other way: model code reads and returns plain tensors.

#include <mpx/shape.hpp>         // mpx::Dims, mpx::any
#include <mpx/torch/tensor.hpp>  // mpx::tensor_traits<at::Tensor>

#include <ATen/core/Tensor.h>  // at::Tensor

#include <cstdint>  // std::int64_t
#include <utility>  // std::index_sequence

namespace mpx
{

/// A tensor of declared shape D... (each a size or mpx::any).
template <std::int64_t... D>
struct Shaped : at::Tensor
{
  using dims = Dims<D...>;
  Shaped() = default;
  Shaped(at::Tensor t) : at::Tensor(std::move(t)) {}  // NOLINT: implicit, so model code returns plain tensors
};

namespace detail
{
template <class Seq>
struct ranked;
template <std::size_t... I>
struct ranked<std::index_sequence<I...>>
{
  using type = Shaped<(void(I), any)...>;
};
}  // namespace detail

/// A tensor of declared rank R, every extent free.
template <std::size_t R>
using Ranked = typename detail::ranked<std::make_index_sequence<R>>::type;

template <std::int64_t... D>
struct tensor_traits<Shaped<D...>>
{
  static constexpr bool is_tensor = true;
  using dims = Dims<D...>;
};

}  // namespace mpx
