// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/runtime/wire/boundary_value.hpp: a boundary value as the wire sees it — its tensors in order,
// their names, their declared shapes.
#include "support/rooms.hpp"

TEST_CASE("flatten / unflatten round-trip a tensor and a Hana struct, field_names names the members", "[rooms][boundary_value]")
{
  auto t = torch::arange(6);
  CHECK(mpx::detail::flatten(t).size() == 1);
  CHECK(torch::equal(mpx::detail::unflatten<at::Tensor>(mpx::detail::flatten(t)), t));
  tiny::Batch b{torch::ones({2, 3}), torch::zeros({2, 3})};
  auto f = mpx::detail::flatten(b);
  REQUIRE(f.size() == 2);
  CHECK(f[0].data_ptr() == b.tokens.data_ptr());
  auto back = mpx::detail::unflatten<tiny::Batch>(f);
  CHECK(back.labels.data_ptr() == b.labels.data_ptr());
  CHECK(mpx::detail::field_names<tiny::Batch>() == std::vector<std::string>{"tokens", "labels"});
  CHECK(mpx::detail::field_names<at::Tensor>() == std::vector<std::string>{"tensor"});
}

namespace
{
struct Declared
{
  BOOST_HANA_DEFINE_STRUCT(Declared, (mpx::Shaped<mpx::any, 729, 64>, embeds), (torch::Tensor, mask), (mpx::Ranked<2>, ids));
};
}  // namespace

TEST_CASE("A boundary may declare its tensors' shapes: field_dims reads them, flatten / unflatten carry them as tensors", "[rooms][boundary_value]")
{
  using Dims = std::vector<mpx::detail::DeclaredDims>;
  // (the comparisons in parentheses: Catch cannot print optionals)
  CHECK((mpx::detail::field_dims<Declared>() == Dims{std::vector<std::int64_t>{-1, 729, 64}, std::nullopt, std::vector<std::int64_t>{-1, -1}}));
  CHECK((mpx::detail::field_dims<at::Tensor>() == Dims{std::nullopt}));
  CHECK((mpx::detail::field_dims<mpx::Ranked<3>>() == Dims{std::vector<std::int64_t>{-1, -1, -1}}));
  static_assert(mpx::Boundary<Declared> && mpx::Boundary<mpx::Ranked<1>> && mpx::DeclaresShape<mpx::Ranked<1>>);
  static_assert(!mpx::DeclaresShape<at::Tensor>);
  Declared d{torch::ones({2, 729, 64}), torch::ones({2}), torch::zeros({2, 5}, torch::kLong)};  // plain tensors convert
  auto f = mpx::detail::flatten(d);
  REQUIRE(f.size() == 3);
  CHECK(f[0].data_ptr() == d.embeds.data_ptr());
  auto back = mpx::detail::unflatten<Declared>(f);
  CHECK(back.ids.data_ptr() == d.ids.data_ptr());
  CHECK(torch::equal(torch::relu(back.embeds), d.embeds));  // a tensor in every other way
  CHECK(mpx::detail::field_names<mpx::Ranked<3>>() == std::vector<std::string>{"tensor"});
  CHECK(mpx::detail::unflatten<mpx::Ranked<1>>({torch::arange(3)}).size(0) == 3);
}
