// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/runtime/zero_gathers.hpp in one process (one replica: a gather is a copy): the plan walked
// over a rank of interleaved 1F1B holding two fully sharded stages. The collectives (several replicas) run
// in tests/runtime/runtime.test.cpp's "[zero]" cases.
#include "support/catch_torch.hpp"

#include <mpx/runtime/zero_gathers.hpp>
#include <mpx/schedule.hpp>

#include <torch/torch.h>

#include <vector>

TEST_CASE("ZeroGathers walks its plan: each stage whole at its computes with its values, the other released while it computes when freed, both released at the end", "[rooms][zero]")
{
  // rank 0 of interleaved 1F1B over 2 ranks and 4 stages holds stages 0 and 2, taking turns between them
  const auto actions = mpx::expand(mpx::Interleaved1F1B::table(mpx::Layout::looped(2, 4, 4)), 0);
  const mpx::ShardGroup one{{}, 0, 1, std::chrono::milliseconds(1000)};
  std::vector<at::Tensor> p0{torch::arange(0, 6, torch::kFloat)}, p2{torch::arange(6, 10, torch::kFloat).view({2, 2})};
  mpx::ZeroShard z0(p0, 3, one), z2(p2, 3, one);
  std::vector<mpx::ZeroShard*> shards{&z0, nullptr, &z2, nullptr};
  for (bool free_between : {false, true}) {
    CAPTURE(free_between);
    mpx::ZeroGathers g(shards, actions, free_between);
    REQUIRE(g.any());
    g.begin(0);
    int computes = 0, other_whole = 0;
    for (std::size_t k = 0; k < actions.size(); ++k) {
      const auto a = actions[k];
      if (!mpx::is_compute(a.op)) continue;
      g.around(k, true);
      auto* mine = shards[a.stage];
      auto* other = shards[a.stage == 0 ? 2 : 0];
      CHECK(mine->whole());
      CHECK(torch::equal(a.stage == 0 ? p0[0] : p2[0].view(-1), torch::arange(a.stage == 0 ? 0 : 6, a.stage == 0 ? 6 : 10, torch::kFloat)));
      ++computes, other_whole += other->whole();
      g.around(k, false);
    }
    CHECK(computes == 16);                        // 2 stages x 4 micro-batches x (F, B)
    CHECK((other_whole == 0) == free_between);    // kept: both whole from their first computes to their last
    CHECK((!z0.whole() && !z2.whole()));          // released after their last computes ...
    CHECK(p0[0].numel() == 6);                    // ... keeping their shapes to the step's end
    z0.release(true), z2.release(true);
    CHECK(p0[0].numel() == 0);
  }
  CHECK_THROWS_WITH(mpx::ZeroGathers({&z0}, actions, false), Catch::Contains("action of stage 2 beyond the stages given"));
  mpx::ZeroGathers none({nullptr, nullptr, nullptr, nullptr}, actions, true);
  CHECK(!none.any());
}
