// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file tp.hpp
/// Tensor parallelism (docs/07_tensor_parallel.md): the group (tp/group.hpp), the operators between
/// sharded and replicated regions (tp/ops.hpp), how parameters are cut and their shards joined
/// (tp/cut.hpp), the building blocks a model is written with (tp/layers.hpp), their gradients after a
/// backward (tp/gradients.hpp) and dropout that knows its region (tp/dropout.hpp).

#include <mpx/tp/adapter.hpp>    // mpx::tp::Adapter, column_delta, row_delta, fold
#include <mpx/tp/cut.hpp>        // mpx::tp::Cut, CutModule, shard, join, unshard, cut_parameters
#include <mpx/tp/dropout.hpp>    // mpx::tp::dropout, Region, seed_sharded_regions
#include <mpx/tp/gradients.hpp>  // mpx::tp::NormTerm, norm_terms, sum_shared_gradients, sum_replicated_gradients
#include <mpx/tp/group.hpp>      // mpx::tp::Group, current, Scope
#include <mpx/tp/layers.hpp>     // mpx::tp::ColumnLinear, RowLinear, VocabEmbedding, cross_entropy
#include <mpx/tp/ops.hpp>        // mpx::tp::copy_to, reduce_from, gather_from, scatter_to, ...
