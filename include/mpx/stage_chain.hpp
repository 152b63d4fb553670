// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file stage_chain.hpp
/// The stages of a pipeline as a chain: what each stage receives and returns (a `Layers<b, e>` stage's inner
/// ranges exchange the module's `hidden_type`), whether each output feeds the next input, whether the
/// `Layers` ranges of one module tile its layers exactly once in stage order, and whether every field a
/// stage `Reads` exists in the batch. `Pipeline` asserts each with its own message. Internal.

#include <mpx/boundary.hpp>       // mpx::Boundary, mpx::detail::has_member
#include <mpx/pipeline_args.hpp>  // mpx::detail::select
#include <mpx/stage.hpp>          // mpx::to_end

#include <cstddef>      // std::size_t
#include <type_traits>  // std::conditional_t, std::is_convertible_v, std::is_same_v
#include <utility>      // std::declval, std::index_sequence

namespace mpx::detail
{

/// Raised (with the boundary index and both types in the diagnostic) when stage I's output does not
/// feed stage I+1.
template <int I, class Out, class In>
struct boundary_check
{
  static_assert(std::is_convertible_v<Out, In>,
                "mpx::Pipeline: the output type of a stage is not accepted by the next stage's input (see the "
                "boundary index and both types in mpx::detail::boundary_check<I, Out, In> above); make stage I's "
                "output_type the input_type of stage I+1");
  static_assert(std::is_convertible_v<Out, In> == false || Boundary<Out>,
                "mpx::Pipeline: a stage boundary must be a tensor or a Boost.Hana struct of tensors "
                "(BOOST_HANA_DEFINE_STRUCT); wrap the values in such a struct");
  static constexpr bool ok = true;
};

/// The chain of `N` stages that `Indexer` (pipeline_args.hpp) indexes, reading fields of `Batch` (void:
/// none).
template <class Indexer, std::size_t N, class Batch>
struct StageChain
{
  template <int I>
  using stage = typename decltype(select<std::size_t(I)>(std::declval<const Indexer&>()))::type;
  using seq = std::make_index_sequence<N>;

  /// Whether stage I holds its module's last range (or the whole module).
  template <int I>
  static constexpr bool is_last_range()
  {
    if constexpr (!stage<I>::has_layers) return true;
    else return [] <std::size_t... J>(std::index_sequence<J...>) {
      return !((int(J) > I && stage<int(J)>::has_layers &&
                std::is_same_v<typename stage<int(J)>::module, typename stage<I>::module>) || ...);
    }(seq{});
  }
  /// The stage holding the range of stage I's module before I's (-1: none).
  template <int I>
  static constexpr int previous_range()
  {
    return [] <std::size_t... J>(std::index_sequence<J...>) {
      int prev = -1;
      ((prev = (int(J) < I && stage<int(J)>::has_layers &&
                std::is_same_v<typename stage<int(J)>::module, typename stage<I>::module>) ? int(J) : prev), ...);
      return prev;
    }(seq{});
  }

  template <int I>
  using input_of = std::conditional_t<stage<I>::has_layers && stage<I>::layer_begin != 0,
                                      typename stage<I>::traits::hidden_type, typename stage<I>::traits::input_type>;
  template <int I>
  using output_of = std::conditional_t<stage<I>::has_layers && !is_last_range<I>(),
                                       typename stage<I>::traits::hidden_type, typename stage<I>::traits::output_type>;

  /// Each output feeds the next input (a failure is `boundary_check`'s message, naming both types).
  static constexpr bool boundaries_chain()
  {
    return []<std::size_t... I>(std::index_sequence<I...>) {
      return (boundary_check<int(I), output_of<int(I)>, input_of<int(I) + 1>>::ok && ... && true);
    }(std::make_index_sequence<(N > 0 ? N - 1 : 0)>{});
  }

  /// The `Layers` ranges of each module tile its layers exactly once, in stage order; a module split into
  /// ranges is not also a whole stage.
  static constexpr bool layers_tile()
  {
    return []<std::size_t... I>(std::index_sequence<I...>) {
      if constexpr (!(stage<int(I)>::has_layers || ... || false)) return true;  // no ranges: nothing to tile (O(p), not O(p²))
      else return ([] {
        constexpr int i = int(I);
        using S = stage<i>;
        if constexpr (!S::has_layers) {
          return ![] <std::size_t... J>(std::index_sequence<J...>) {
            return ((stage<int(J)>::has_layers && std::is_same_v<typename stage<int(J)>::module, typename S::module>) || ...);
          }(seq{});
        } else {
          constexpr int prev = previous_range<i>();
          if constexpr (prev < 0) {
            if (S::layer_begin != 0) return false;
          } else {
            if (stage<prev>::layer_end == to_end || stage<prev>::layer_end != S::layer_begin) return false;
          }
          if constexpr (is_last_range<i>()) {
            constexpr int n = S::traits::num_layers;
            if (n >= 0 && S::layer_end != to_end && S::layer_end != n) return false;
          }
          return true;
        }
      }() && ... && true);
    }(seq{});
  }

  /// Every field a stage `Reads` is a member of `Batch`.
  static constexpr bool reads_exist()
  {
    return []<std::size_t... I>(std::index_sequence<I...>) {
      return ([] {
        using R = typename stage<int(I)>::reads;
        if constexpr (R::size == 0) return true;
        else if constexpr (std::is_void_v<Batch>) return false;
        else {
          for (std::size_t f = 0; f < R::size; ++f)
            if (!has_member<Batch>(R::fields[f])) return false;
          return true;
        }
      }() && ... && true);
    }(seq{});
  }
};

}  // namespace mpx::detail
