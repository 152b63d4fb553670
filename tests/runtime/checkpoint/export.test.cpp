// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/runtime/checkpoint/export.hpp: a checkpoint's whole weights as one safetensors file.
#include "runtime/checkpoint/checkpoint_test.hpp"

#include <nlohmann/json.hpp>

using namespace checkpoint_test;  // Saved, flip_byte, fs, Contains

TEST_CASE("Any checkpoint exports its whole weights as one file", "[rooms][export]")
{
  const std::string base = test::scratch_dir("mpx-export"), root = base + "/ckpt";
  torch::manual_seed(1);
  torch::nn::Linear a1(6, 4), a2(4, 3);
  auto named = [](torch::nn::Linear& l, const std::string& prefix) {
    return std::map<std::string, at::Tensor>{{prefix + ".weight", l->weight}, {prefix + ".bias", l->bias}};
  };
  mpx::save_local_checkpoint(root, {{named(a1, "first"), nullptr}, {named(a2, "second"), nullptr}}, {5, 1, 0, 0});
  mpx::export_checkpoint_weights(root, base + "/whole.safetensors");
  const auto whole = mpx::load_safetensors(base + "/whole.safetensors");
  CHECK(whole.tensors.size() == 4);
  CHECK(torch::equal(whole.tensors.at("second.weight"), a2->weight));
  CHECK(whole.metadata.at("step") == "5");
  fs::remove_all(base);
}

