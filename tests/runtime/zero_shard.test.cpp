// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/runtime/zero_shard.hpp in one process: the layout of the shards, the gradients in, a step of
// the pieces against a step of the whole parameters, the state out and back. The collectives (several
// replicas) run in tests/runtime/runtime.test.cpp's "[zero]" cases.
#include "support/catch_torch.hpp"

#include <mpx/optim/fused_adamw.hpp>
#include <mpx/runtime/zero_shard.hpp>

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

namespace
{
/// Parameters of 5, 7 and 4 elements (16 in all).
std::vector<at::Tensor> zero_params()
{
  return {torch::arange(0, 5, torch::kFloat), torch::arange(5, 12, torch::kFloat).view({7, 1}), torch::arange(12, 16, torch::kFloat).view({2, 2})};
}
mpx::ShardGroup zero_replica(int index, int replicas) { return {{}, index, replicas, std::chrono::milliseconds(1000)}; }
}  // namespace

TEST_CASE("Three replicas own 6, 6 and 4 of 16 elements laid end to end: each its pieces, views of its parameters' owned parts", "[rooms][zero]")
{
  auto ps = zero_params();
  mpx::ZeroShard r0(ps, 1, zero_replica(0, 3)), r1(ps, 1, zero_replica(1, 3)), r2(ps, 1, zero_replica(2, 3));
  CHECK(r0.total() == 16);
  CHECK((r0.owned() == 6 && r1.owned() == 6 && r2.owned() == 4));
  REQUIRE(r0.pieces().size() == 2);  // all of the first, one element of the second
  CHECK(torch::equal(r0.pieces()[0], torch::arange(0, 5, torch::kFloat)));
  CHECK(torch::equal(r0.pieces()[1], torch::tensor({5.f})));
  REQUIRE(r1.pieces().size() == 1);  // the rest of the second
  CHECK(torch::equal(r1.pieces()[0], torch::arange(6, 12, torch::kFloat)));
  REQUIRE(r2.pieces().size() == 1);
  CHECK(torch::equal(r2.pieces()[0], torch::arange(12, 16, torch::kFloat)));
  // the parameters now view one buffer, end to end: the all-gather writes them in place
  CHECK(static_cast<const float*>(ps[1].data_ptr()) == static_cast<const float*>(ps[0].data_ptr()) + 5);
  CHECK(static_cast<const float*>(ps[2].data_ptr()) == static_cast<const float*>(ps[0].data_ptr()) + 12);
  CHECK(torch::equal(ps[1].view(-1), torch::arange(5, 12, torch::kFloat)));  // their values kept
  using Range = std::pair<std::int64_t, std::int64_t>;  // a parameter's elements in a replica's shard
  CHECK(r1.range_in(ps[1], 0) == Range{0, 1});
  CHECK(r1.range_in(ps[1], 1) == Range{1, 7});
  CHECK(r1.range_in(ps[0], 1) == Range{5, 5});
  CHECK(r1.range_in(ps[2], 2) == Range{0, 4});
  CHECK_THROWS_WITH(r1.range_in(torch::zeros({5}), 0), Catch::Contains("not one of the sharded stage's"));
  CHECK_THROWS_WITH(mpx::ZeroShard(ps, 3, zero_replica(0, 2)), Catch::Contains("1 or 2"));
  const auto w = torch::zeros({4});
  CHECK_THROWS_WITH(mpx::ZeroShard({w, w.view({2, 2})}, 1, zero_replica(0, 2)), Catch::Contains("tied"));
  CHECK_THROWS_WITH(mpx::ZeroShard({torch::zeros({2}), torch::zeros({2}, torch::kDouble)}, 1, zero_replica(0, 2)), Catch::Contains("one dtype"));
}

TEST_CASE("gradients_in: the owned parts of the gradients (level 1 views, level 2 copies and drops the whole gradients) and of the parameters, none stays none", "[rooms][zero]")
{
  for (int level : {1, 2}) {
    auto ps = zero_params();
    mpx::ZeroShard r1(ps, level, zero_replica(1, 3));
    ps[1].detach().add_(100);  // written after the layout: the pieces (views) follow
    ps[1].mutable_grad() = -ps[1].detach().clone();
    const double owned_sq = (-torch::arange(106, 112, torch::kDouble)).pow(2).sum().item<double>();
    CHECK(r1.owned_gradient_sq({ps[0], ps[1]}) == Approx(owned_sq));  // the first has no gradient; of the second, elements 1..6
    CHECK(r1.owned_gradient_sq({ps[0]}) == 0.0);
    r1.gradients_in();
    CHECK(torch::equal(r1.pieces()[0], torch::arange(106, 112, torch::kFloat)));
    CHECK(torch::equal(r1.pieces()[0].grad(), -torch::arange(106, 112, torch::kFloat)));
    CHECK(ps[1].grad().defined() == (level == 1));
    r1.scale_gradients(0.5);  // level 2's gradients are in the shard; level 1's pieces view the whole ones (the clip scales those)
    CHECK(torch::equal(r1.pieces()[0].grad(), (level == 2 ? -0.5 : -1.0) * torch::arange(106, 112, torch::kFloat)));
    if (level == 1) {
      ps[1].grad().mul_(2);
      CHECK(torch::equal(r1.pieces()[0].grad(), -2 * torch::arange(106, 112, torch::kFloat)));  // a view: no copy
    }
    r1.zero();
    CHECK(!r1.pieces()[0].grad().defined());
    ps[1].mutable_grad().reset();
    r1.gradients_in();  // no gradient on the parameter: none on its piece (the optimizer skips it, as it would the parameter)
    CHECK(!r1.pieces()[0].grad().defined());
    ps[1].set_data(torch::zeros({7, 1}));  // new memory: the pieces would step the old one
    CHECK_THROWS_WITH(r1.gradients_in(), Catch::Contains("replaced after the trainer was built") && Catch::Contains("copy_"));
  }
}

TEST_CASE("One replica: AdamW over the pieces steps the parameters exactly as AdamW over them, and its state goes out whole and back", "[rooms][zero]")
{
  torch::manual_seed(5);
  std::vector<at::Tensor> a{torch::randn({30, 7}), torch::randn({11})}, b{a[0].clone(), a[1].clone()};
  const auto o = torch::optim::AdamWOptions(1e-2).weight_decay(0.1);
  mpx::ZeroShard shard(a, 2, zero_replica(0, 1));
  mpx::FusedAdamW sharded(shard.pieces(), o), plain(b, o);
  for (int step = 0; step < 3; ++step) {
    for (std::size_t i = 0; i < a.size(); ++i) {
      a[i].mutable_grad() = torch::sin(a[i].detach() * (step + 1));
      b[i].mutable_grad() = a[i].grad().clone();
    }
    shard.gradients_in();
    sharded.step();
    shard.start_gather(step);
    shard.finish_gather();
    plain.step();
    for (std::size_t i = 0; i < a.size(); ++i) CHECK(torch::equal(a[i], b[i]));
  }
  auto whole = mpx::detail::same_kind(sharded, a);
  shard.gather_state(sharded, *whole);
  for (std::size_t i = 0; i < a.size(); ++i) {
    const auto got = mpx::detail::moments_of(*whole, a[i]), want = mpx::detail::moments_of(plain, b[i]);
    CHECK(got.step == 3);
    CHECK(torch::equal(got.fields.at("exp_avg"), want.fields.at("exp_avg")));
    CHECK(torch::equal(got.fields.at("exp_avg_sq"), want.fields.at("exp_avg_sq")));
  }
  mpx::FusedAdamW fresh(shard.pieces(), o);
  shard.scatter_state(*whole, fresh);
  for (const auto& piece : shard.pieces()) {
    const auto got = mpx::detail::moments_of(fresh, piece), want = mpx::detail::moments_of(sharded, piece);
    CHECK(got.step == want.step);
    CHECK(torch::equal(got.fields.at("exp_avg"), want.fields.at("exp_avg")));
  }
}
