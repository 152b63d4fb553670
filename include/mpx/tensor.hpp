// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file tensor.hpp
/// Concept `TensorLike`: what may cross a stage boundary as one tensor. The compile-time layer knows no
/// tensor library; `mpx/torch/tensor.hpp` makes `at::Tensor` (`torch::Tensor`) a model, and tests use a
/// minimal archetype.
///
/// Minimal complete definition: specialise `mpx::tensor_traits<T>` with `static constexpr bool is_tensor = true`.
/// Models: `at::Tensor` (with mpx/torch/tensor.hpp).

#include <type_traits>  // std::remove_cvref_t

namespace mpx
{

/// Traits of a tensor type. The primary template is not a tensor.
template <class T>
struct tensor_traits
{
  static constexpr bool is_tensor = false;
};

/// Concept: a tensor type (see the file comment).
template <class T>
concept TensorLike = tensor_traits<std::remove_cvref_t<T>>::is_tensor;

}  // namespace mpx
