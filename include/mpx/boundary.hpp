// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file boundary.hpp
/// Concept `Boundary`: what one stage hands the next — a tensor, or a Boost.Hana struct whose every
/// member is a tensor (`BOOST_HANA_DEFINE_STRUCT`). Several tensors, integer tensors and tensors that
/// need no gradient are all first-class: dtype and grad-ness travel in the per-micro-batch header.
///
/// Models: `torch::Tensor`; `struct VisionOut { BOOST_HANA_DEFINE_STRUCT(VisionOut, (torch::Tensor, embeds),
/// (torch::Tensor, mask)); };`.

#include <mpx/tensor.hpp>  // mpx::TensorLike

#include <boost/hana/accessors.hpp>       // boost::hana::accessors
#include <boost/hana/concept/struct.hpp>  // boost::hana::Struct
#include <boost/hana/first.hpp>           // boost::hana::first
#include <boost/hana/second.hpp>          // boost::hana::second
#include <boost/hana/string.hpp>          // boost::hana::string::c_str
#include <boost/hana/unpack.hpp>          // boost::hana::unpack

#include <string_view>  // std::string_view
#include <type_traits>  // std::remove_cvref_t
#include <utility>      // std::declval

namespace mpx
{

namespace detail
{
template <class T>
constexpr bool is_hana_struct()
{
  return boost::hana::Struct<T>::value;
}

/// The type of member accessor `Acc` applied to a T.
template <class T, class Pair>
using member_t = std::remove_cvref_t<decltype(boost::hana::second(std::declval<Pair>())(std::declval<T&>()))>;

template <class T, class Pair>
inline constexpr bool member_is_tensor = TensorLike<member_t<T, Pair>>;

template <class T>
constexpr bool all_members_tensors()
{
  if constexpr (!is_hana_struct<T>()) {
    return false;
  } else {
    using Accs = decltype(boost::hana::accessors<T>());
    return boost::hana::unpack(Accs{}, [](auto... p) { return (member_is_tensor<T, decltype(p)> && ... && true); });
  }
}

/// Number of members of a Hana struct.
template <class T>
constexpr int num_members()
{
  return boost::hana::unpack(boost::hana::accessors<T>(), [](auto... p) { return int(sizeof...(p)); });
}

/// True if Hana struct T has a member called `name`.
template <class T>
constexpr bool has_member(std::string_view name)
{
  if constexpr (!is_hana_struct<T>()) {
    return false;
  } else {
    return boost::hana::unpack(boost::hana::accessors<T>(), [&](auto... p) {
      return ((std::string_view(std::remove_cvref_t<decltype(boost::hana::first(p))>::c_str()) == name) || ... || false);
    });
  }
}
}  // namespace detail

/// Concept: a stage boundary (see the file comment).
template <class T>
concept Boundary = TensorLike<T> || detail::all_members_tensors<std::remove_cvref_t<T>>();

}  // namespace mpx
