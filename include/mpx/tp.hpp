// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file tp.hpp
/// Tensor parallelism: the group (tp/group.hpp), the operators between split regions (tp/ops.hpp), the
/// building blocks a model is written with (tp/layers.hpp) and dropout that knows its region (tp/dropout.hpp). docs/07_tensor_parallel.md.

#include <mpx/tp/dropout.hpp> // mpx::tp::dropout, Region, seed_split_regions
#include <mpx/tp/group.hpp>   // mpx::tp::Group, current, Scope
#include <mpx/tp/layers.hpp>  // mpx::tp::ColumnLinear, RowLinear, VocabEmbedding, cross_entropy
#include <mpx/tp/ops.hpp>     // mpx::tp::copy_to, reduce_from, gather_from, scatter_to, ...
