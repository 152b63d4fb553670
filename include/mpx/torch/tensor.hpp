// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file torch/tensor.hpp
/// Makes `at::Tensor` (`torch::Tensor`) a model of `mpx::TensorLike`, so it can cross stage boundaries
/// alone or as a member of a Boost.Hana struct.

#include <mpx/tensor.hpp>  // mpx::tensor_traits

#include <ATen/core/Tensor.h>  // at::Tensor

namespace mpx
{

template <>
struct tensor_traits<at::Tensor>
{
  static constexpr bool is_tensor = true;
};

}  // namespace mpx
