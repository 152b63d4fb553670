// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file stage.hpp
/// `Stage<Module, Device, Policies...>`: one piece of the model, where it runs and how.
///
/// ```
/// mpx::Stage<moondream::Vision, mpx::GPU<0>, mpx::Frozen, mpx::Checkpointed>
/// mpx::Stage<moondream::Text, mpx::GPU<1>, mpx::Layers<0, 8>, mpx::Optimizer<mpx::AdamW8bit>>
/// ```
/// Every rule that concerns one stage alone is checked here, with a message naming the fix.

#include <mpx/device.hpp>  // mpx::Device, mpx::device_traits
#include <mpx/module.hpp>  // mpx::StageModule, mpx::module_traits
#include <mpx/policy.hpp>  // mpx::Policy and the policy types

#include <type_traits>  // std::conditional_t, std::is_same_v

namespace mpx
{

namespace detail
{
template <template <class> class Is, class... Ps>
inline constexpr int count_if = (0 + ... + int(Is<Ps>::value));

template <class T> struct is_optimizer_p : std::bool_constant<is_optimizer_policy<T>> {};
template <class T> struct is_precision_p : std::bool_constant<is_precision_policy<T>> {};
template <class T> struct is_wire_p : std::bool_constant<is_wire_policy<T>> {};
template <class T> struct is_tp_p : std::bool_constant<is_tp_policy<T>> {};
template <class T> struct is_layers_p : std::bool_constant<is_layers_policy<T>> {};
template <class T> struct is_reads_p : std::bool_constant<is_reads_policy<T>> {};
template <class T> struct is_sharded_p : std::bool_constant<is_sharded_policy<T>> {};
template <class T> struct is_frozen_p : std::bool_constant<std::is_same_v<T, Frozen>> {};
/// Whether tensor-parallel degree `n` splits a declared size evenly (a size <= 0 is not declared: true).
inline constexpr bool tp_divides(long size, int n) { return n == 1 || size <= 0 || size % n == 0; }
/// Key/value heads split N ways, or (fewer than N) each shared by N / size adjacent ranks.
inline constexpr bool tp_divides_or_shares(long size, int n) { return tp_divides(size, n) || (size > 0 && n % size == 0); }
template <class T> struct is_checkpointed_p : std::bool_constant<std::is_same_v<T, Checkpointed>> {};
template <class T> struct is_block_checkpointed_p : std::bool_constant<std::is_same_v<T, CheckpointBlocks>> {};

/// The first of Ps satisfying Is, or Default.
template <template <class> class Is, class Default, class... Ps>
struct first_of { using type = Default; };
template <template <class> class Is, class Default, class P, class... Ps>
struct first_of<Is, Default, P, Ps...>
{
  using type = std::conditional_t<Is<P>::value, P, typename first_of<Is, Default, Ps...>::type>;
};

struct no_policy {};
template <class T> struct policy_arg { using type = void; };
template <template <class> class W, class T> struct policy_arg<W<T>> { using type = T; };
template <class T> struct tp_degree : std::integral_constant<int, 1> {};
template <int N> struct tp_degree<TensorParallel<N>> : std::integral_constant<int, N> {};
template <class T> struct sharding_level : std::integral_constant<int, 0> {};
template <int L> struct sharding_level<Sharded<L>> : std::integral_constant<int, Sharded<L>::value> {};  // instantiated: its checks run
template <class T> struct layer_range { static constexpr int begin = 0, end = to_end; };
template <int B, int E> struct layer_range<Layers<B, E>> { static constexpr int begin = B, end = E; };
}  // namespace detail

/// One stage of a pipeline (see the file comment).
template <class Module, class Dev, class... Policies>
struct Stage
{
  static_assert(StageModule<Module>,
                "mpx::Stage<Module, Device, ...>: Module must be a stage module: a class (or torch::nn::ModuleHolder) "
                "with a non-overloaded one-argument forward, or one that declares input_type and output_type");
  static_assert(Device<Dev>,
                "mpx::Stage<Module, Device, ...>: Device must be a device tag such as mpx::GPU<0> or mpx::CPU<0>");
  static_assert((Policy<Policies> && ...),
                "mpx::Stage<Module, Device, Policies...>: each policy must be one of mpx::Frozen, mpx::Checkpointed, "
                "mpx::CheckpointBlocks, "
                "mpx::Optimizer<O>, mpx::Precision<P>, mpx::WireCompression<P>, mpx::TensorParallel<N>, "
                "mpx::Layers<b, e>, mpx::Reads<\"field\"...>, mpx::Sharded<L>");

  using module = Module;
  using device = Dev;
  using traits = module_traits<Module>;
  static constexpr int slot = device_traits<Dev>::index;
  static constexpr DeviceKind kind = device_traits<Dev>::kind;

  static constexpr bool frozen = detail::count_if<detail::is_frozen_p, Policies...> > 0;
  static constexpr bool checkpointed = detail::count_if<detail::is_checkpointed_p, Policies...> > 0;
  static constexpr bool checkpoint_blocks = detail::count_if<detail::is_block_checkpointed_p, Policies...> > 0;
  static_assert(!(checkpointed && checkpoint_blocks),
                "mpx::Stage: mpx::Checkpointed (the whole stage) and mpx::CheckpointBlocks (each block) exclude each "
                "other; keep one");
  static_assert(detail::count_if<detail::is_optimizer_p, Policies...> <= 1,
                "mpx::Stage: a stage takes at most one mpx::Optimizer<...>; remove the extra one");
  static_assert(!(frozen && detail::count_if<detail::is_optimizer_p, Policies...> > 0),
                "mpx::Stage: a Frozen stage has no gradients and takes no mpx::Optimizer<...>; remove mpx::Frozen or the optimizer");
  static_assert(detail::count_if<detail::is_precision_p, Policies...> <= 1,
                "mpx::Stage: a stage takes at most one mpx::Precision<...>; remove the extra one");
  static_assert(detail::count_if<detail::is_wire_p, Policies...> <= 1,
                "mpx::Stage: a stage takes at most one mpx::WireCompression<...>; remove the extra one");
  static_assert(detail::count_if<detail::is_tp_p, Policies...> <= 1,
                "mpx::Stage: a stage takes at most one mpx::TensorParallel<N>; remove the extra one");
  static_assert(detail::count_if<detail::is_layers_p, Policies...> <= 1,
                "mpx::Stage: a stage takes at most one mpx::Layers<b, e>; split it into several stages instead");
  static_assert(detail::count_if<detail::is_reads_p, Policies...> <= 1,
                "mpx::Stage: list every batch field in one mpx::Reads<\"a\", \"b\", ...>");

  /// The optimizer tag, or void for none (frozen stages, or parameters trained elsewhere).
  using optimizer = typename detail::policy_arg<typename detail::first_of<detail::is_optimizer_p, detail::no_policy, Policies...>::type>::type;
  /// The autocast precision (FP32 when no Precision policy is given).
  using precision = std::conditional_t<
      detail::count_if<detail::is_precision_p, Policies...> == 0, FP32,
      typename detail::policy_arg<typename detail::first_of<detail::is_precision_p, detail::no_policy, Policies...>::type>::type>;
  /// The wire precision, or void for none.
  using wire = typename detail::policy_arg<typename detail::first_of<detail::is_wire_p, detail::no_policy, Policies...>::type>::type;
  static_assert(!(std::is_same_v<precision, FP16> && kind == DeviceKind::cpu),
                "mpx::Stage: mpx::Precision<mpx::FP16> needs a GPU device (LibTorch's CPU autocast is bf16 only); "
                "use mpx::Precision<mpx::BF16> on CPU");

  static constexpr int tensor_parallel = detail::tp_degree<typename detail::first_of<detail::is_tp_p, detail::no_policy, Policies...>::type>::value;
  static_assert(tensor_parallel == 1 || traits::tp_blocks,
                "mpx::Stage: mpx::TensorParallel<N> needs a module that says how it is cut: write it with mpx::tp "
                "blocks (ColumnLinear, RowLinear, VocabEmbedding, tp::cross_entropy) and declare "
                "static constexpr bool tp_blocks = true");
  static_assert(detail::tp_divides(traits::num_heads, tensor_parallel),
                "mpx::Stage: the tensor-parallel degree N of mpx::TensorParallel<N> must divide the module's num_heads; "
                "choose N among the divisors of num_heads");
  static_assert(detail::tp_divides_or_shares(traits::num_kv_heads, tensor_parallel),
                "mpx::Stage: the tensor-parallel degree N of mpx::TensorParallel<N> must divide the module's num_kv_heads "
                "or be a multiple of it (each rank holds its query heads' key/value heads; fewer than N of them are each "
                "shared by N / num_kv_heads ranks): choose N among the divisors or the multiples of num_kv_heads");
  static_assert(detail::tp_divides(traits::ffn_width, tensor_parallel),
                "mpx::Stage: the tensor-parallel degree N of mpx::TensorParallel<N> must divide the module's ffn_width "
                "(the MLP's columns are split N ways): choose N among its divisors, or pad the width");
  static_assert(detail::tp_divides(traits::vocab_size, tensor_parallel),
                "mpx::Stage: the tensor-parallel degree N of mpx::TensorParallel<N> must divide the module's vocab_size "
                "(the embedding and the head are split by vocabulary): pad the vocabulary to a multiple of N");

  using layers_policy = typename detail::first_of<detail::is_layers_p, detail::no_policy, Policies...>::type;
  static constexpr bool has_layers = detail::count_if<detail::is_layers_p, Policies...> > 0;
  static constexpr int layer_begin = detail::layer_range<layers_policy>::begin;
  static constexpr int layer_end = detail::layer_range<layers_policy>::end;
  static_assert(!has_layers || !std::is_void_v<typename traits::hidden_type>,
                "mpx::Stage: a mpx::Layers<b, e> stage's module must declare hidden_type (what one layer range hands "
                "the next)");
  static_assert(!has_layers || traits::num_layers < 0 ||
                    (layer_begin < traits::num_layers && (layer_end == to_end || layer_end <= traits::num_layers)),
                "mpx::Stage: mpx::Layers<b, e> reaches past the module's num_layers; keep e <= num_layers");

  using reads = typename detail::first_of<detail::is_reads_p, Reads<>, Policies...>::type;

  /// The ZeRO level over the data-parallel replicas (Sharded<L>; 0: every replica holds everything).
  static constexpr int sharding = detail::sharding_level<typename detail::first_of<detail::is_sharded_p, detail::no_policy, Policies...>::type>::value;
  static_assert(detail::count_if<detail::is_sharded_p, Policies...> <= 1, "mpx::Stage: a stage takes at most one mpx::Sharded<L>");
  static_assert(!(frozen && sharding > 0),
                "mpx::Stage: a Frozen stage has no gradients and no optimizer state to shard; remove mpx::Sharded<L> or mpx::Frozen");

  using policies = void (*)(Policies*...);  // the policy list, for printing and fingerprints
};

namespace detail
{
template <class T> inline constexpr bool is_stage = false;
template <class M, class D, class... Ps> inline constexpr bool is_stage<Stage<M, D, Ps...>> = true;
}  // namespace detail

}  // namespace mpx
