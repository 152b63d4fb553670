// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/runtime/lr.hpp: linear warm-up, then cosine decay to the floor, held there.
#include "support/catch.hpp"

#include <mpx/runtime/lr.hpp>

TEST_CASE("Warm-up then cosine", "[lr]")
{
  mpx::WarmupCosine lr{1.0, 4, 14, 0.1};
  CHECK(lr(0) == Approx(0.25));
  CHECK(lr(3) == Approx(1.0));
  CHECK(lr(4) == Approx(1.0));
  CHECK(lr(9) == Approx(0.1 + 0.9 * 0.5));  // half way through the decay
  CHECK(lr(14) == Approx(0.1));
  CHECK(lr(100) == Approx(0.1));
  mpx::WarmupCosine flat{3e-4, 0, 1, 1.0};
  CHECK(flat(0) == Approx(3e-4));
  CHECK(flat(50) == Approx(3e-4));
}
