// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/io/safetensors.hpp: round trips, the format's letter, and every corrupt-file case.
#include "support/catch_torch.hpp"

#include <mpx/io/safetensors.hpp>

#include <sys/stat.h>  // mkfifo

#include <filesystem>
#include <fstream>
#include <random>
#include <nlohmann/json.hpp>

namespace
{
std::string tmp(const std::string& name) { return "/tmp/mpx-st-" + std::to_string(::getpid()) + "-" + name; }

/// Writes a file from a raw header text and data bytes (to forge corrupt files).
void forge(const std::string& path, const std::string& header, const std::string& data, std::uint64_t claimed = ~0ull)
{
  std::ofstream f(path, std::ios::binary);
  const std::uint64_t n = claimed == ~0ull ? header.size() : claimed;
  for (int i = 0; i < 8; ++i) f.put(char((n >> (8 * i)) & 0xff));
  f << header << data;
}

std::string load_error(const std::string& path)
{
  try {
    mpx::load_safetensors(path);
  } catch (const mpx::config_error& e) {
    return e.what();
  }
  return "no error";
}
}  // namespace

TEST_CASE("Round trip of every dtype, 0-dim and empty tensors, and metadata", "[safetensors]")
{
  torch::manual_seed(0);
  std::map<std::string, at::Tensor> t = {
      {"f32", torch::randn({256, 128})},
      {"bf16", torch::randn({77}).to(torch::kBFloat16)},
      {"f16", torch::randn({5, 3}).to(torch::kHalf)},
      {"f64", torch::randn({3}, torch::kDouble)},
      {"i64", torch::arange(10, torch::kLong).view({2, 5})},
      {"i32", torch::arange(7, torch::kInt)},
      {"u8", torch::arange(9, torch::kByte)},
      {"bool", torch::rand({3, 3}) > 0.5},
      {"scalar", torch::scalar_tensor(3.5)},
      {"empty", torch::zeros({0, 4})},
  };
  const auto path = tmp("roundtrip.safetensors");
  mpx::save_safetensors(path, t, {{"format", "pt"}, {"step", "12"}});
  const auto back = mpx::load_safetensors(path);
  REQUIRE(back.tensors.size() == t.size());
  for (auto& [k, v] : t) {
    CAPTURE(k);
    REQUIRE(back.tensors.count(k) == 1);
    CHECK(back.tensors.at(k).scalar_type() == v.scalar_type());
    CHECK(back.tensors.at(k).sizes() == v.sizes());
    CHECK(torch::equal(back.tensors.at(k), v));
  }
  CHECK(back.metadata.at("format") == "pt");
  CHECK(back.metadata.at("step") == "12");
  std::filesystem::remove(path);
}

TEST_CASE("Written files follow the format: dtype names, offsets, alignment", "[safetensors]")
{
  const auto path = tmp("format.safetensors");
  mpx::save_safetensors(path, {{"a", torch::ones({77}, torch::kBFloat16)}, {"b", torch::ones({3}, torch::kDouble)},
                               {"c", torch::ones({2, 2})}});
  std::ifstream f(path, std::ios::binary);
  unsigned char len[8];
  f.read(reinterpret_cast<char*>(len), 8);
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len[i];
  CHECK((8 + n) % 8 == 0);
  std::string header(n, '\0');
  f.read(header.data(), std::streamsize(n));
  const auto h = nlohmann::json::parse(header);
  CHECK(h["a"]["dtype"] == "BF16");
  CHECK(h["b"]["dtype"] == "F64");
  CHECK(h["c"]["dtype"] == "F32");
  CHECK(h["b"]["data_offsets"] == nlohmann::json({0, 24}));   // widest dtype first
  CHECK(h["c"]["data_offsets"] == nlohmann::json({24, 40}));
  CHECK(h["a"]["data_offsets"] == nlohmann::json({40, 194}));
  CHECK(std::filesystem::file_size(path) == 8 + n + 194);
  std::filesystem::remove(path);
}

TEST_CASE("Loaded tensors map the file copy-on-write, saving replaces atomically", "[safetensors]")
{
  const auto path = tmp("cow.safetensors");
  mpx::save_safetensors(path, {{"w", torch::zeros({1024})}});
  auto a = mpx::load_safetensors(path);
  a.tensors["w"].add_(1);  // must not reach the file
  CHECK(mpx::load_safetensors(path).tensors["w"].sum().item<float>() == 0);
  mpx::save_safetensors(path, {{"w", torch::ones({4})}});
  CHECK(mpx::load_safetensors(path).tensors["w"].numel() == 4);
  CHECK(a.tensors["w"].sum().item<float>() == 1024);  // the old mapping stays valid
  for (auto& e : std::filesystem::directory_iterator("/tmp"))
    CHECK(e.path().string().find(path + ".tmp") == std::string::npos);  // no temporary left behind
  std::filesystem::remove(path);
}

TEST_CASE("Every corrupt file is an error naming the file and the rule", "[safetensors]")
{
  const auto p = tmp("bad.safetensors");
  const std::string ok = R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  const std::string data(8, '\0');
  struct Case
  {
    std::string what, header, data, expect;
    std::uint64_t claimed = ~0ull;
  };
  const std::vector<Case> cases = {
      {"header length beyond the file", ok, data, "claims 1000000 bytes", 1000000},
      {"not JSON", "{\"x\": [", data, "the header is not JSON"},
      {"not an object", "[1,2]", data, "not a JSON object"},
      {"missing fields", R"({"x":{"dtype":"F32"}})", data, "lacks dtype, shape or data_offsets"},
      {"unknown dtype", R"({"x":{"dtype":"F8_E4M3","shape":[2],"data_offsets":[0,2]}})", data, "dtype \"F8_E4M3\""},
      {"negative extent", R"({"x":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", data, "negative or non-integer extent"},
      {"offsets past the data", R"({"x":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", data, "spans bytes [0, 16) of a 8-byte"},
      {"reversed offsets", R"({"x":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", data, "spans bytes [8, 0)"},
      {"size and shape disagree", R"({"x":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", data, "holds 8 bytes but its dtype and shape need 12"},
      {"overlap", R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"y":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
       data, "overlap"},
      {"bad metadata", R"({"__metadata__":{"k":1}})", "", "__metadata__[\"k\"] is not a string"},
  };
  for (auto& c : cases) {
    CAPTURE(c.what);
    forge(p, c.header, c.data, c.claimed);
    const std::string e = load_error(p);
    CHECK(e.find(p) != std::string::npos);
    CHECK(e.find(c.expect) != std::string::npos);
  }
  {
    std::ofstream f(p, std::ios::binary);
    f << "abc";
  }
  CHECK(load_error(p).find("fewer than the 8-byte header length") != std::string::npos);
  std::filesystem::remove(p);
  CHECK(load_error(p).find("cannot open") != std::string::npos);
  forge(p, ok, data);
  CHECK(torch::equal(mpx::load_safetensors(p).tensors["x"], torch::zeros({2})));  // the well-formed twin loads
  std::filesystem::remove(p);
}

TEST_CASE("2,000 seeded mutations of a real file: each loads or is a config_error, a FIFO is refused at once", "[safetensors][fuzz]")
{
  const std::string good = tmp("fuzz-seed.safetensors"), bad = tmp("fuzz.safetensors");
  mpx::save_safetensors(good, {{"a", torch::arange(6, torch::kFloat).reshape({2, 3})}, {"b", torch::ones({4}, torch::kLong)},
                               {"c", torch::zeros({0})}}, {{"step", "3"}});
  std::ifstream in(good, std::ios::binary);
  const std::string seed((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::mt19937_64 rng(20261201);
  const char* tokens[] = {"0", "-1", "18446744073709551615", "4611686018427387904", "[", "]", "{", "}", ",", "\"", "F64", "BOOL", "null", "1e300"};
  int loaded = 0, refused = 0;
  for (int k = 0; k < 2000; ++k) {
    std::string m = seed;
    const int kind = int(rng() % 4), n = 1 + int(rng() % 3);
    for (int j = 0; j < n; ++j) {
      const std::size_t at = rng() % m.size();
      if (kind == 0) m[at] = char(m[at] ^ char(1 << (rng() % 8)));
      else if (kind == 1) m[at] = char(rng());
      else if (kind == 2) m.insert(at, tokens[rng() % std::size(tokens)]);
      else m.erase(at, 1 + rng() % 8);
    }
    std::ofstream(bad, std::ios::binary | std::ios::trunc) << m;
    try {
      auto st = mpx::load_safetensors(bad);
      for (auto& [name, t] : st.tensors) (void)t.sum().item<double>();  // every loaded tensor is readable
      ++loaded;
    } catch (const mpx::config_error&) {
      ++refused;
    }
  }
  CHECK(loaded + refused == 2000);
  CHECK(refused > 500);
  const std::string fifo = tmp("fifo.safetensors");
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  CHECK_THROWS_WITH(mpx::load_safetensors(fifo), Catch::Contains("is not a regular file"));
  for (const auto& f : {good, bad, fifo}) std::filesystem::remove(f);
}

TEST_CASE("Regression: a shape whose byte count wraps around 2^64 is refused, not mapped", "[safetensors][fuzz]")
{
  // 2^62 float64 elements need 2^65 bytes: unchecked, the product wraps to 0 and matched an empty range
  forge(tmp("wrap.safetensors"), R"({"x": {"dtype": "F64", "shape": [4611686018427387904], "data_offsets": [0, 0]}})", "");
  CHECK_THAT(load_error(tmp("wrap.safetensors")), Catch::Contains("has a shape too large to address (4611686018427387904 elements of 8 bytes)"));
  std::filesystem::remove(tmp("wrap.safetensors"));
}
