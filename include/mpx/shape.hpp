// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file shape.hpp
/// `Dims<D...>`: a boundary tensor's declared shape — its rank (the number of extents) and each extent,
/// a size or `mpx::any`. A tensor type declares one through `tensor_traits<T>::dims` (mpx/torch/shaped.hpp:
/// `mpx::Shaped<mpx::any, 729, 64>`, `mpx::Ranked<3>`); the receiving stage checks every arrived tensor
/// against it, and a message that breaks it is an error naming the stage, the field and both shapes.
/// Concept `DeclaresShape<T>`: tensor type T declares its dims. The compile-time layer, free of LibTorch.

#include <mpx/tensor.hpp>  // mpx::tensor_traits

#include <array>    // std::array
#include <cstddef>  // std::size_t
#include <cstdint>  // std::int64_t

namespace mpx
{

/// An extent that may be anything (a batch, a sequence length).
inline constexpr std::int64_t any = -1;

/// The most dimensions a boundary tensor may have (the wire header's capacity).
inline constexpr std::size_t max_boundary_rank = 8;

/// A declared shape (see the file comment).
template <std::int64_t... D>
struct Dims
{
  static_assert(sizeof...(D) <= max_boundary_rank, "mpx::Dims: a boundary tensor has at most 8 dimensions; declare fewer extents");
  static_assert(((D == any || D >= 0) && ...),
                "mpx::Dims: every extent is a size (>= 0) or mpx::any; write mpx::any for an extent that varies");
  static constexpr std::size_t rank = sizeof...(D);
  static constexpr std::array<std::int64_t, sizeof...(D)> extents{D...};
};

/// Concept: tensor type T declares its shape (see the file comment).
template <class T>
concept DeclaresShape = TensorLike<T> && requires { tensor_traits<std::remove_cvref_t<T>>::dims::rank; };

}  // namespace mpx
