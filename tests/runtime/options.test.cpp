// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/runtime/options.hpp: the defaults docs/05_running.md states, and the measured bubble.
#include "support/rooms.hpp"

TEST_CASE("TrainOptions defaults are the documented ones", "[rooms][options]")
{
  const mpx::TrainOptions o;
  CHECK(o.lr(0) == 1e-3);
  CHECK(o.lr(1000) == 1e-3);  // constant
  CHECK(o.lr_scale.empty());
  CHECK(o.weight_decay == 0.0);  // LibTorch's AdamW: 0.01
  CHECK(o.beta1 == 0.9);
  CHECK(o.beta2 == 0.999);
  CHECK(o.eps == 1e-8);
  CHECK(o.momentum == 0.0);
  CHECK(o.clip_norm == 0.0);
  CHECK(o.bucket_bytes == 25u << 20);
  CHECK(!o.trace);
  CHECK(!o.scaler.enabled);
  CHECK(o.scaler.init == 65536.0);
  CHECK(o.scaler.interval == 2000);
  CHECK(!o.checkpoint_all);
  CHECK(!o.checkpoint_blocks);
  CHECK(!o.autocast);
  CHECK(!o.make_optimizer);
  CHECK(!o.before_optimizer);
}

TEST_CASE("StepStats::bubble is the idle fraction of the step's wall time", "[rooms][options]")
{
  mpx::StepStats st;
  CHECK(st.bubble() == 0.0);  // no step yet
  st.seconds = 2.0;
  st.compute_seconds = 1.5;
  CHECK(st.bubble() == Approx(0.25));
}
