// SPDX-License-Identifier: Apache-2.0
// Tests for examples/moondream/weights.hpp: both naming schemes round-trip, dtypes, shards, and the
// strict check listing missing, unexpected and mis-shaped tensors.
#include "../../../tests/support/catch_torch.hpp"
#include "../../../tests/support/scratch_dir.hpp"
#include "../weights.hpp"
#include "../model.hpp"

#include <filesystem>

namespace
{
moondream::Config cfg()
{
  auto c = moondream::load_config("tiny");
  c.text.vocab_size = 300, c.tokenizer.bos_id = c.tokenizer.eos_id = 299;
  return c;
}
std::string weights_dir(const std::string& name) { return test::scratch_dir("moondream_weights_" + name); }
}  // namespace

TEST_CASE("The model's names are exactly the expected new-scheme names and shapes", "[moondream][weights]")
{
  auto c = cfg();
  moondream::Moondream m(c);
  auto shapes = moondream::expected_shapes(c);
  auto w = m->named_weights();
  CHECK(w.size() == shapes.size());
  for (auto& [n, t] : w) {
    INFO(n);
    REQUIRE(shapes.count(n) == 1);
    CHECK(t.sizes().vec() == shapes[n]);
  }
  // md2's counts from the spec (§4): vision 412,987,248 + projection 35,661,824; text 1,418,270,720
  int64_t vision = 0, text = 0;
  for (auto& [n, s] : moondream::expected_shapes(moondream::load_config("md2"))) {
    int64_t k = 1;
    for (auto d : s) k *= d;
    (n.rfind("vision.", 0) == 0 ? vision : text) += k;
  }
  CHECK(vision == 412987248 + 35661824);
  CHECK(text == 1418270720);
}

TEST_CASE("Weights round-trip in both schemes, bf16 and fp32, one file or shards", "[moondream][weights]")
{
  auto c = cfg();
  const auto dir = weights_dir("roundtrip");
  torch::manual_seed(3);
  moondream::Moondream a(c);
  for (bool old : {false, true})
    for (auto dt : {at::kFloat, at::kBFloat16}) {
      const std::string f = dir + "/m.safetensors";
      moondream::write_weights(f, a->named_weights(), dt, old);
      auto w = moondream::read_weights(f, c);
      CHECK(w.scheme == (old ? "old" : "new"));
      moondream::Moondream b(c);
      moondream::assign(w, b->named_weights());
      auto wa = a->named_weights(), wb = b->named_weights();
      for (auto& [n, t] : wa) CHECK(torch::equal(wb.at(n), dt == at::kFloat ? t : t.to(dt).to(at::kFloat)));
    }
  // shards: vision and text in two files of one directory, plus a region tensor and a kv cache to skip
  const auto shards = weights_dir("shards");
  moondream::write_weights(shards + "/vision.safetensors", a->vision->named_weights());
  auto text = a->text->named_weights();
  text["text.blocks.0.kv_cache.k_cache"] = torch::zeros({1});
  text["region.coord_features"] = torch::zeros({1, 128});
  moondream::write_weights(shards + "/text.safetensors", text);
  auto w = moondream::read_weights(shards, c);
  CHECK(w.skipped.size() == 2);
  CHECK(w.tensors.size() == moondream::expected_shapes(c).size());
}

TEST_CASE("The strict check lists missing, unexpected and mis-shaped tensors", "[moondream][weights]")
{
  auto c = cfg();
  const auto dir = weights_dir("strict");
  moondream::Moondream a(c);
  auto w = a->named_weights();
  w.erase("text.blocks.1.mlp.fc1.bias");
  w["text.blocks.9.mlp.fc1.bias"] = torch::zeros({4});
  w["vision.post_ln.weight"] = torch::zeros({7});
  moondream::write_weights(dir + "/bad.safetensors", w);
  try {
    moondream::read_weights(dir + "/bad.safetensors", c);
    FAIL("no error");
  } catch (const mpx::config_error& e) {
    const std::string m = e.what();
    CHECK_THAT(m, Catch::Contains("missing (1)") && Catch::Contains("text.blocks.1.mlp.fc1.bias"));
    CHECK_THAT(m, Catch::Contains("unexpected (1)") && Catch::Contains("text.blocks.9.mlp.fc1.bias"));
    CHECK_THAT(m, Catch::Contains("mis-shaped (1)") && Catch::Contains("vision.post_ln.weight [7]"));
    CHECK_THAT(m, Catch::Contains("--config"));
  }
  // a config of another size is named as the fix
  auto other = moondream::load_config("tiny");
  moondream::write_weights(dir + "/good.safetensors", a->named_weights());
  CHECK_THROWS_WITH(moondream::read_weights(dir + "/good.safetensors", other), Catch::Contains("mis-shaped"));
  CHECK_THROWS_WITH(moondream::read_weights(dir + "/empty-dir-does-not-exist", c), Catch::Contains("cannot"));
}
