// SPDX-License-Identifier: Apache-2.0
// Tests for examples/moondream/image.hpp: the tiling table of moondream-spec.md §6.2, crops, patches, stitching.
#include "../../../tests/support/catch_torch.hpp"
#include "../image.hpp"

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
  auto x = moondream::normalize(torch::tensor({0, 255}, torch::kByte));
  CHECK(x[0].item<float>() == -1.0f);
  CHECK(x[1].item<float>() == 1.0f);
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
