// SPDX-License-Identifier: Apache-2.0
// Tests for examples/moondream/data.hpp: JSONL/DOCCI loading with errors naming file and line, PNG round trip, supplied PNG/JPEG pictures
// and bad ones (truncated, oversized, not an image), collation.
#include "../../../tests/support/catch_torch.hpp"
#include "../../../tests/support/scratch_dir.hpp"
#include "../data.hpp"
#include "../shapes.hpp"  // pictures to save and load

#include <sys/stat.h>  // mkfifo

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>

namespace
{
std::string data_dir(const std::string& name) { return test::scratch_dir("moondream_data_" + name); }
}  // namespace

TEST_CASE("JSONL and DOCCI lines load, PNG round trip, errors name file and line", "[moondream][data]")
{
  const auto dir = data_dir("jsonl");
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
  CHECK(ok.answer(0) == "red");  // without decoding the image
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

TEST_CASE("Pictures a person supplies: PNG and JPEG decode, a truncated or oversized file or a non-image is an error saying so", "[moondream][data]")
{
  const auto dir = data_dir("supplied");
  const auto picture = moondream::ShapesVqa(1, 1, 96).get(0).image;  // (96, 96, 3)
  moondream::save_png(dir + "/p.png", picture);
  auto c = picture.contiguous();
  REQUIRE(stbi_write_jpg((dir + "/p.jpg").c_str(), 96, 96, 3, c.data_ptr<uint8_t>(), 95));
  CHECK(torch::equal(moondream::load_image(dir + "/p.png"), picture));
  const auto jpg = moondream::load_image(dir + "/p.jpg");
  REQUIRE(jpg.sizes() == picture.sizes());
  CHECK((jpg.to(torch::kFloat) - picture.to(torch::kFloat)).abs().mean().item<float>() < 8);  // lossy, close
  auto truncated = [&](const std::string& name) {
    std::ifstream in(dir + "/" + name, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::ofstream(dir + "/cut_" + name, std::ios::binary) << bytes.substr(0, bytes.size() / 2);
    return dir + "/cut_" + name;
  };
  CHECK_THROWS_WITH(moondream::load_image(truncated("p.jpg")),
                    Catch::Contains("cannot decode image") && Catch::Contains("truncated") && Catch::Contains("save it again"));
  CHECK_THROWS_WITH(moondream::load_image(truncated("p.png")),
                    Catch::Contains("cannot decode image") && Catch::Contains("truncated") && Catch::Contains("save it again"));
  std::ofstream(dir + "/text.jpg") << "plain text, not a picture\n";
  CHECK_THROWS_WITH(moondream::load_image(dir + "/text.jpg"),
                    Catch::Contains("cannot decode image") && Catch::Contains("truncated") && Catch::Contains("save it again"));
  // a 70-byte PNG that declares 12,000 x 12,000 pixels (144 megapixels, within what stb_image itself would decode): refused before any decoding
  std::string huge("\x89PNG\r\n\x1a\n\0\0\0\x0dIHDR\0\0\x2e\xe0\0\0\x2e\xe0\x08\x02\0\0\0\0\0\0\0", 33);
  huge += std::string(37, '\0');
  std::ofstream(dir + "/huge.png", std::ios::binary) << huge;
  CHECK_THROWS_WITH(moondream::load_image(dir + "/huge.png"), Catch::Contains("12000 x 12000 pixels") && Catch::Contains("scale it down"));
}

TEST_CASE("A FIFO as an image or a data file is an error within a second, never a hang", "[moondream][data]")
{
  const auto dir = data_dir("fifo");
  REQUIRE(::mkfifo((dir + "/pipe.png").c_str(), 0600) == 0);
  REQUIRE(::mkfifo((dir + "/pipe.jsonl").c_str(), 0600) == 0);
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH(moondream::load_image(dir + "/pipe.png"), Catch::Contains("is not a regular file"));
  std::ofstream(dir + "/f.jsonl") << R"({"image": "pipe.png", "question": "q", "answer": "a"})" << "\n";
  CHECK_THROWS_WITH(moondream::JsonlVqa(dir + "/f.jsonl"), Catch::Contains("f.jsonl:1") && Catch::Contains("not a regular file"));
  CHECK_THROWS_WITH(moondream::JsonlVqa(dir + "/pipe.jsonl"), Catch::Contains("data file") && Catch::Contains("not a regular file"));
  CHECK_THROWS_WITH(moondream::JsonlVqa(dir), Catch::Contains("not a regular file"));  // a directory
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(1));
}
