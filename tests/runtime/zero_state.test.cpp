// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/runtime/zero_state.hpp in one process: a shard's optimizer state out whole and back. The
// collectives (several replicas) run in tests/runtime/runtime.test.cpp's "[zero]" cases.
#include "support/catch_torch.hpp"

#include <mpx/optim/fused_adamw.hpp>
#include <mpx/runtime/zero_state.hpp>

#include <torch/torch.h>

#include <vector>

namespace
{
mpx::ShardGroup state_replica(int index, int replicas) { return {{}, index, replicas, std::chrono::milliseconds(1000)}; }
}  // namespace

TEST_CASE("One replica: AdamW over the pieces steps the parameters exactly as AdamW over them, and its state goes out whole and back", "[rooms][zero]")
{
  torch::manual_seed(5);
  std::vector<at::Tensor> a{torch::randn({30, 7}), torch::randn({11})}, b{a[0].clone(), a[1].clone()};
  const auto o = torch::optim::AdamWOptions(1e-2).weight_decay(0.1);
  mpx::ZeroShard shard(a, 2, state_replica(0, 1));
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
  mpx::gather_state(shard, sharded, *whole);
  for (std::size_t i = 0; i < a.size(); ++i) {
    const auto got = mpx::detail::moments_of(*whole, a[i]), want = mpx::detail::moments_of(plain, b[i]);
    CHECK(got.step == 3);
    CHECK(torch::equal(got.fields.at("exp_avg"), want.fields.at("exp_avg")));
    CHECK(torch::equal(got.fields.at("exp_avg_sq"), want.fields.at("exp_avg_sq")));
  }
  mpx::FusedAdamW fresh(shard.pieces(), o);
  mpx::scatter_state(shard, *whole, fresh);
  for (const auto& piece : shard.pieces()) {
    const auto got = mpx::detail::moments_of(fresh, piece), want = mpx::detail::moments_of(sharded, piece);
    CHECK(got.step == want.step);
    CHECK(torch::equal(got.fields.at("exp_avg"), want.fields.at("exp_avg")));
  }
}
