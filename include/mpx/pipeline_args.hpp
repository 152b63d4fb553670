// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file pipeline_args.hpp
/// How `Pipeline<Args...>` reads its arguments: which are stages (`Stage<...>`) and which options
/// (`Schedule<T>`, `Microbatches<M>`, `Batch<B>`), each option's value or its default, and the stages as a
/// list whose I-th type is found in O(1) instantiations. Internal (`mpx::detail`).

#include <mpx/batch.hpp>     // mpx::Batch
#include <mpx/schedule.hpp>  // mpx::Schedule, mpx::Microbatches, mpx::OneFOneB
#include <mpx/stage.hpp>     // mpx::detail::is_stage

#include <cstddef>      // std::size_t
#include <tuple>        // std::tuple
#include <type_traits>  // std::bool_constant, std::conditional_t
#include <utility>      // std::index_sequence

namespace mpx::detail
{

template <class T> inline constexpr bool is_schedule_option = false;
template <class T> inline constexpr bool is_schedule_option<Schedule<T>> = true;
template <class T> inline constexpr bool is_microbatches_option = false;
template <int M> inline constexpr bool is_microbatches_option<Microbatches<M>> = true;
template <class T> inline constexpr bool is_batch_option = false;
template <class B> inline constexpr bool is_batch_option<Batch<B>> = true;
template <class T> inline constexpr bool is_option = is_schedule_option<T> || is_microbatches_option<T> || is_batch_option<T>;

template <class T> struct is_stage_p : std::bool_constant<is_stage<T>> {};
template <class T> struct is_schedule_p : std::bool_constant<is_schedule_option<T>> {};
template <class T> struct is_microbatches_p : std::bool_constant<is_microbatches_option<T>> {};
template <class T> struct is_batch_p : std::bool_constant<is_batch_option<T>> {};

template <class... Ts> struct type_list {};
template <class List, class T> struct push_if_stage;
template <class... Ss, class T> struct push_if_stage<type_list<Ss...>, T>
{
  using type = std::conditional_t<is_stage<T>, type_list<Ss..., T>, type_list<Ss...>>;
};
template <class List, class... Ts> struct stages_of { using type = List; };
template <class List, class T, class... Ts> struct stages_of<List, T, Ts...>
{
  using type = typename stages_of<typename push_if_stage<List, T>::type, Ts...>::type;
};
template <class List> struct as_tuple;
template <class... Ss> struct as_tuple<type_list<Ss...>> { using type = std::tuple<Ss...>; };

// The I-th type of a list in O(1) instantiations (std::tuple_element recurses through the pack: with
// 64 stages that alone was a tenth of a second of compile time).
template <std::size_t I, class T> struct indexed { using type = T; };
template <class Seq, class... Ts> struct indexer;
template <std::size_t... I, class... Ts> struct indexer<std::index_sequence<I...>, Ts...> : indexed<I, Ts>... {};
template <std::size_t I, class T> indexed<I, T> select(const indexed<I, T>&);  // unevaluated only
template <class List> struct indexer_of;
template <class... Ts> struct indexer_of<type_list<Ts...>> { using type = indexer<std::index_sequence_for<Ts...>, Ts...>; };

template <class O> struct option_value { static constexpr int value = 0; };
template <int M> struct option_value<Microbatches<M>> { static constexpr int value = M; };
template <class O> struct schedule_of_option { using type = OneFOneB; };
template <class T> struct schedule_of_option<Schedule<T>> { using type = T; };
template <class O> struct batch_of_option { using type = void; };
template <class B> struct batch_of_option<Batch<B>> { using type = B; };

template <class Tag> constexpr bool any_placement()
{
  if constexpr (requires { Tag::any_placement; }) return Tag::any_placement;
  else return false;
}

}  // namespace mpx::detail
