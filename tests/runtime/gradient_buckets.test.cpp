// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/runtime/gradient_buckets.hpp on a one-rank world: buckets of the chosen size, the averages
// written back in place, missing gradients as zeros, frozen parameters left out; armed buckets start inside
// the backward, in index order, as their gradients become final.
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
  CHECK(buckets.in_flight() == 2);  // laid out in reverse: c and b fill 1 KiB, a goes alone
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

TEST_CASE("Armed buckets start inside the backward as their gradients become final, in index order", "[rooms][gradient_buckets]")
{
  auto w = test::one_rank_world<rooms::P1>();
  auto c = torch::ones({8}).requires_grad_(true), a = torch::ones({256}).requires_grad_(true), b = torch::ones({256}).requires_grad_(true);
  const auto x = torch::full({256}, 2.0);
  mpx::GradientBuckets buckets(w.dp, /*replicas=*/2, /*bucket_bytes=*/1024, w.timeout);
  // reversed: [b], [a], [c]; c takes no part in the graph, so its bucket can only start after the backward
  auto loss = (a * x).sum() + (b * x * 3).sum();
  buckets.arm({c, a, b});
  CHECK(buckets.in_flight() == 0);
  loss.backward();
  CHECK(buckets.in_flight() == 2);  // b's and a's, from the gradient hooks
  CHECK(buckets.started_in_backward() == 2);
  buckets.start({c, a, b});
  CHECK(buckets.in_flight() == 3);
  buckets.finish();
  CHECK(torch::allclose(a.grad(), torch::full({256}, 1.0)));  // 2 / 2 replicas
  CHECK(torch::allclose(b.grad(), torch::full({256}, 3.0)));
  CHECK(torch::allclose(c.grad(), torch::zeros({8})));
  // the hooks are gone: another backward starts nothing
  (a * x).sum().backward();
  CHECK(buckets.in_flight() == 0);

  // a bucket waits for the ones before it: with a's gradient missing, b's bucket (index 0) starts, a's waits
  auto d = torch::ones({256}).requires_grad_(true);
  mpx::GradientBuckets later(w.dp, 2, 1024, w.timeout);
  later.arm({a, d});  // reversed: [d], [a]
  (a * x).sum().backward();  // a first: bucket 1 is ready but bucket 0 (d) is not
  CHECK(later.in_flight() == 0);
  later.start({a, d});
  CHECK(later.in_flight() == 2);
  later.finish();
}

TEST_CASE("A gradient accumulated twice after its bucket started is an error that names the fix", "[rooms][gradient_buckets]")
{
  auto w = test::one_rank_world<rooms::P1>();
  auto a = torch::ones({256}).requires_grad_(true);
  mpx::GradientBuckets buckets(w.dp, 2, 1024, w.timeout);
  buckets.arm({a});
  (a * 2).sum().backward();
  (a * 2).sum().backward();  // two backwards between arm and start
  CHECK_THROWS_WITH(buckets.start({a}), Catch::Contains("overlap_reduction = false"));
  buckets.finish();
}
