// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file policy.hpp
/// Stage policies: what `Stage<Module, Device, Policies...>` may say beyond module and device.
///
/// | policy                    | meaning                                                             |
/// |---------------------------|---------------------------------------------------------------------|
/// | `Frozen`                  | no gradients for the stage's parameters, no optimizer               |
/// | `Checkpointed`            | keep only the stage's inputs; recompute the forward in backward     |
/// | `CheckpointBlocks`        | the same per block (the blocks the module runs via checkpoint_block)|
/// | `Optimizer<O>`            | the stage's optimizer: `SGD`, `AdamW` or `AdamW8bit`                |
/// | `Precision<P>`            | autocast of the stage's forward: `FP32`, `BF16`, `FP16` (CUDA only) |
/// | `WireCompression<P>`      | activations and gradients cross the wire as `BF16` or `FP16`        |
/// | `TensorParallel<N>`       | split the stage over N devices by heads (N must divide the heads)   |
/// | `Layers<b, e>`            | the stage runs layers [b, e) of its module (layers.hpp)             |
/// | `Reads<"f"...>`           | the stage reads these fields of the batch (batch.hpp)               |
/// | `Sharded<L>`              | ZeRO level L over the data-parallel replicas: 1 optimizer state, 2 gradients too, 3 parameters too (runtime/zero_shard.hpp) |
///
/// Concept `Policy` — minimal complete definition: `static constexpr bool is_policy = true` in
/// `mpx::policy_traits<T>`. Models: every type in the table.

#include <mpx/config.hpp>  // mpx::fixed_string

#include <string_view>  // std::string_view
#include <type_traits>  // std::is_same_v, std::conditional_t

namespace mpx
{

// ---- Optimizers -----------------------------------------------------------------------------------
/// Plain SGD with momentum.
struct SGD { static constexpr std::string_view name = "SGD"; };
/// AdamW with 32-bit state.
struct AdamW { static constexpr std::string_view name = "AdamW"; };
/// AdamW with block-wise 8-bit moments (bitsandbytes' AdamW8bit).
struct AdamW8bit { static constexpr std::string_view name = "AdamW8bit"; };

template <class T>
inline constexpr bool is_optimizer_v = false;
template <> inline constexpr bool is_optimizer_v<SGD> = true;
template <> inline constexpr bool is_optimizer_v<AdamW> = true;
template <> inline constexpr bool is_optimizer_v<AdamW8bit> = true;

// ---- Precisions -----------------------------------------------------------------------------------
struct FP32 { static constexpr std::string_view name = "fp32"; };
struct BF16 { static constexpr std::string_view name = "bf16"; };
/// fp16 autocast exists on CUDA only (LibTorch's CPU autocast is bf16-only).
struct FP16 { static constexpr std::string_view name = "fp16"; };

template <class T>
inline constexpr bool is_precision_v = false;
template <> inline constexpr bool is_precision_v<FP32> = true;
template <> inline constexpr bool is_precision_v<BF16> = true;
template <> inline constexpr bool is_precision_v<FP16> = true;

// ---- Policies -------------------------------------------------------------------------------------
/// The stage's parameters get no gradients and no optimizer.
struct Frozen {};

/// The stage keeps only its inputs in forward and recomputes in backward (RNG state restored).
struct Checkpointed {};

/// Finer: every block the module runs through `mpx::checkpoint_block` keeps only its input and is
/// recomputed in backward, one block at a time (peak memory: the block inputs plus one block's
/// activations, where `Checkpointed` holds the whole stage's during its recomputation).
struct CheckpointBlocks {};

/// The stage's optimizer.
template <class O>
struct Optimizer
{
  static_assert(is_optimizer_v<O>, "mpx::Optimizer<O>: O must be mpx::SGD, mpx::AdamW or mpx::AdamW8bit");
  using type = O;
};

/// Autocast precision of the stage's forward; master weights and gradients stay fp32.
template <class P>
struct Precision
{
  static_assert(is_precision_v<P>, "mpx::Precision<P>: P must be mpx::FP32, mpx::BF16 or mpx::FP16");
  using type = P;
};

/// Precision of activations and gradients on the wire between this stage and its neighbours.
template <class P>
struct WireCompression
{
  static_assert(std::is_same_v<P, BF16> || std::is_same_v<P, FP16>,
                "mpx::WireCompression<P>: P must be mpx::BF16 or mpx::FP16");
  using type = P;
};

/// Tensor-parallel degree of the stage (heads / columns / rows split over N devices).
template <int N>
struct TensorParallel
{
  static_assert(N >= 1, "mpx::TensorParallel<N>: N must be at least 1");
  static constexpr int value = N;
};

/// Layers [Begin, End) of the stage's module; `End = mpx::to_end` runs to the module's last layer.
inline constexpr int to_end = -1;
template <int Begin, int End>
struct Layers
{
  static_assert(Begin >= 0, "mpx::Layers<Begin, End>: Begin must be >= 0");
  static_assert(End == to_end || End > Begin, "mpx::Layers<Begin, End>: End must be greater than Begin (or mpx::to_end)");
  static constexpr int begin = Begin;
  static constexpr int end = End;
};

/// Sharded data parallelism (ZeRO) of the stage over its data-parallel replicas: at level 1 each replica
/// keeps and steps 1/d of the optimizer state and all-gathers the updated parameters; at level 2 it keeps
/// 1/d of the gradients too from the end of the step's reduction; at level 3 it keeps 1/d of the
/// parameters between steps, all-gathered before the stage's first compute of a step (posted at its start)
/// and released after its last (or whenever another stage computes: `TrainOptions::free_between_computes`), under every
/// schedule (runtime/zero_shard.hpp, docs/09_sharded_data_parallel.md).
template <int Level>
struct Sharded
{
  static_assert(Level >= 1 && Level <= 3, "mpx::Sharded<L>: L must be 1 (optimizer state), 2 (and gradients) or 3 (and parameters)");
  static constexpr int value = Level;
};

/// Fields of the batch this stage reads, besides its input from the previous stage.
template <fixed_string... Fields>
struct Reads
{
  static constexpr std::size_t size = sizeof...(Fields);
  static constexpr std::string_view fields[sizeof...(Fields) + 1] = {Fields.view()..., ""};
};

// ---- Traits and concept ---------------------------------------------------------------------------
template <class T>
struct policy_traits { static constexpr bool is_policy = false; };
template <> struct policy_traits<Frozen> { static constexpr bool is_policy = true; };
template <> struct policy_traits<Checkpointed> { static constexpr bool is_policy = true; };
template <> struct policy_traits<CheckpointBlocks> { static constexpr bool is_policy = true; };
template <class O> struct policy_traits<Optimizer<O>> { static constexpr bool is_policy = true; };
template <class P> struct policy_traits<Precision<P>> { static constexpr bool is_policy = true; };
template <class P> struct policy_traits<WireCompression<P>> { static constexpr bool is_policy = true; };
template <int N> struct policy_traits<TensorParallel<N>> { static constexpr bool is_policy = true; };
template <int B, int E> struct policy_traits<Layers<B, E>> { static constexpr bool is_policy = true; };
template <fixed_string... F> struct policy_traits<Reads<F...>> { static constexpr bool is_policy = true; };
template <int L> struct policy_traits<Sharded<L>> { static constexpr bool is_policy = true; };

/// Concept: a stage policy (see the table above).
template <class T>
concept Policy = policy_traits<T>::is_policy;

namespace detail
{
template <class T> inline constexpr bool is_optimizer_policy = false;
template <class O> inline constexpr bool is_optimizer_policy<Optimizer<O>> = true;
template <class T> inline constexpr bool is_precision_policy = false;
template <class P> inline constexpr bool is_precision_policy<Precision<P>> = true;
template <class T> inline constexpr bool is_wire_policy = false;
template <class P> inline constexpr bool is_wire_policy<WireCompression<P>> = true;
template <class T> inline constexpr bool is_tp_policy = false;
template <int N> inline constexpr bool is_tp_policy<TensorParallel<N>> = true;
template <class T> inline constexpr bool is_layers_policy = false;
template <int B, int E> inline constexpr bool is_layers_policy<Layers<B, E>> = true;
template <class T> inline constexpr bool is_reads_policy = false;
template <fixed_string... F> inline constexpr bool is_reads_policy<Reads<F...>> = true;
template <class T> inline constexpr bool is_sharded_policy = false;
template <int L> inline constexpr bool is_sharded_policy<Sharded<L>> = true;

}  // namespace detail
}  // namespace mpx
