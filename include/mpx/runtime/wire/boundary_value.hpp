// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file runtime/wire/boundary_value.hpp
/// A boundary value (a tensor, or a Hana struct of tensors: boundary.hpp) as the runtime handles it: a
/// list of tensors in member order. `flatten` and `unflatten` convert; `field_names` names the members for
/// error messages; `field_dims` gives each member's declared shape (shape.hpp), checked on receipt. A batch
/// (a Hana struct of tensors too) is handled the same way.

#include <mpx/boundary.hpp>      // mpx::detail::member_t
#include <mpx/shape.hpp>         // mpx::DeclaresShape
#include <mpx/torch/shaped.hpp>  // mpx::Shaped
#include <mpx/torch/tensor.hpp>  // at::Tensor as TensorLike

#include <boost/hana/define_struct.hpp>  // BOOST_HANA_DEFINE_STRUCT: how a user declares a boundary or batch type

#include <boost/hana/accessors.hpp>  // boost::hana::accessors
#include <boost/hana/first.hpp>      // boost::hana::first
#include <boost/hana/for_each.hpp>   // boost::hana::for_each
#include <boost/hana/second.hpp>     // boost::hana::second

#include <cstdint>      // std::int64_t
#include <optional>     // std::optional
#include <string>       // std::string
#include <type_traits>  // std::is_base_of_v
#include <vector>       // std::vector

namespace mpx::detail
{

/// A boundary that is one tensor (at::Tensor, or a tensor that declares its shape), not a struct.
template <class T>
inline constexpr bool is_one_tensor = std::is_base_of_v<at::Tensor, std::remove_cvref_t<T>>;

/// A boundary value as a list of tensors, in member order.
template <class T>
std::vector<at::Tensor> flatten(const T& v)
{
  if constexpr (is_one_tensor<T>) {
    return {v};
  } else {
    std::vector<at::Tensor> out;
    boost::hana::for_each(boost::hana::accessors<T>(), [&](auto p) { out.push_back(boost::hana::second(p)(v)); });
    return out;
  }
}

/// The inverse of `flatten`.
template <class T>
T unflatten(const std::vector<at::Tensor>& ts)
{
  if constexpr (is_one_tensor<T>) {
    return ts.at(0);
  } else {
    T v{};
    std::size_t i = 0;
    boost::hana::for_each(boost::hana::accessors<T>(), [&](auto p) { boost::hana::second(p)(v) = ts.at(i++); });
    return v;
  }
}

/// Member names of a boundary type, for error messages.
template <class T>
std::vector<std::string> field_names()
{
  if constexpr (is_one_tensor<T>) {
    return {"tensor"};
  } else {
    std::vector<std::string> out;
    boost::hana::for_each(boost::hana::accessors<T>(), [&](auto p) {
      out.emplace_back(std::remove_cvref_t<decltype(boost::hana::first(p))>::c_str());
    });
    return out;
  }
}

/// A declared shape as the receiver checks it: the extents, mpx::any where free; none if undeclared.
using DeclaredDims = std::optional<std::vector<std::int64_t>>;

template <class T>
DeclaredDims dims_of()
{
  if constexpr (DeclaresShape<T>) {
    const auto& e = tensor_traits<std::remove_cvref_t<T>>::dims::extents;
    return std::vector<std::int64_t>(e.begin(), e.end());
  } else {
    return std::nullopt;
  }
}

/// Each member's declared shape, in member order.
template <class T>
std::vector<DeclaredDims> field_dims()
{
  if constexpr (is_one_tensor<T>) {
    return {dims_of<T>()};
  } else {
    std::vector<DeclaredDims> out;
    boost::hana::for_each(boost::hana::accessors<T>(), [&](auto p) { out.push_back(dims_of<member_t<T, decltype(p)>>()); });
    return out;
  }
}

}  // namespace mpx::detail
