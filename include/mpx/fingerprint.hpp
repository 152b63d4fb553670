// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file fingerprint.hpp
/// `mpx::fingerprint_v<P>`: a 64-bit hash of everything that must agree across ranks: the pipeline type
/// (stages, modules, devices, policies, schedule, micro-batches), each stage's boundary types, and the
/// mpx version. All ranks compare it in one collective before the first step (runtime), so ranks built
/// from different binaries or configurations stop with a clear error instead of hanging.
///
/// Stable for one compiler and one source tree (it hashes the compiler's spelling of the types); ranks of
/// one job run one binary, which is what it guards.
///
/// `model_fingerprint_v<P>`: the same without the stages' `Sharded<L>` policies — how replicas hold the
/// state, not what it is: what a checkpoint is saved under, so that it loads at another ZeRO level (equal to
/// `fingerprint_v<P>` for a pipeline without them).

#include <mpx/config.hpp>    // mpx::detail::fnv1a, mpx::detail::type_name
#include <mpx/pipeline.hpp>  // mpx::PipelineType

#include <cstdint>  // std::uint64_t
#include <type_traits>  // std::conditional_t
#include <utility>  // std::index_sequence

namespace mpx
{

namespace detail
{
/// Stage `S` without its `Sharded<L>` policy (the other policies in their order), and pipeline `P` with
/// every stage so: types named, never instantiated.
template <class Kept, class... Ps>
struct drop_sharded { using type = Kept; };
template <class M, class D, class... Kept, class P, class... Ps>
struct drop_sharded<Stage<M, D, Kept...>, P, Ps...>
{
  using type = typename std::conditional_t<is_sharded_policy<P>, drop_sharded<Stage<M, D, Kept...>, Ps...>,
                                           drop_sharded<Stage<M, D, Kept..., P>, Ps...>>::type;
};
template <class A> struct unsharded_arg { using type = A; };
template <class M, class D, class... Ps> struct unsharded_arg<Stage<M, D, Ps...>> { using type = typename drop_sharded<Stage<M, D>, Ps...>::type; };
template <class P> struct unsharded_pipeline;
template <class... A> struct unsharded_pipeline<Pipeline<A...>> { using type = Pipeline<typename unsharded_arg<A>::type...>; };

template <class P, class Named, std::size_t... I>
constexpr std::uint64_t fingerprint_impl(std::index_sequence<I...>)
{
  std::uint64_t h = fnv1a("mpx/" MPX_STRINGIFY(MPX_VERSION_MAJOR) "." MPX_STRINGIFY(MPX_VERSION_MINOR) "|");
  h = fnv1a(type_name<Named>(), h);
  ((h = fnv1a(type_name<typename P::template input_of<int(I)>>(), fnv1a("|in|", h)),
    h = fnv1a(type_name<typename P::template output_of<int(I)>>(), fnv1a("|out|", h))),
   ...);
  h = fnv1a_u64(std::uint64_t(P::num_microbatches), h);
  return h;
}
}  // namespace detail

/// The fingerprint of pipeline P (see the file comment).
template <PipelineType P>
inline constexpr std::uint64_t fingerprint_v = detail::fingerprint_impl<P, P>(std::make_index_sequence<std::size_t(P::num_stages)>{});

/// The fingerprint of pipeline P's model, whatever its stages' ZeRO levels (see the file comment).
template <PipelineType P>
inline constexpr std::uint64_t model_fingerprint_v =
    detail::fingerprint_impl<P, typename detail::unsharded_pipeline<P>::type>(std::make_index_sequence<std::size_t(P::num_stages)>{});

}  // namespace mpx
