// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/runtime/gradient_buckets.hpp on a one-rank world: buckets of the chosen size, the averages
// written back in place, missing gradients as zeros, frozen parameters left out.
#include "support/rooms.hpp"

TEST_CASE("Buckets all-reduce gradients in groups of about bucket_bytes and write the averages back", "[rooms][gradient_buckets]")
{
  auto w = test::one_rank_world<rooms::P1>();
  auto a = torch::ones({256}).requires_grad_(true), b = torch::ones({256}).requires_grad_(true);
  auto c = torch::ones({8}).requires_grad_(true), frozen = torch::ones({4});
  a.mutable_grad() = torch::full({256}, 2.0);
  b.mutable_grad() = torch::full({256}, 3.0);  // c has no gradient yet
  const void* where = a.grad().data_ptr();
  mpx::GradientBuckets buckets(w.dp, /*replicas=*/2, /*bucket_bytes=*/1024, w.timeout);  // 2: as if another replica sent zeros
  buckets.start({a, b, c, frozen});
  CHECK(buckets.in_flight() == 3);  // a and b each fill 1 KiB; c goes alone
  buckets.finish();
  CHECK(buckets.in_flight() == 0);
  CHECK(a.grad().data_ptr() == where);  // in place
  CHECK(torch::allclose(a.grad(), torch::full({256}, 1.0)));  // one rank's sum / 2
  CHECK(torch::allclose(b.grad(), torch::full({256}, 1.5)));
  CHECK(torch::allclose(c.grad(), torch::zeros({8})));
  CHECK(!frozen.grad().defined());
}

TEST_CASE("With one replica the buckets do nothing", "[rooms][gradient_buckets]")
{
  auto w = test::one_rank_world<rooms::P1>();
  auto a = torch::ones({4}).requires_grad_(true);
  a.mutable_grad() = torch::full({4}, 2.0);
  mpx::GradientBuckets buckets(w.dp, 1, 1024, w.timeout);
  buckets.start({a});
  CHECK(buckets.in_flight() == 0);
  buckets.finish();
  CHECK(torch::allclose(a.grad(), torch::full({4}, 2.0)));
}
