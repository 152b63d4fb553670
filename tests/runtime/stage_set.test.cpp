// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/runtime/stage_set.hpp: a rank builds only its stages, freezes Frozen ones, and a stage's
// forward is the module's forward (under the stage's policies).
#include "support/rooms.hpp"

namespace
{
using P2FrozenBf16 = mpx::Pipeline<mpx::Stage<tiny::Model, mpx::CPU<0>, mpx::Layers<0, 3>>,
                                   mpx::Stage<tiny::Model, mpx::CPU<1>, mpx::Layers<3, 6>, mpx::Frozen, mpx::WireCompression<mpx::BF16>>,
                                   mpx::Microbatches<2>, mpx::Batch<tiny::Batch>>;
}

TEST_CASE("A slot builds only its own stages, visit dispatches a run-time index once", "[rooms][stage_set]")
{
  int built = 0;
  auto make = [&](auto stage) {
    ++built;
    return tiny::Model(rooms::config, stage.value == 0 ? 0 : 3, stage.value == 0 ? 3 : 6);
  };
  mpx::StageSet<P2FrozenBf16> slot1(1, torch::kCPU, make, {});
  CHECK(built == 1);
  CHECK(!slot1.holds(0));
  CHECK(slot1.holds(1));
  CHECK(slot1.parameters(0).empty());
  CHECK(!slot1.parameters(1).empty());
  CHECK(slot1.trainable(1).empty());  // Frozen
  CHECK_THROWS_WITH(slot1.module<0>(), Catch::Contains("stage 0 lives on slot 0") && Catch::Contains("holds(0)"));
  CHECK(slot1.wire_dtype(1) == at::kBFloat16);
  CHECK(slot1.wire_dtype(0) == at::kFloat);
  CHECK(slot1.input_boundary(1).names == std::vector<std::string>{"tensor"});
  int seen = -1, calls = 0;
  mpx::StageSet<P2FrozenBf16>::visit(1, [&](auto i) { seen = decltype(i)::value, ++calls; });
  CHECK(seen == 1);
  CHECK(calls == 1);
}

TEST_CASE("A stage's forward is its module's, its state names parameters and buffers", "[rooms][stage_set]")
{
  mpx::StageSet<rooms::P1> set(0, torch::kCPU, rooms::make, {});
  auto ref = rooms::make_model();
  auto mb = rooms::microbatches(0)[0];
  auto out = set.forward(0, {mb.tokens}, mb);
  REQUIRE(out.size() == 1);
  CHECK(torch::equal(out[0], ref->forward(mb.tokens)));
  auto state = set.state(0);
  CHECK(state.count("tok.weight") == 1);
  CHECK(state.at("tok.weight").data_ptr() == set.module<0>()->tok->weight.data_ptr());  // aliases, no copy
  CHECK(set.trainable(0).size() == set.parameters(0).size());
}

TEST_CASE("checkpoint_all runs the forward through activation checkpointing with the same values", "[rooms][stage_set]")
{
  mpx::TrainOptions o;
  o.checkpoint_all = true;
  mpx::StageSet<rooms::P1> set(0, torch::kCPU, rooms::make, o);
  auto mb = rooms::microbatches(0)[0];
  auto out = set.forward(0, {mb.tokens}, mb);
  CHECK(std::string(out[0].grad_fn()->name()).find("Checkpoint") != std::string::npos);
  CHECK(torch::allclose(out[0], rooms::make_model()->forward(mb.tokens)));
}
