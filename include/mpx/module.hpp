// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file module.hpp
/// Concept `StageModule` and `module_traits`: what mpx reads off a user's model class. Model code stays
/// ordinary, single-device LibTorch: mpx only looks at types.
///
/// A stage module is a class (or a `torch::nn::ModuleHolder`, whose `ContainedType` is looked at) with
/// - either a non-overloaded `forward` taking the boundary input (and optionally the batch) and
///   returning the boundary output, or `using input_type = ...; using output_type = ...;`;
/// - optionally `using hidden_type = ...;` — needed for `Layers<b, e>` stages: what one layer range
///   hands the next (range 0 takes `input_type`, the last range returns `output_type`);
/// - optionally `static constexpr int num_layers` (checked against `Layers`), `static constexpr int
///   num_heads`, `num_kv_heads`, `ffn_width`, `vocab_size` (each checked against `TensorParallel<N>`: N must
///   divide it), `static constexpr bool tp_blocks` (written with mpx::tp blocks, so it cuts itself under
///   `TensorParallel<N>`), `static constexpr std::string_view name`. A module whose sizes are run-time
///   configuration declares none of them and its blocks check them when built.
/// Minimal complete definition: a one-argument `forward`. Models: tests/support/archetypes.hpp,
/// examples/hello_pipeline.

#include <mpx/config.hpp>  // mpx::detail::type_name

#include <string_view>  // std::string_view
#include <type_traits>  // std::remove_cvref_t

namespace mpx
{

namespace detail
{
template <class M>
struct contained { using type = M; };
template <class M>
  requires requires { typename M::ContainedType; }
struct contained<M> { using type = typename M::ContainedType; };

template <class F>
struct forward_signature { static constexpr int arity = -1; };
#define MPX_FORWARD_SIGNATURE(QUALS)                                  \
  template <class R, class C, class A>                                \
  struct forward_signature<R (C::*)(A) QUALS>                         \
  {                                                                   \
    static constexpr int arity = 1;                                   \
    using input = std::remove_cvref_t<A>;                             \
    using output = std::remove_cvref_t<R>;                            \
  };                                                                  \
  template <class R, class C, class A, class Bt>                      \
  struct forward_signature<R (C::*)(A, Bt) QUALS>                     \
  {                                                                   \
    static constexpr int arity = 2;                                   \
    using input = std::remove_cvref_t<A>;                             \
    using output = std::remove_cvref_t<R>;                            \
  };
MPX_FORWARD_SIGNATURE()
MPX_FORWARD_SIGNATURE(const)
MPX_FORWARD_SIGNATURE(noexcept)
MPX_FORWARD_SIGNATURE(const noexcept)
#undef MPX_FORWARD_SIGNATURE

template <class I>
struct forward_of { using type = forward_signature<void>; };
template <class I>
  requires requires { &I::forward; }
struct forward_of<I> { using type = forward_signature<decltype(&I::forward)>; };

template <class I>
concept declares_io = requires {
  typename I::input_type;
  typename I::output_type;
};

struct no_io
{
  using input = void;
  using output = void;
};

template <class I, bool Declared = declares_io<I>>
struct io_of
{
  using sig = typename forward_of<I>::type;
  static constexpr bool known = sig::arity == 1 || sig::arity == 2;
  using input = typename std::conditional_t<known, sig, no_io>::input;
  using output = typename std::conditional_t<known, sig, no_io>::output;
};
template <class I>
struct io_of<I, true>
{
  static constexpr bool known = true;
  using input = typename I::input_type;
  using output = typename I::output_type;
};

template <class I> constexpr int static_num_layers() { if constexpr (requires { I::num_layers; }) return I::num_layers; else return -1; }
template <class I> constexpr int static_num_heads() { if constexpr (requires { I::num_heads; }) return I::num_heads; else return -1; }
template <class I> constexpr int static_num_kv_heads() { if constexpr (requires { I::num_kv_heads; }) return I::num_kv_heads; else return -1; }
template <class I> constexpr long static_ffn_width() { if constexpr (requires { I::ffn_width; }) return I::ffn_width; else return -1; }
template <class I> constexpr long static_vocab_size() { if constexpr (requires { I::vocab_size; }) return I::vocab_size; else return -1; }
template <class I> constexpr bool static_tp_blocks() { if constexpr (requires { { I::tp_blocks } -> std::convertible_to<bool>; }) return I::tp_blocks; else return false; }
template <class I> constexpr std::string_view module_name()
{
  if constexpr (requires { { I::name } -> std::convertible_to<std::string_view>; }) return I::name;
  else return type_name<I>();
}
template <class I> struct hidden_of { using type = void; };
template <class I> requires requires { typename I::hidden_type; } struct hidden_of<I> { using type = typename I::hidden_type; };
}  // namespace detail

/// What mpx reads off a stage module (see the file comment).
template <class M>
struct module_traits
{
  using impl = typename detail::contained<M>::type;
  static constexpr bool is_module = detail::io_of<impl>::known;
  using input_type = typename detail::io_of<impl>::input;
  using output_type = typename detail::io_of<impl>::output;
  using hidden_type = typename detail::hidden_of<impl>::type;
  static constexpr int num_layers = detail::static_num_layers<impl>();  ///< -1 if not known statically
  static constexpr int num_heads = detail::static_num_heads<impl>();    ///< -1 if not declared
  static constexpr int num_kv_heads = detail::static_num_kv_heads<impl>();  ///< -1 if not declared
  static constexpr long ffn_width = detail::static_ffn_width<impl>();       ///< the MLP's hidden width; -1 if not declared
  static constexpr long vocab_size = detail::static_vocab_size<impl>();     ///< -1 if not declared
  static constexpr bool tp_blocks = detail::static_tp_blocks<impl>();   ///< written with mpx::tp blocks: it cuts itself
  static constexpr std::string_view name = detail::module_name<impl>();
};

/// Concept: a stage module (see the file comment).
template <class M>
concept StageModule = module_traits<M>::is_module;

}  // namespace mpx
