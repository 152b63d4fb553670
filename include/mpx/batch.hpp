// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file batch.hpp
/// `Batch<B>`: the pipeline option naming the batch type, a Boost.Hana struct (one member per field:
/// images, token ids, labels, ...). A stage that `Reads<"labels">` gets that field of every micro-batch
/// without earlier stages passing it along; the names are checked against B at compile time.

#include <mpx/boundary.hpp>  // mpx::detail::is_hana_struct, mpx::detail::has_member

namespace mpx
{

/// Pipeline option: the batch type.
template <class B>
struct Batch
{
  static_assert(detail::is_hana_struct<B>(),
                "mpx::Batch<B>: B must be a Boost.Hana struct (define its members with BOOST_HANA_DEFINE_STRUCT)");
  using type = B;
};

}  // namespace mpx
