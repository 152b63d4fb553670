// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/runtime/microbatches.hpp.
#include "support/rooms.hpp"

TEST_CASE("slice_microbatches slices every field into views along dim 0", "[rooms][microbatches]")
{
  auto batch = tiny::make_batch(rooms::config, 12, 0, 0, 1);
  auto mbs = mpx::slice_microbatches(batch, 4);
  REQUIRE(mbs.size() == 4);
  for (int i = 0; i < 4; ++i) {
    CHECK(mbs[std::size_t(i)].tokens.size(0) == 3);
    CHECK(torch::equal(mbs[std::size_t(i)].labels, batch.labels.narrow(0, 3 * i, 3)));
  }
  CHECK_THROWS_WITH(mpx::slice_microbatches(batch, 5), Catch::Contains("not divisible by the micro-batch count (5)"));
  tiny::Batch ragged{torch::ones({4, 2}), torch::ones({3, 2})};
  CHECK_THROWS_AS(mpx::slice_microbatches(ragged, 1), mpx::config_error);
}

TEST_CASE("to_device moves every defined field and keeps undefined ones", "[rooms][microbatches]")
{
  tiny::Batch b{torch::ones({2}), at::Tensor()};
  auto moved = mpx::to_device(std::vector<tiny::Batch>{b}, torch::kCPU);
  REQUIRE(moved.size() == 1);
  CHECK(moved[0].tokens.device() == torch::Device(torch::kCPU));
  CHECK(!moved[0].labels.defined());
}
