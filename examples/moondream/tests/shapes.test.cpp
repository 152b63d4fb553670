// SPDX-License-Identifier: Apache-2.0
// Tests for examples/moondream/shapes.hpp: the generated set is deterministic by seed and index, asks every
// kind, its answers match its pixels, its pictures vary as drawn ones do, its held-out split is disjoint;
// --kinds picks the kinds asked and how often, and a bad spec names the fix.
#include "../../../tests/support/catch_torch.hpp"
#include "../shapes.hpp"

#include <algorithm>
#include <iterator>
#include <map>
#include <set>
#include <string>

TEST_CASE("Generated set: deterministic by seed and index, every kind present, answers match pixels, pictures varied", "[moondream][data]")
{
  using G = moondream::ShapesVqa;
  G a(400, 7, 112), b(400, 7, 112), held(400, 8, 112);
  std::map<std::string, std::set<std::string>> answers;  // kind -> answers seen
  int same_as_heldout = 0, larger = 0, white = 0, noisy = 0, outlined = 0;
  for (std::size_t i = 0; i < 400; ++i) {
    auto s = a.get(i), t = b.get(i);
    CHECK(torch::equal(s.image, t.image));
    CHECK(s.question == t.question);
    if (s.image.sizes() == held.get(i).image.sizes()) same_as_heldout += torch::equal(s.image, held.get(i).image);
    answers[s.kind].insert(s.answer);
    const auto H = s.image.size(0), W = s.image.size(1);
    REQUIRE(s.image.size(2) == 3);
    CHECK((H >= 112 && H <= 224 && W >= 112 && W <= 224));
    larger += H != 112 || W != 112;
    // the background is light in every channel; a shape's pixels (fill or outline) are dark in at least one
    const auto img = s.image.to(torch::kInt);
    const auto shape_px = std::get<0>(img.min(2)) < 150;
    const auto n_shape = shape_px.sum().item<int64_t>();
    CHECK(n_shape > 80);
    const auto corner = img[0][0];
    white += (corner == 255).all().item<bool>();
    noisy += !torch::equal(img[0][0], img[0][1]) || !torch::equal(img[0][1], img[1][0]);
    outlined += (std::get<0>(img.max(2)) < 20).logical_and(shape_px).sum().item<int64_t>() > 0;  // black outline pixels
    if (s.kind == "color" || s.kind == "describe") {  // most shape pixels lie within the jitter of the named colour
      const std::string colour = s.answer.substr(0, s.answer.find(' '));
      const auto c = std::find(std::begin(G::colors), std::end(G::colors), colour) - std::begin(G::colors);
      REQUIRE(c < 4);
      auto near = torch::ones({H, W}, torch::kBool);
      for (int ch = 0; ch < 3; ++ch) near &= (img.select(2, ch) - int(G::rgb[c][ch])).abs() <= G::color_jitter;
      CHECK(near.sum().item<int64_t>() * 2 > n_shape);
    }
    if (s.kind == "position" || s.kind == "describe") {  // every shape pixel lies in the named 45%, clear of the middle
      const bool left = s.answer.ends_with("left");
      const auto side = W * 45 / 100;
      CHECK(shape_px.narrow(1, left ? 0 : W - side, side).sum().item<int64_t>() == n_shape);
    }
  }
  CHECK(same_as_heldout == 0);
  // varied as pictures people draw: a quarter larger, a third on white, a third on noise, some outlined
  CHECK((larger > 60 && larger < 140));
  CHECK((white > 90 && white < 180));
  CHECK((noisy > 90 && noisy < 180));
  CHECK(outlined > 30);
  REQUIRE(answers.size() == 5);
  CHECK(answers["color"] == std::set<std::string>{"red", "green", "blue", "yellow"});
  CHECK(answers["shape"] == std::set<std::string>{"circle", "square", "triangle"});
  CHECK(answers["count"] == std::set<std::string>{"one", "two", "three"});
  CHECK(answers["position"] == std::set<std::string>{"left", "right"});
  CHECK(answers["describe"].size() > 12);  // "<colour> <shape> on the <side>": 24 possible
  CHECK(answers["describe"].count("red circle on the left") + answers["describe"].count("blue square on the right") > 0);
}


TEST_CASE("Generated set: --kinds picks the kinds asked and how often and a bad spec names the fix", "[moondream][data]")
{
  using moondream::kind_weights;
  CHECK(kind_weights("color,shape,position,describe,count") == moondream::ShapesVqa::KindWeights{1, 1, 1, 1, 1});
  CHECK(kind_weights("position=3,color=1") == moondream::ShapesVqa::KindWeights{1, 0, 3, 0, 0});
  moondream::ShapesVqa only(200, 3, 112, kind_weights("position")), mixed(400, 3, 112, kind_weights("position=3,count"));
  std::map<std::string, int> n;
  for (std::size_t i = 0; i < 200; ++i) CHECK(only.get(i).kind == "position");
  for (std::size_t i = 0; i < 400; ++i) ++n[mixed.get(i).kind];
  CHECK(n.size() == 2);
  CHECK((n["position"] > 250 && n["position"] < 350));
  // the default asks as before: a fifth each, the same samples as without weights
  moondream::ShapesVqa plain(50, 9, 112), weighted(50, 9, 112, kind_weights("color,shape,position,describe,count"));
  for (std::size_t i = 0; i < 50; ++i) CHECK(torch::equal(plain.get(i).image, weighted.get(i).image));
  for (const char* spec : {"colour", "position=x", "position=", "color,,shape", "color=0", ""})
    CHECK_THROWS_WITH(kind_weights(spec), Catch::Contains("--kinds") && Catch::Contains("e.g. position=3,color=1"));
}
