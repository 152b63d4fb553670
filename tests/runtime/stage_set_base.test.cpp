// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/runtime/stage_set_base.hpp: what the pipeline's type says of each stage — held here or
// not, frozen, its optimizer policy, its wire dtype, its input boundary, the pipeline's fingerprint — is
// read through StageSetBase, the stages' tensors by name alias the modules', and a stage held elsewhere
// reads as empty.
#include "support/rooms.hpp"

namespace
{
using PBase = mpx::Pipeline<mpx::Stage<tiny::Model, mpx::CPU<0>, mpx::Layers<0, 3>, mpx::Optimizer<mpx::AdamW8bit>>,
                            mpx::Stage<tiny::Model, mpx::CPU<1>, mpx::Layers<3, 6>, mpx::Frozen, mpx::WireCompression<mpx::FP16>>,
                            mpx::Microbatches<2>, mpx::Batch<tiny::Batch>>;
auto make_base_stage = [](auto stage) { return tiny::Model(rooms::config, stage.value == 0 ? 0 : 3, stage.value == 0 ? 3 : 6); };
}  // namespace

TEST_CASE("StageSetBase reads what the pipeline type says of every stage, held here or not", "[rooms][stage_set_base]")
{
  mpx::StageSet<PBase> slot0(0, torch::kCPU, make_base_stage, {}), slot1(1, torch::kCPU, make_base_stage, {});
  const mpx::StageSetBase& a = slot0;
  const mpx::StageSetBase& b = slot1;
  for (const mpx::StageSetBase* x : {&a, &b}) {
    CHECK(x->num_stages() == 2);
    CHECK(x->fingerprint() == std::to_string(mpx::fingerprint_v<PBase>));
    CHECK(!x->frozen(0));
    CHECK(x->frozen(1));
    CHECK(x->optimizer_kind(0) == mpx::OptimizerKind::adamw8bit);
    CHECK(x->optimizer_kind(1) == mpx::OptimizerKind::adamw);  // none declared (Frozen): the default
    CHECK(x->wire_dtype(0) == at::kFloat);
    CHECK(x->wire_dtype(1) == at::kHalf);
    CHECK(x->input_boundary(1).names == std::vector<std::string>{"tensor"});
    CHECK(!x->global_names(0));
    CHECK(x->shard_suffix().empty());
  }
  CHECK(a.holds(0));
  CHECK(!a.holds(1));
  CHECK(b.holds(1));
  CHECK(b.trainable(1).empty());  // Frozen: its parameters do not train
  CHECK(!b.parameters(1).empty());
  CHECK(b.parameters(1)[0].requires_grad() == false);
}

TEST_CASE("StageSetBase's tensors by name alias the module's, a stage held elsewhere is empty", "[rooms][stage_set_base]")
{
  mpx::StageSet<PBase> slot0(0, torch::kCPU, make_base_stage, {});
  mpx::StageSetBase& base = slot0;
  const auto state = base.state(0);
  REQUIRE(state.count("tok.weight") == 1);
  CHECK(state.at("tok.weight").data_ptr() == slot0.module<0>()->tok->weight.data_ptr());
  CHECK(base.state(1).empty());
  CHECK(base.cuts(0).empty());  // degree 1: nothing cut
  CHECK(base.whole_parameters(1).empty());
  const auto whole = base.whole_parameters(0);  // degree 1: copies
  REQUIRE(whole.size() == base.parameters(0).size());
  CHECK(torch::equal(whole[0], base.parameters(0)[0]));
  CHECK(whole[0].data_ptr() != base.parameters(0)[0].data_ptr());
  base.sum_partial_gradients(1);  // held elsewhere: nothing to do, no error
  CHECK(base.norm_parameters(0).size() == base.parameters(0).size());
}
