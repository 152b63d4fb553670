// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/runtime/checkpoint/local.hpp: a one-process model's checkpoint loads back by name, however its
// parts are grouped; a missing tensor and a hostile manifest are named errors.
#include "runtime/checkpoint/checkpoint_test.hpp"

#include <nlohmann/json.hpp>

using namespace checkpoint_test;  // Saved, flip_byte, fs, Contains

TEST_CASE("A one-process model's checkpoint loads back by name", "[rooms][local]")
{
  const std::string base = test::scratch_dir("mpx-state-local"), root = base + "/ckpt";
  auto model = [](int seed) {
    torch::manual_seed(seed);
    return std::pair{torch::nn::Linear(6, 4), torch::nn::Linear(4, 3)};
  };
  auto named = [](torch::nn::Linear& l, const std::string& prefix) {
    return std::map<std::string, at::Tensor>{{prefix + ".weight", l->weight}, {prefix + ".bias", l->bias}};
  };
  auto [a1, a2] = model(1);
  torch::optim::AdamW opt(std::vector<at::Tensor>{a2->weight, a2->bias}, torch::optim::AdamWOptions(1e-2));
  a2(a1(torch::ones({2, 6}))).sum().backward();
  opt.step();
  const std::vector<mpx::LocalPart> saved{{named(a1, "first"), nullptr}, {named(a2, "second"), &opt}};
  mpx::save_local_checkpoint(root, saved, {5, 1, 0, 0});

  auto [b1, b2] = model(2);
  torch::optim::AdamW opt_b(std::vector<at::Tensor>{b2->weight, b2->bias}, torch::optim::AdamWOptions(1e-2));
  CHECK(mpx::load_local_checkpoint(root, {{named(b1, "first"), nullptr}, {named(b2, "second"), &opt_b}}).step == 5);
  CHECK(torch::equal(a1->weight, b1->weight));
  CHECK(torch::equal(a2->bias, b2->bias));
  auto moments = mpx::named_optimizer_state(opt_b, named(b2, "second"));
  REQUIRE(moments);
  CHECK(torch::equal(moments->at("second.weight/exp_avg"), mpx::named_optimizer_state(opt, named(a2, "second"))->at("second.weight/exp_avg")));

  // the parts may be grouped otherwise (one part holding both): found by name in whichever file
  auto [c1, c2] = model(3);
  auto both = named(c1, "first");
  both.merge(named(c2, "second"));
  CHECK(mpx::load_local_checkpoint(root, {{both, nullptr}}).step == 5);
  CHECK(torch::equal(a2->weight, c2->weight));
  // a model without one of the saved tensors: the verdict names it
  CHECK_THROWS_WITH(mpx::load_local_checkpoint(root, {{named(c1, "first"), nullptr}}), Contains("no stage of this pipeline has second.bias second.weight"));

  {  // a manifest whose split record is hostile (a negative dimension): garbled, not a crash
    const std::string mf = root + "/step-00000005/manifest.json";
    std::ifstream in(mf);
    auto j = nlohmann::json::parse(in);
    in.close();
    const std::string text = j.dump();
    j["files"]["stage1.safetensors"]["splits"]["second.weight"] = {{"dim", -3}, {"parts", {1}}};
    std::ofstream(mf) << j.dump();
    CHECK_THROWS_WITH(mpx::load_local_checkpoint(root, saved), Contains("manifest.json is garbled") && Contains("second.weight"));
    std::ofstream(mf) << text;
  }
  fs::remove_all(base);
}

TEST_CASE("A trainable-only checkpoint holds the trained tensors alone, and loads only as one", "[rooms][local][lora]")
{
  const std::string base = test::scratch_dir("mpx-state-trainable"), root = base + "/ckpt";
  // a frozen base and one trained tensor (a LoRA adapter's place), with its optimizer
  auto part = [](int seed) {
    torch::manual_seed(seed);
    std::map<std::string, at::Tensor> t{{"base.weight", torch::randn({4, 6})}, {"base.lora_b", torch::randn({4, 2}).requires_grad_(true)}};
    return t;
  };
  auto a = part(1);
  torch::optim::AdamW opt(std::vector<at::Tensor>{a.at("base.lora_b")}, torch::optim::AdamWOptions(1e-2));
  a.at("base.lora_b").sum().backward();
  opt.step();
  mpx::CheckpointOptions only;
  only.trainable_only = true;
  mpx::save_local_checkpoint(root, {{a, &opt}}, {3, 1, 0, 0}, only);
  const auto dir = root + "/step-00000003";
  const auto file = mpx::load_safetensors(dir + "/stage0.safetensors");
  CHECK(file.tensors.size() == 1);
  CHECK(file.tensors.count("base.lora_b") == 1);
  CHECK(mpx::load_safetensors(dir + "/stage0.optimizer.safetensors").tensors.count("base.lora_b/exp_avg") == 1);
  CHECK(nlohmann::json::parse(std::ifstream(dir + "/manifest.json")).at("trainable_only") == true);

  // loads as trainable-only: the trained tensor and its moments; the base is the program's (left as it is)
  auto b = part(2);
  const auto frozen = b.at("base.weight").clone();
  torch::optim::AdamW opt_b(std::vector<at::Tensor>{b.at("base.lora_b")}, torch::optim::AdamWOptions(1e-2));
  CHECK(mpx::load_local_checkpoint(root, {{b, &opt_b}}, {}, only).step == 3);
  CHECK(torch::equal(b.at("base.lora_b"), a.at("base.lora_b")));
  CHECK(torch::equal(b.at("base.weight"), frozen));
  auto trained = [](std::map<std::string, at::Tensor>& t) { return std::map<std::string, at::Tensor>{{"base.lora_b", t.at("base.lora_b")}}; };
  CHECK(torch::equal(mpx::named_optimizer_state(opt_b, trained(b))->at("base.lora_b/exp_avg"),
                     mpx::named_optimizer_state(opt, trained(a))->at("base.lora_b/exp_avg")));
  // either kind loaded as the other stops, naming the option; nothing is changed
  auto c = part(4);
  const auto before = c.at("base.lora_b").clone();
  CHECK_THROWS_WITH(mpx::load_local_checkpoint(root, {{c, nullptr}}), Contains("load it with CheckpointOptions::trainable_only"));
  CHECK(torch::equal(c.at("base.lora_b"), before));
  const std::string whole = base + "/whole";
  mpx::save_local_checkpoint(whole, {{a, &opt}}, {3, 1, 0, 0});
  CHECK_THROWS_WITH(mpx::load_local_checkpoint(whole, {{c, nullptr}}, {}, only), Contains("holds every parameter; load it without"));
  fs::remove_all(base);
}
