// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/pipeline_args.hpp: a Pipeline's arguments sorted into stages (in order, options anywhere)
// and options (each one's value, or its default), and the stages indexed.
#include "support/archetypes.hpp"
#include "support/catch.hpp"

#include <mpx/pipeline_args.hpp>

using namespace mpx;
using namespace archetypes;

namespace
{
using A = Stage<Vision, CPU<0>>;
using B = Stage<Text, CPU<1>>;
using C = Stage<Block, CPU<2>>;
using List = detail::stages_of<detail::type_list<>, Schedule<GPipe>, A, Microbatches<4>, B, mpx::Batch<archetypes::Batch>, C>::type;
using Indexer = detail::indexer_of<List>::type;
template <std::size_t I>
using at = typename decltype(detail::select<I>(std::declval<const Indexer&>()))::type;
}  // namespace

TEST_CASE("Stages are picked out of the arguments in order, options anywhere", "[pipeline_args][static]")
{
  STATIC_REQUIRE(std::is_same_v<List, detail::type_list<A, B, C>>);
  STATIC_REQUIRE(std::is_same_v<detail::as_tuple<List>::type, std::tuple<A, B, C>>);
  STATIC_REQUIRE(std::is_same_v<at<0>, A>);
  STATIC_REQUIRE(std::is_same_v<at<1>, B>);
  STATIC_REQUIRE(std::is_same_v<at<2>, C>);
}

TEST_CASE("Each option is recognised and read, with its default when absent", "[pipeline_args][static]")
{
  STATIC_REQUIRE(detail::is_option<Schedule<GPipe>>);
  STATIC_REQUIRE(detail::is_option<Microbatches<4>>);
  STATIC_REQUIRE(detail::is_option<mpx::Batch<archetypes::Batch>>);
  STATIC_REQUIRE(!detail::is_option<A>);
  STATIC_REQUIRE(!detail::is_option<GPipe>);  // the tag alone is not the option
  STATIC_REQUIRE(detail::option_value<Microbatches<4>>::value == 4);
  STATIC_REQUIRE(detail::option_value<void>::value == 0);  // absent: the Pipeline takes one per slot
  STATIC_REQUIRE(std::is_same_v<detail::schedule_of_option<Schedule<ZBH1>>::type, ZBH1>);
  STATIC_REQUIRE(std::is_same_v<detail::schedule_of_option<void>::type, OneFOneB>);
  STATIC_REQUIRE(std::is_same_v<detail::batch_of_option<mpx::Batch<archetypes::Batch>>::type, archetypes::Batch>);
  STATIC_REQUIRE(std::is_void_v<detail::batch_of_option<void>::type>);
  STATIC_REQUIRE(!detail::any_placement<OneFOneB>());
  STATIC_REQUIRE(detail::any_placement<UserTable<"F0 B0">>());  // a user table places stages as it likes
}
