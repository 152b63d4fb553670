// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file examples/moondream/shapes.hpp
/// The embedded default data of the moondream example: `ShapesVqa`, generated visual questions about
/// shapes (colour, kind, side, description, count), deterministic by seed and index, with a disjoint
/// held-out split; `kind_weights`, the --kinds spec of which kinds it asks and how often.

#include "data.hpp"  // moondream::Dataset, Sample

#include <mpx/errors.hpp>  // mpx::config_error

#include <torch/torch.h>

#include <algorithm>  // std::clamp, std::find, std::all_of
#include <array>      // std::array
#include <cmath>      // std::hypot
#include <random>     // std::mt19937_64
#include <string>     // std::string
#include <utility>    // std::pair
#include <vector>     // std::vector

namespace moondream
{

/// Generated visual questions, sized so that a from-scratch tiny model learns them in minutes on CPU.
/// Kinds, a fifth each unless weighted otherwise: "color" (what colour), "shape" (which kind), "position" (left or right) and
/// "describe" (all three: "red circle on the left") about one shape wholly in the left or right 45%
/// of the picture; "count"
/// (how many, 1–3 shapes of one size). The descriptions teach every attribute from every one-shape
/// picture; the short questions teach which attribute a question asks for.
/// The pictures vary as pictures a person draws do (`background`, `look`): the background (light noise, a plain light
/// tint, white), each shape's colour around its named one, an outline or none, the size of the shapes
/// (a radius of an eighth to a fifth of the picture's shorter side; within a picture one size, so counting needs no
/// size invariance) and, for one picture in four, a larger picture of another aspect ratio (up to twice
/// the crop size: several crops).
class ShapesVqa : public Dataset
{
 public:
  static constexpr const char* colors[] = {"red", "green", "blue", "yellow"};
  static constexpr const char* shapes[] = {"circle", "square", "triangle"};
  static constexpr const char* counts[] = {"one", "two", "three"};
  /// The questions about a picture of one shape, by kind (the first four of `kinds`), and the one about a
  /// counting picture.
  static constexpr const char* one_shape_questions[] = {"What color is the shape?", "What shape is it?",
                                                        "Is the shape on the left or the right?", "Describe the shape."};
  static constexpr const char* count_question = "How many shapes are there?";
  /// The named colours' centres; a drawn shape's colour lies within `color_jitter` of its centre in each channel.
  static constexpr uint8_t rgb[4][3] = {{220, 30, 30}, {30, 160, 40}, {30, 60, 220}, {235, 205, 20}};
  static constexpr int color_jitter = 35;

  /// One drawn shape: centre, radius, kind (index into `shapes`), colour, outline width (0: none).
  struct Shape
  {
    int cx, cy, r, kind, color;
    std::array<uint8_t, 3> fill, outline;
    int outline_px;
  };

  /// How often each kind is asked, in the order color, shape, position, describe, count (`kinds`; a fifth
  /// each by default).
  using KindWeights = std::array<int, 5>;
  static constexpr const char* kinds[] = {"color", "shape", "position", "describe", "count"};

  ShapesVqa(std::size_t n, std::uint64_t seed, int image_size, KindWeights weights = {1, 1, 1, 1, 1})
      : n_(n), seed_(seed), size_(image_size), weights_(weights)
  {
    int total = 0;
    for (int w : weights_) total += std::max(0, w);
    if (total == 0) throw mpx::config_error("moondream: the generated set asks no question kind; give at least one kind a weight above 0");
  }
  std::size_t size() const override { return n_; }

  Sample get(std::size_t i) const override
  {
    std::mt19937_64 rng(seed_ * 0x9E3779B97F4A7C15ull + i * 0xBF58476D1CE4E5B9ull + 1);
    auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };  // [lo, hi]
    const auto noise_seed = rng();
    const int kind = pick_kind(uni);  // the kind of index i as before the pictures varied
    const auto [H, W] = picture_size(uni);
    auto img = background(H, W, uni, noise_seed);
    const int r = uni(std::max(3, std::min(H, W) / 8), std::max(3, std::min(H, W) / 5));
    std::vector<Shape> objs;
    auto place = [&](int n, int x_lo, int x_hi) {  // non-overlapping shapes with centres x in [x_lo, x_hi]
      for (int tries = 0; int(objs.size()) < n && tries < 1000; ++tries) {
        Shape o{uni(std::max(r, x_lo), std::min(W - 1 - r, x_hi)), uni(r, H - 1 - r), r, uni(0, 2), uni(0, 3), {}, {}, 0};
        bool ok = true;
        for (auto& p : objs) ok = ok && (std::hypot(p.cx - o.cx, p.cy - o.cy) > p.r + o.r + 2);
        if (ok) objs.push_back(look(o, uni));
      }
    };
    Sample s;
    s.kind = kinds[kind];
    if (kind == 4) {
      place(uni(1, 3), 0, W);
      s.question = count_question;
      s.answer = counts[objs.size() - 1];
    } else {
      const bool left = uni(0, 1) == 0;
      const int clear = W * 45 / 100;  // the shape lies wholly in the left or right 45%, clear of the middle
      place(1, left ? 0 : W - clear + r, left ? clear - 1 - r : W);
      const std::string color = colors[objs[0].color], shape = shapes[objs[0].kind], side = left ? "left" : "right";
      s.question = one_shape_questions[kind];
      s.answer = kind == 0 ? color : kind == 1 ? shape : kind == 2 ? side : color + " " + shape + " on the " + side;
    }
    for (auto& o : objs) draw(img, o);
    s.image = img;
    return s;
  }

  /// Whether (dx, dy) from a shape's centre lies inside it (radius r; a square's half side is 4/5 r; a
  /// triangle points up, its base at cy + r).
  static bool inside(int kind, int dx, int dy, int r)
  {
    return kind == 0 ? dx * dx + dy * dy <= r * r : kind == 1 ? std::abs(dx) <= r * 4 / 5 && std::abs(dy) <= r * 4 / 5 : 2 * std::abs(dx) <= (dy + r) && dy <= r;
  }

 private:
  /// A question kind drawn by the weights (0 color ... 4 count).
  template <class Uni>
  int pick_kind(Uni& uni) const
  {
    int total = 0;
    for (int w : weights_) total += std::max(0, w);
    int x = uni(0, total - 1), k = 0;
    while (x >= std::max(0, weights_[std::size_t(k)])) x -= std::max(0, weights_[std::size_t(k)]), ++k;
    return k;
  }
  /// Height and width: the crop size, or for one picture in four up to twice it, of another aspect ratio.
  template <class Uni>
  std::pair<int, int> picture_size(Uni& uni) const
  {
    if (uni(0, 3) != 0) return {size_, size_};
    return {uni(size_, 2 * size_), uni(size_, 2 * size_)};
  }
  /// Light noise (as a scan or a photo of paper), a plain light tint, or white: a third each.
  template <class Uni>
  static at::Tensor background(int H, int W, Uni& uni, std::uint64_t noise_seed)
  {
    const int look = uni(0, 2);
    if (look == 0) {
      auto gen = at::make_generator<at::CPUGeneratorImpl>(noise_seed);
      return torch::randint(200, 236, {H, W, 3}, gen, torch::kLong).to(torch::kByte);
    }
    auto img = torch::empty({H, W, 3}, torch::kByte);
    for (int ch = 0; ch < 3; ++ch) img.select(2, ch).fill_(look == 1 ? uni(215, 250) : 255);
    return img;
  }
  /// A shape's fill (its colour's centre, jittered) and, for one in three, an outline of 1–2 pixels (black or a
  /// darker fill).
  template <class Uni>
  static Shape look(Shape o, Uni& uni)
  {
    for (int ch = 0; ch < 3; ++ch) o.fill[std::size_t(ch)] = uint8_t(std::clamp(rgb[o.color][ch] + uni(-color_jitter, color_jitter), 0, 255));
    if (uni(0, 2) == 0) {
      o.outline_px = uni(1, 2);
      const bool black = uni(0, 1) == 0;
      for (int ch = 0; ch < 3; ++ch) o.outline[std::size_t(ch)] = black ? 0 : uint8_t(o.fill[std::size_t(ch)] / 2);
    }
    return o;
  }
  static void draw(at::Tensor& img, const Shape& o)
  {
    auto a = img.accessor<uint8_t, 3>();
    const int H = int(img.size(0)), W = int(img.size(1));
    for (int y = std::max(0, o.cy - o.r); y <= std::min(H - 1, o.cy + o.r); ++y)
      for (int x = std::max(0, o.cx - o.r); x <= std::min(W - 1, o.cx + o.r); ++x) {
        const int dx = x - o.cx, dy = y - o.cy;
        if (!inside(o.kind, dx, dy, o.r)) continue;
        const bool edge = o.outline_px > 0 && !(inside(o.kind, dx, dy - o.outline_px, o.r) && inside(o.kind, dx, dy + o.outline_px, o.r) &&
                                                 inside(o.kind, dx - o.outline_px, dy, o.r) && inside(o.kind, dx + o.outline_px, dy, o.r));
        const auto& c = edge ? o.outline : o.fill;
        for (int ch = 0; ch < 3; ++ch) a[y][x][ch] = c[std::size_t(ch)];
      }
  }

  std::size_t n_;
  std::uint64_t seed_;
  int size_;
  KindWeights weights_;
};

/// --kinds: "color,shape,position,describe,count" (each asked equally often), a subset, or kinds with
/// weights ("position=3,color=1": three position questions to one colour question, no others).
inline ShapesVqa::KindWeights kind_weights(const std::string& spec)
{
  ShapesVqa::KindWeights w{};
  const auto bad = [&](const std::string& why) {
    return mpx::config_error("moondream: --kinds " + spec + ": " + why +
                             "; give kinds among color, shape, position, describe, count, separated by commas, each optionally =weight (e.g. position=3,color=1)");
  };
  std::size_t at = 0;
  while (at <= spec.size()) {
    const auto end = std::min(spec.find(',', at), spec.size());
    const auto item = spec.substr(at, end - at), name = item.substr(0, item.find('='));
    const auto k = std::find(std::begin(ShapesVqa::kinds), std::end(ShapesVqa::kinds), name) - std::begin(ShapesVqa::kinds);
    if (k == 5) throw bad("'" + name + "' is not a kind");
    int weight = 1;
    if (name.size() < item.size()) {
      const auto digits = item.substr(name.size() + 1);
      if (digits.empty() || digits.size() > 4 || digits.find_first_not_of("0123456789") != std::string::npos) throw bad("'" + item + "' has no weight from 0 to 9999");
      weight = std::stoi(digits);
    }
    w[std::size_t(k)] = weight;
    at = end + 1;
  }
  if (std::all_of(w.begin(), w.end(), [](int x) { return x == 0; })) throw bad("no kind has a weight above 0");
  return w;
}

}  // namespace moondream
