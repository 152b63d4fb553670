// SPDX-License-Identifier: Apache-2.0
// Tests for examples/moondream/lora.hpp: the list of adaptable linears is the model's, --lora-targets' default
// adapts the text decoder's blocks, and a bad pattern is refused before anything is built.
#include "../../../tests/support/catch_torch.hpp"
#include "../lora.hpp"

#include <algorithm>

TEST_CASE("adaptable_linears names every mpx linear of the model, and the default targets the text blocks", "[lora]")
{
  const auto c = moondream::load_config("tiny");
  moondream::Moondream m(c);
  mpx::lora::Options all;  // every mpx linear, by the model's global names
  const auto r = mpx::lora::apply(*m, all, m->named_weights());
  auto want = moondream::adaptable_linears(c);
  auto got = r.adapted;
  std::sort(want.begin(), want.end());
  std::sort(got.begin(), got.end());
  CHECK(got == want);
  CHECK(r.not_adaptable == std::vector<std::string>{"vision.patch_emb"});
  moondream::Options o;
  o.lora = 4;
  moondream::Moondream d(c);
  const auto def = mpx::lora::apply(*d, moondream::lora_options(o), d->named_weights());
  CHECK(def.adapted.size() == std::size_t(4 * c.text.n_layers));
  for (const auto& n : def.adapted) CHECK(n.starts_with("text.blocks."));
}

TEST_CASE("check_lora refuses a pattern that names nothing, the plain patch embedding, or a frozen encoder's linears", "[lora]")
{
  const auto c = moondream::load_config("tiny");
  moondream::Options o;
  o.lora = 4;
  CHECK_NOTHROW(moondream::check_lora(o, c));
  o.lora_targets = "text\\.nothing";
  CHECK_THROWS_WITH(moondream::check_lora(o, c), Catch::Contains("names no linear of config tiny"));
  o.lora_targets = "vision\\..*";
  CHECK_THROWS_WITH(moondream::check_lora(o, c), Catch::Contains("vision.patch_emb, a plain linear"));
  o.lora_targets = "vision\\.blocks\\.0\\.mlp\\.fc1";
  CHECK_THROWS_WITH(moondream::check_lora(o, c), Catch::Contains("but the vision encoder is frozen"));
  o.freeze_vision = "off";
  CHECK_NOTHROW(moondream::check_lora(o, c));
  o.lora_targets = "(";
  CHECK_THROWS_WITH(moondream::check_lora(o, c), Catch::Contains("not a regular expression"));
}
