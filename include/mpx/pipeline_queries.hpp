// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file pipeline_queries.hpp
/// What one asks of a `Pipeline` type (pipeline.hpp, which includes this header): the concept
/// `PipelineType`; its schedule proof (`proof<P>()`, `proof_v<P>`) and frozen table (`table_v<P>`); and
/// queries answered as `std::integral_constant`s, usable in `static_assert` (`num_stages(P{})`,
/// `slot_of<I, P>()`, `stages_on_slot<Slot, P>()`, ...). Each is a template over P: it reads P's members
/// when instantiated, so a declaration of `Pipeline` is all it needs here.

#include <mpx/action.hpp>     // mpx::detail::freeze
#include <mpx/proof.hpp>      // mpx::prove, mpx::Proof
#include <mpx/run_proof.hpp>  // mpx::prove of a RunTable

#include <array>        // std::array
#include <cstddef>      // std::size_t
#include <type_traits>  // std::integral_constant
#include <utility>      // std::index_sequence, std::integer_sequence

namespace mpx
{

template <class... Args>
struct Pipeline;

namespace detail
{
template <class T> inline constexpr bool is_pipeline = false;
template <class... A> inline constexpr bool is_pipeline<Pipeline<A...>> = true;
}  // namespace detail

/// Concept: an `mpx::Pipeline<...>`.
template <class P>
concept PipelineType = detail::is_pipeline<P>;

/// The schedule proof of P: the compile-time one when P is small enough (`P::proved_at_compile_time`),
/// otherwise computed now (the runtime calls this at start-up and stops on a failed verdict).
template <PipelineType P>
constexpr Proof proof()
{
  if constexpr (P::proved_at_compile_time) return P::compile_time_proof;
  else if constexpr (P::run_form) return prove(P::schedule::runs(P::layout));
  else return prove(P::make_table());
}

/// The compile-time proof of P (only for pipelines proved at compile time).
template <PipelineType P>
  requires(P::proved_at_compile_time)
inline constexpr Proof proof_v = P::compile_time_proof;

/// P's table frozen in static storage, as the executor walks it.
template <PipelineType P>
inline constexpr auto table_v = detail::freeze<P::num_steps, std::size_t(P::num_slots)>(P::make_table());

// ---- Queries: std::integral_constant results, usable in static_assert ----
template <PipelineType P> constexpr auto num_stages(P = {}) { return std::integral_constant<int, P::num_stages>{}; }
template <PipelineType P> constexpr auto num_slots(P = {}) { return std::integral_constant<int, P::num_slots>{}; }
template <PipelineType P> constexpr auto num_microbatches(P = {}) { return std::integral_constant<int, P::num_microbatches>{}; }
template <PipelineType P> constexpr auto num_chunks(P = {}) { return std::integral_constant<int, P::num_chunks>{}; }
template <int I, PipelineType P> constexpr auto slot_of(P = {})
{
  static_assert(I >= 0 && I < P::num_stages, "mpx::slot_of<I>(pipeline): I must be a stage index < num_stages");
  return std::integral_constant<int, P::slots[I]>{};
}
template <PipelineType P> inline constexpr int num_stages_v = P::num_stages;
template <PipelineType P> inline constexpr int num_slots_v = P::num_slots;
template <PipelineType P> inline constexpr int num_microbatches_v = P::num_microbatches;
template <int I, PipelineType P> inline constexpr int slot_of_v = decltype(slot_of<I, P>())::value;

/// The stages a slot holds, in stage order, as a std::integer_sequence.
template <int Slot, PipelineType P>
constexpr auto stages_on_slot(P = {})
{
  constexpr auto list = [] {
    std::array<int, P::num_stages + 1> out{};
    int n = 0;
    for (int i = 0; i < P::num_stages; ++i)
      if (P::slots[i] == Slot) out[n++] = i;
    out[P::num_stages] = n;
    return out;
  }();
  return [&]<std::size_t... K>(std::index_sequence<K...>) {
    return std::integer_sequence<int, list[K]...>{};
  }(std::make_index_sequence<std::size_t(list[P::num_stages])>{});
}

}  // namespace mpx
