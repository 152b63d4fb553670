// SPDX-License-Identifier: Apache-2.0
// Tests for examples/moondream/data.hpp: the generated set (deterministic, balanced, disjoint held-out
// split), JSONL/DOCCI loading with errors naming file and line, PNG round trip, collation.
#include "../../../tests/support/catch_torch.hpp"
#include "../../../tests/support/scratch_dir.hpp"
#include "../data.hpp"

#include <filesystem>
#include <fstream>
#include <map>
#include <set>

namespace
{
std::string tmpdir(const std::string& name) { return test::scratch_dir("moondream_data_" + name); }
}  // namespace

TEST_CASE("Generated set: deterministic by seed and index, every kind present, answers match pixels", "[moondream][data]")
{
  moondream::ShapesVqa a(400, 7, 112), b(400, 7, 112), held(400, 8, 112);
  std::map<std::string, int> kinds;
  std::set<std::string> answers;
  int same_as_heldout = 0;
  for (std::size_t i = 0; i < 400; ++i) {
    auto s = a.get(i), t = b.get(i);
    CHECK(torch::equal(s.image, t.image));
    CHECK(s.question == t.question);
    same_as_heldout += torch::equal(s.image, held.get(i).image);
    ++kinds[s.kind];
    answers.insert(s.answer);
    CHECK(s.image.sizes() == torch::IntArrayRef({112, 112, 3}));
    if (s.kind == "color") {  // the named colour's pixels are there
      static const std::map<std::string, std::array<int, 3>> rgb = {
          {"red", {220, 30, 30}}, {"green", {30, 170, 40}}, {"blue", {30, 60, 220}}, {"yellow", {235, 200, 20}}};
      auto c = rgb.at(s.answer);
      auto hit = (s.image.select(2, 0) == c[0]).logical_and(s.image.select(2, 1) == c[1]).logical_and(s.image.select(2, 2) == c[2]);
      CHECK(hit.sum().item<int64_t>() > 20);
    }
  }
  CHECK(same_as_heldout == 0);
  CHECK(kinds.size() == 4);
  for (auto& [k, n] : kinds) CHECK(n > 60);
  CHECK(answers.size() == 4 + 3 + 4 + 2 - 0);  // red green blue yellow, circle square triangle, one..four, left right
}

TEST_CASE("JSONL and DOCCI lines load; PNG round trip; errors name file and line", "[moondream][data]")
{
  const auto dir = tmpdir("jsonl");
  moondream::ShapesVqa gen(3, 1, 64);
  for (int i = 0; i < 3; ++i) moondream::save_png(dir + "/img" + std::to_string(i) + ".png", gen.get(std::size_t(i)).image);
  {
    std::ofstream f(dir + "/ok.jsonl");
    f << R"({"image": "img0.png", "question": "What color?", "answer": "red"})" << "\n\n";
    f << R"({"image": "img1.png", "description": "A shape on grey."})" << "\n";
  }
  moondream::JsonlVqa ok(dir + "/ok.jsonl");
  REQUIRE(ok.size() == 2);
  CHECK(torch::equal(ok.get(0).image, gen.get(0).image));  // PNG is lossless
  CHECK(ok.get(1).question == "Describe this image.");
  CHECK(ok.get(1).answer == "A shape on grey.");
  auto bad = [&](const std::string& line) {
    std::ofstream(dir + "/bad.jsonl") << R"({"image": "img0.png", "question": "q", "answer": "a"})" << "\n" << line << "\n";
    return dir + "/bad.jsonl";
  };
  CHECK_THROWS_WITH(moondream::JsonlVqa(bad("{not json")), Catch::Contains("bad.jsonl:2") && Catch::Contains("not a JSON object"));
  CHECK_THROWS_WITH(moondream::JsonlVqa(bad(R"({"image": "img0.png", "question": "q"})")), Catch::Contains("bad.jsonl:2") && Catch::Contains("\"answer\""));
  CHECK_THROWS_WITH(moondream::JsonlVqa(bad(R"({"image": "nope.png", "question": "q", "answer": "a"})")),
                    Catch::Contains("bad.jsonl:2") && Catch::Contains("does not exist"));
  std::ofstream(dir + "/garbage.png") << "not an image";
  std::ofstream(dir + "/g.jsonl") << R"({"image": "garbage.png", "question": "q", "answer": "a"})" << "\n";
  moondream::JsonlVqa g(dir + "/g.jsonl");
  CHECK_THROWS_WITH(g.get(0), Catch::Contains("g.jsonl:1") && Catch::Contains("cannot decode image"));
}
