// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file examples/moondream/evaluation.hpp
/// Held-out accuracy: greedy answers (up to 16 tokens) of the whole model on held-out questions, exact
/// after trimming, per question kind, beside the best constant answer per kind (the chance level); and, on
/// the generated set, consistency: of the first pictures of one shape, how many the model describes as it
/// answers their colour, shape and side ("describe" = colour + " " + shape + " on the " + side).

#include "data.hpp"       // moondream::Dataset, collate, prompt_ids
#include "model.hpp"      // moondream::Moondream
#include "shapes.hpp"     // moondream::ShapesVqa (consistency)
#include "tokenizer.hpp"  // moondream::Tokenizer

#include <fmt/format.h>  // fmt::format

#include <algorithm>  // std::min, std::max
#include <map>        // std::map
#include <string>     // std::string

namespace moondream
{

/// Held-out accuracy: greedy answers (up to 16 tokens) compared with the reference after trimming.
struct Accuracy
{
  double overall = 0, chance = 0;
  std::map<std::string, std::pair<int, int>> by_kind;  // kind → (correct, total)
  long n = 0;
  int consistent = 0, consistency_n = 0;  // one-shape pictures whose four answers agree, of those asked
};

/// How many one-shape pictures the consistency figure asks all four questions of (four answers each).
inline constexpr int consistency_pictures = 40;

inline std::string trim(std::string s)
{
  const auto b = s.find_first_not_of(" \n\t"), e = s.find_last_not_of(" \n\t");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

inline Accuracy evaluate(Moondream& m, const Dataset& d, const Tokenizer& tok, long n)
{
  Accuracy a;
  m->eval();
  std::map<std::string, std::map<std::string, int>> answers;  // kind → answer → count (for the chance level)
  n = std::min<long>(n, long(d.size()));
  for (long i = 0; i < n; ++i) {
    auto s = d.get(std::size_t(i));
    auto b = collate({s}, tok, m->cfg);
    auto cache = m->encode_image(b.crops, b.tiling);
    auto p = prompt_ids(tok, s.question);
    auto ask = [&](const std::string& question) {
      auto ids = prompt_ids(tok, question);
      auto o = m->generate(cache, std::vector<int64_t>(ids.begin(), ids.end()), 16);
      return trim(tok.decode(std::vector<int>(o.begin(), o.end())));
    };
    if (s.kind != "" && s.kind != "count" && a.consistency_n < consistency_pictures) {  // a generated one-shape picture
      using G = ShapesVqa;
      const std::string color = ask(G::one_shape_questions[0]), shape = ask(G::one_shape_questions[1]), side = ask(G::one_shape_questions[2]);
      a.consistent += ask(G::one_shape_questions[3]) == color + " " + shape + " on the " + side;
      ++a.consistency_n;
    }
    auto out = m->generate(std::move(cache), std::vector<int64_t>(p.begin(), p.end()), 16);
    auto got = trim(tok.decode(std::vector<int>(out.begin(), out.end())));
    const bool ok = got == trim(s.answer);
    auto& k = a.by_kind[s.kind];
    k.first += ok, k.second += 1;
    a.overall += ok;
    ++answers[s.kind][trim(s.answer)];
  }
  a.n = n;
  a.overall /= double(std::max(1L, n));
  for (auto& [kind, counts] : answers) {  // the best constant answer per question kind
    int best = 0;
    for (auto& [ans, c] : counts) best = std::max(best, c);
    a.chance += double(best) / double(std::max(1L, n));
  }
  return a;
}

inline std::string describe(const Accuracy& a)
{
  std::string s = fmt::format("{:.1f}% of {} (best constant answer per question kind: {:.1f}%)", 100 * a.overall, a.n, 100 * a.chance);
  for (auto& [k, v] : a.by_kind)
    if (!k.empty()) s += fmt::format("; {} {}/{}", k, v.first, v.second);
  if (a.consistency_n > 0)
    s += fmt::format("; consistency {}/{} (pictures of one shape described as their colour, shape and side are answered)", a.consistent,
                     a.consistency_n);
  return s;
}

}  // namespace moondream
