// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file table_view.hpp
/// `TableView`: a pipeline's schedule table as the runtime reads it — one type for every pipeline, so what
/// is computed from a table at run time (a rank's action list, the proof's numbers, the printed timeline)
/// is code of one type, not of each pipeline's. Under `mpx::compiled` that code is compiled once, in the
/// library, and a program's own TU builds, proves and expands no table at run time: `table_view<P>()`
/// views the table constant-evaluated at compile time (`table_v<P>`), and builds it once at start-up only
/// for tables of more than `detail::static_table_steps` steps.
///
/// ```
/// const mpx::TableView t = mpx::table_view<P>();
/// std::vector<mpx::Action> mine = mpx::actions_of(t, rank);  // == mpx::expand(P::make_table(), rank)
/// double bubble = mpx::proof_of(t).bubble();                 // == mpx::prove(P::make_table()).bubble()
/// ```

#include <mpx/action.hpp>            // mpx::Table, mpx::FrozenTable, mpx::Step, mpx::Layout, mpx::expand
#include <mpx/pipeline.hpp>          // mpx::PipelineType, mpx::table_v
#include <mpx/proof.hpp>             // mpx::Proof, mpx::prove
#include <mpx/linkage.hpp>   // MPX_DECL, MPX_DEFINITIONS

#include <cstddef>  // std::size_t
#include <cstdint>  // std::uint32_t
#include <span>     // std::span
#include <vector>   // std::vector

namespace mpx
{

/// A schedule table's steps, seen where they lie (a `FrozenTable` in static storage, or a `Table`); the
/// interface of both, so `prove`, `expand` and `print_timeline` read it as they read them.
struct TableView
{
  Layout layout;
  std::span<const Step> steps;               ///< all ranks' steps, rank after rank
  std::span<const std::uint32_t> begin;      ///< rank r's steps are [begin[r], begin[r+1])
  std::span<const std::uint32_t> post_begin; ///< receives of rank r's computes [0, post_begin[r]) are posted first
  int malformed_rank = -1;
  int malformed_step = -1;

  constexpr int num_ranks() const { return static_cast<int>(begin.size()) - 1; }
  constexpr std::span<const Step> rank(int r) const { return steps.subspan(begin[std::size_t(r)], begin[std::size_t(r) + 1] - begin[std::size_t(r)]); }
};

/// A view of a frozen table (valid as long as it is: `table_v<P>` is static).
template <std::size_t N, std::size_t R>
constexpr TableView view(const FrozenTable<N, R>& t)
{
  return {t.layout, {t.steps.data(), N}, {t.begin.data(), R + 1}, {t.post_begin.data(), R}, t.malformed_rank, t.malformed_step};
}
/// A view of a table (valid as long as it is).
constexpr TableView view(const Table& t)
{
  return {t.layout, {t.steps.data(), t.steps.size()}, {t.begin.data(), t.begin.size()}, {t.post_begin.data(), t.post_begin.size()},
          t.malformed_rank, t.malformed_step};
}

namespace detail
{
/// Up to this many steps a pipeline's table is constant-evaluated into static storage (`table_v`); a
/// larger one (a compressed schedule proved at compile time may have 10⁵ steps) is built at start-up.
inline constexpr std::size_t static_table_steps = 4096;
}  // namespace detail

/// P's table: constant-evaluated at compile time when it is small (`detail::static_table_steps`), else
/// built once (the first call) and kept.
template <PipelineType P>
TableView table_view()
{
  if constexpr (P::num_steps <= detail::static_table_steps) return view(table_v<P>);
  else {
    static const Table built = P::make_table();
    return view(built);
  }
}

/// Rank r's explicit action list: `expand(t, r)`, compiled once.
MPX_DECL std::vector<Action> actions_of(const TableView& t, int r);
/// The table's proof: `prove(t)`, compiled once.
MPX_DECL Proof proof_of(const TableView& t);

}  // namespace mpx

#if MPX_DEFINITIONS
// ---- definitions (compiled once under MPX_SEPARATE_COMPILATION: linkage.hpp) ----
namespace mpx
{
MPX_DECL std::vector<Action> actions_of(const TableView& t, int r) { return expand(t, r); }
MPX_DECL Proof proof_of(const TableView& t) { return prove(t); }
}  // namespace mpx
#endif
