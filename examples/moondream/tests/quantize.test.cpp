// SPDX-License-Identifier: Apache-2.0
// Tests for examples/moondream/quantize.hpp: --base-precision and --qat are checked before anything is
// built; a stage's quantization-aware linears are named globally; a quantized export loads into the model
// (held packed) and answers as the weights' round trip; a file of another config is refused by name.
#include "../../../tests/support/catch_torch.hpp"
#include "../quantize.hpp"

#include <filesystem>

TEST_CASE("check_quantization refuses formats and combinations that do not fit, naming the fix", "[quant]")
{
  moondream::Options o;
  CHECK_NOTHROW(moondream::check_quantization(o));
  o.base_precision = "nf4";
  CHECK_THROWS_WITH(moondream::check_quantization(o), Catch::Contains("add --lora RANK"));
  o.lora = 4;
  CHECK_NOTHROW(moondream::check_quantization(o));
  o.base_precision = "int3";
  CHECK_THROWS_WITH(moondream::check_quantization(o), Catch::Contains("unknown format 'int3'"));
  o.base_precision = "fp32";
  o.qat = "int4";
  CHECK_THROWS_WITH(moondream::check_quantization(o), Catch::Contains("use --base-precision"));
  o.lora = 0;
  CHECK_NOTHROW(moondream::check_quantization(o));
  o.qat = "nf4";
  CHECK_THROWS_WITH(moondream::check_quantization(o), Catch::Contains("takes int4"));
}

TEST_CASE("A --qat model's quantized export loads held packed and answers as the weights' round trip, another config's is refused", "[quant]")
{
  const auto c = moondream::load_config("tiny");
  torch::manual_seed(4);
  moondream::Moondream m(c);
  moondream::Options o;
  o.qat = "int4";
  moondream::apply_quantization(o, *m);
  const auto aware = moondream::quantization_aware(*m);
  CHECK(aware.size() == moondream::adaptable_linears(c).size());  // every mpx linear trains here: all of them
  CHECK(aware.count("text.blocks.0.attn.qkv.weight"));
  const auto dir = std::filesystem::temp_directory_path() / ("moondream-quant-" + std::to_string(::getpid()));
  moondream::write_quantized(o, (dir / "model.safetensors").string(), m->named_weights(), aware);
  moondream::Moondream q(c);
  const auto said = moondream::load_weights(dir.string(), c, *q);
  CHECK(said.find(std::to_string(aware.size()) + " linears in int4") != std::string::npos);
  CHECK(q->named_weights().at("text.blocks.0.mlp.fc1.weight").numel() == 0);  // held packed
  const int S = c.vision.crop_size;
  auto tokens = torch::randint(0, c.text.vocab_size - 1, {1, 6}, torch::kLong);
  const moondream::Batch b{torch::rand({1, 2, 3, S, S}) * 2 - 1, torch::tensor({1L, 1L}).view({1, 2}), tokens, tokens.clone()};
  torch::NoGradGuard ng;
  m->eval(), q->eval();
  // m's forward is the quantization-aware one: the round trip of its weights, which q holds packed
  CHECK(torch::allclose(q->forward(b), m->forward(b), 1e-4, 1e-5));
  moondream::Moondream other(moondream::load_config("tiny-reference"));
  CHECK_THROWS_WITH(moondream::load_weights(dir.string(), moondream::load_config("tiny-reference"), *other), Catch::Contains("do not fit config tiny-reference"));
  std::filesystem::remove_all(dir);
}
