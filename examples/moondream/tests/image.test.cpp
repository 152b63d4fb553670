// SPDX-License-Identifier: Apache-2.0
// Tests for examples/moondream/image.hpp: the tiling table of moondream-spec.md §6.2, crops, patches, stitching,
// Lanczos resampling against Pillow's, normalisation in bf16.
#include "../../../tests/support/catch_torch.hpp"
#include "../image.hpp"

#include <unistd.h>  // getpid

#include <cstdlib>
#include <filesystem>
#include <fstream>

TEST_CASE("Tiling table of the spec", "[moondream][image]")
{
  struct Row
  {
    int h, w, th, tw, crops, gh, gw;
  };
  for (const Row r : {Row{300, 200, 1, 1, 2, 27, 27}, Row{500, 500, 3, 3, 10, 65, 65}, Row{800, 600, 4, 2, 9, 84, 46},
                      Row{1080, 1920, 2, 4, 9, 46, 84}, Row{3000, 500, 8, 1, 9, 160, 27}}) {
    CAPTURE(r.h, r.w);
    const auto [th, tw] = moondream::select_tiling(r.h, r.w);
    CHECK(th == r.th);
    CHECK(tw == r.tw);
    CHECK(1 + th * tw == r.crops);
    CHECK(19 * th + 8 == r.gh);
    CHECK(19 * tw + 8 == r.gw);
  }
  CHECK(moondream::select_tiling(10000, 10000).first * moondream::select_tiling(10000, 10000).second <= 12);
}

TEST_CASE("Crops: the global one first, local windows tile the resized image row-major", "[moondream][image]")
{
  auto img = torch::randint(0, 256, {800, 600, 3}, torch::kByte);
  auto c = moondream::overlap_crops(img);
  CHECK(c.rows == 4);
  CHECK(c.cols == 2);
  CHECK(c.pixels.sizes() == torch::IntArrayRef({9, 3, 378, 378}));
  CHECK(c.pixels.scalar_type() == torch::kByte);
  // neighbouring local crops overlap by 112 pixels: crop (0,0)'s right margin is crop (0,1)'s left margin
  CHECK(torch::equal(c.pixels[1].narrow(2, 266, 112), c.pixels[2].narrow(2, 0, 112)));
  CHECK(torch::equal(c.pixels[1].narrow(1, 266, 112), c.pixels[3].narrow(1, 0, 112)));
  auto small = moondream::overlap_crops(torch::zeros({100, 50, 3}, torch::kByte));
  CHECK(small.pixels.size(0) == 2);  // even the smallest image: global + one local crop
}

TEST_CASE("Normalisation to [-1, 1] and the patch layout", "[moondream][image]")
{
  auto x = moondream::normalize(torch::tensor({0, 255, 128}, torch::kByte));
  CHECK(x[0].item<float>() == -1.0f);
  CHECK(x[1].item<float>() == 1.0f);
  // in bf16, as the reference: 128 / 255 rounds to 0.5019..., - 0.5, / 0.5 -> bf16's nearest of 0.0039
  const auto bf = [](double v) { return torch::tensor(v, torch::kBFloat16); };
  CHECK(x[2].item<float>() == ((bf(128) / 255.0 - 0.5) / 0.5).item<float>());
  CHECK(x.scalar_type() == torch::kFloat);
  auto img = torch::arange(3 * 378 * 378, torch::kFloat).view({1, 3, 378, 378});
  auto p = moondream::patchify(img);
  CHECK(p.sizes() == torch::IntArrayRef({1, 729, 588}));
  // patch (row 2, col 5), channel 1, y 3, x 7: index 1*196 + 3*14 + 7
  const float want = img[0][1][2 * 14 + 3][5 * 14 + 7].item<float>();
  CHECK(p[0][2 * 27 + 5][1 * 196 + 3 * 14 + 7].item<float>() == want);
}

TEST_CASE("Stitching gives a seamless mosaic", "[moondream][image]")
{
  // give every tile the global coordinates of its cells: the mosaic must be exactly the coordinate grid
  const int rows = 2, cols = 3;
  auto tiles = torch::zeros({rows * cols, 27, 27, 2});
  for (int t = 0; t < rows * cols; ++t)
    for (int y = 0; y < 27; ++y)
      for (int x = 0; x < 27; ++x) {
        tiles[t][y][x][0] = (t / cols) * 19 + y;
        tiles[t][y][x][1] = (t % cols) * 19 + x;
      }
  auto s = moondream::reconstruct(tiles, rows, cols);
  CHECK(s.sizes() == torch::IntArrayRef({46, 65, 2}));
  auto ys = torch::arange(46, torch::kFloat).view({46, 1}).expand({46, 65});
  auto xs = torch::arange(65, torch::kFloat).view({1, 65}).expand({46, 65});
  CHECK(torch::equal(s.select(2, 0), ys));
  CHECK(torch::equal(s.select(2, 1), xs));
  CHECK(moondream::pool_tokens(s).sizes() == torch::IntArrayRef({729, 2}));
}

namespace
{
/// Pillow's resizes of generated images (tests/lanczos_reference.py, run now: the test's set-up).
struct LanczosCase
{
  int H, W, h, w;
  at::Tensor in_HWC, want_HWC;
};
std::vector<LanczosCase> pillow_reference()
{
  const std::string out = (std::filesystem::temp_directory_path() / ("moondream_lanczos_" + std::to_string(::getpid()) + ".bin")).string();
  const std::string cmd = MOONDREAM_PYTHON3 " " MOONDREAM_TESTS_DIR "/lanczos_reference.py " + out;
  if (std::system(cmd.c_str()) != 0)
    FAIL("the Pillow reference could not be made (" << cmd << "): install python3-pil (scripts/install-deps.sh does)");
  std::ifstream f(out, std::ios::binary);
  std::vector<LanczosCase> cases;
  std::int32_t dims[4];
  while (f.read(reinterpret_cast<char*>(dims), sizeof dims)) {
    LanczosCase c{dims[0], dims[1], dims[2], dims[3], torch::empty({dims[0], dims[1], 3}, torch::kByte), torch::empty({dims[2], dims[3], 3}, torch::kByte)};
    f.read(reinterpret_cast<char*>(c.in_HWC.data_ptr<std::uint8_t>()), c.in_HWC.numel());
    f.read(reinterpret_cast<char*>(c.want_HWC.data_ptr<std::uint8_t>()), c.want_HWC.numel());
    cases.push_back(std::move(c));
  }
  std::filesystem::remove(out);
  return cases;
}
}  // namespace

TEST_CASE("Crops are resampled with Lanczos as Pillow does: every pixel within one grey level of Pillow's", "[moondream][image][lanczos]")
{
  const auto cases = pillow_reference();
  REQUIRE(cases.size() == 5);
  for (const auto& c : cases) {
    CAPTURE(c.H, c.W, c.h, c.w);
    const auto got = moondream::detail::resize(c.in_HWC.permute({2, 0, 1}), c.h, c.w).permute({1, 2, 0});
    const auto diff = (got.to(torch::kInt) - c.want_HWC.to(torch::kInt)).abs();
    const int worst = diff.max().item<int>();
    const double exact = (diff == 0).to(torch::kDouble).mean().item<double>();
    CAPTURE(worst, exact);
    CHECK(worst <= 1);
    CHECK(exact > 0.999);  // the same fixed-point arithmetic: all but a few pixels identical
  }
}
