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

#include <mpx/config.hpp>    // mpx::detail::fnv1a, mpx::detail::type_name
#include <mpx/pipeline.hpp>  // mpx::PipelineType

#include <cstdint>  // std::uint64_t
#include <utility>  // std::index_sequence

namespace mpx
{

namespace detail
{
template <class P, std::size_t... I>
constexpr std::uint64_t fingerprint_impl(std::index_sequence<I...>)
{
  std::uint64_t h = fnv1a("mpx/" MPX_STRINGIFY(MPX_VERSION_MAJOR) "." MPX_STRINGIFY(MPX_VERSION_MINOR) "|");
  h = fnv1a(type_name<P>(), h);
  ((h = fnv1a(type_name<typename P::template input_of<int(I)>>(), fnv1a("|in|", h)),
    h = fnv1a(type_name<typename P::template output_of<int(I)>>(), fnv1a("|out|", h))),
   ...);
  h = fnv1a_u64(std::uint64_t(P::num_microbatches), h);
  return h;
}
}  // namespace detail

/// The fingerprint of pipeline P (see the file comment).
template <PipelineType P>
inline constexpr std::uint64_t fingerprint_v = detail::fingerprint_impl<P>(std::make_index_sequence<std::size_t(P::num_stages)>{});

}  // namespace mpx
