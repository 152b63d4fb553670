// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/runtime/zero_shard.hpp in one process: the layout of the shards, the gradients in, level 3's
// parameters released and gathered back. The collectives (several replicas) run in
// tests/runtime/runtime.test.cpp's "[zero]" cases; the state out and back in zero_state.test.cpp.
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
  CHECK_THROWS_WITH(mpx::ZeroShard(ps, 4, zero_replica(0, 2)), Catch::Contains("1, 2 or 3"));
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

TEST_CASE("Level 3 keeps the shard between gathers: the parameters empty at rest, whole after a gather with the stepped values, and what a forward saved sees them", "[rooms][zero]")
{
  auto ps = zero_params();
  for (auto& p : ps) p.requires_grad_(true);
  mpx::ZeroShard z(ps, 3, zero_replica(0, 1));  // one replica: the shard is everything, the gather a copy
  for (auto& p : ps) CHECK(p.numel() == 0);     // at rest: 0 elements, a read fails by its shape
  REQUIRE(z.pieces().size() == 3);
  CHECK(torch::equal(z.pieces()[1], torch::arange(5, 12, torch::kFloat)));  // the shard holds the values
  CHECK(!z.whole());
  z.start_gather(0);
  z.finish_gather();
  CHECK(z.whole());
  CHECK(torch::equal(ps[1], torch::arange(5, 12, torch::kFloat).view({7, 1})));
  const auto x = torch::ones({3, 2}, torch::requires_grad());
  const auto y = x.matmul(ps[2]).sum();  // saves the weight for x's gradient
  z.release(false);                       // memory gone, shapes kept
  CHECK(ps[2].sizes() == at::IntArrayRef{2, 2});
  CHECK(ps[2].storage().nbytes() == 0);
  z.pieces()[2].detach().add_(1);  // "the optimizer steps the shard"
  z.start_gather(0);
  z.finish_gather();
  CHECK(torch::equal(ps[2], torch::arange(13, 17, torch::kFloat).view({2, 2})));
  y.backward();  // the saved weight is the gathered one again: each row of x's gradient holds W's row sums
  CHECK(torch::equal(x.grad(), torch::tensor({27.f, 31.f}).expand({3, 2})));
  CHECK(torch::equal(ps[2].grad(), torch::full({2, 2}, 3.f)));
  z.gradients_in();
  CHECK(torch::equal(z.pieces()[2].grad(), torch::full({4}, 3.f)));
  CHECK(!ps[2].grad().defined());  // level 3 drops the whole gradients, as level 2
  ps[0].detach().fill_(-1);        // written while whole (a checkpoint's load) ...
  z.keep_owned();                  // ... and kept
  z.release(true);
  CHECK(ps[0].numel() == 0);
  CHECK(torch::equal(z.pieces()[0], torch::full({5}, -1.f)));
}
