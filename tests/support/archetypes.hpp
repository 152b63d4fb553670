// SPDX-License-Identifier: Apache-2.0
#pragma once
/// Minimal archetypes: types that model one mpx concept and nothing more, so the compile-time layer is
/// tested without LibTorch.

#include <mpx/core.hpp>  // mpx::tensor_traits, mpx::Stage, ...

#include <boost/hana/define_struct.hpp>  // BOOST_HANA_DEFINE_STRUCT

namespace archetypes
{
/// Models mpx::TensorLike.
struct Tensor
{
};
/// Not a tensor.
struct NotATensor
{
};
}  // namespace archetypes

template <>
struct mpx::tensor_traits<archetypes::Tensor>
{
  static constexpr bool is_tensor = true;
};

namespace archetypes
{
/// A boundary of two tensors.
struct Pair
{
  BOOST_HANA_DEFINE_STRUCT(Pair, (Tensor, embeds), (Tensor, mask));
};
/// A batch.
struct Batch
{
  BOOST_HANA_DEFINE_STRUCT(Batch, (Tensor, images), (Tensor, tokens), (Tensor, labels));
};

/// Module whose types come from its forward: Tensor -> Pair.
struct Vision
{
  Pair forward(Tensor x);
};
/// Module that declares its types, with layers and heads: Pair -> Tensor, hidden Tensor.
struct Text
{
  using input_type = Pair;
  using output_type = Tensor;
  using hidden_type = Tensor;
  static constexpr int num_layers = 8;
  static constexpr int num_heads = 6;
  static constexpr bool tp_blocks = true;  // cuts itself under TensorParallel<N>
  static constexpr std::string_view name = "Text";
};
/// Tensor -> Tensor, for chains of any length.
struct Block
{
  Tensor forward(const Tensor& x) const;
};
/// A ModuleHolder look-alike (torch's TORCH_MODULE): mpx looks through ContainedType.
struct BlockHolder
{
  using ContainedType = Block;
};
/// Not a module: no forward, no declared types.
struct NotAModule
{
};
}  // namespace archetypes
