// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file examples/moondream/measured_costs.hpp
/// `--costs measured`: the encoder's time per FLOP against the decoder's, timed on this rank (costs.hpp's
/// `CostScale`; speeds.hpp shares it between the ranks). The FLOP counts leave out what runs at memory speed —
/// normalisations, softmax, GELU over the encoder's many patches — so a FLOP cut misjudges the encoder's share.

#include "costs.hpp"  // moondream::CostScale, piece_costs, workload_of
#include "model.hpp"  // moondream::VisionText, Batch

#include <mpx/errors.hpp>  // mpx::config_error

#include <torch/torch.h>

#include <algorithm>  // std::nth_element, std::max
#include <chrono>     // std::chrono
#include <utility>    // std::pair
#include <vector>     // std::vector

namespace moondream
{

/// The encoder's time per FLOP against the decoder's on this rank (`--costs measured`): an encoder block (forward,
/// and backward when the encoder trains) and a decoder layer after the first (forward and backward: the unit the
/// decoder's pieces are counted in) timed on micro-batch `mb`, each repeated for about `budget` (at least 3 times) after
/// one untimed run; the median run counts.
inline CostScale measure_scale(const Config& c, const Batch& mb, bool train_vision, std::chrono::milliseconds budget = std::chrono::milliseconds(500),
                               double* decoder_seconds_per_flop = nullptr)
{
  const int V = c.vision.enc_n_layers, n = c.text.n_layers;
  if (n < 2) throw mpx::config_error("moondream_train: --costs measured times a decoder layer after the first; this config has one: use --costs flops");
  const int pv = V > 1 ? 1 : 0, pt = V + 1;
  const auto flops = piece_costs(c, workload_of({mb}));
  using clock = std::chrono::steady_clock;
  auto seconds = [](clock::time_point a, clock::time_point b) { return std::chrono::duration<double>(b - a).count(); };
  auto median = [](std::vector<double> v) {
    std::nth_element(v.begin(), v.begin() + std::ptrdiff_t(v.size() / 2), v.end());
    return v[v.size() / 2];
  };
  auto time = [&](VisionText& piece, const torch::Tensor& x, bool backward) {  // the median run: another process's burst moves it least
    std::vector<double> f, b;
    const auto t0 = clock::now();
    for (int i = -1;; ++i) {  // i = -1: untimed (allocations, lazy initialisation)
      const auto in = x.detach().requires_grad_(backward);
      const auto s = clock::now();
      const auto out = piece->forward(in, mb);
      const auto m = clock::now();
      if (backward) out.backward(torch::ones_like(out));
      const auto e = clock::now();
      if (i < 0) continue;
      f.push_back(seconds(s, m)), b.push_back(seconds(m, e));
      if (f.size() >= 3 && seconds(t0, e) * 1000 > double(budget.count())) break;
    }
    return std::pair{median(f), median(b)};
  };
  // the same weights on every rank and in every run (a measurement must not depend on a draw), the run's generator
  // left as it was (the model's initialisation draws from it after this)
  auto generator = at::detail::getDefaultCPUGenerator();
  const auto state = generator.get_state();
  struct Restore
  {
    at::Generator& g;
    const at::Tensor& s;
    ~Restore() { g.set_state(s); }
  } restore{generator, state};
  torch::manual_seed(0);
  torch::Tensor xv = mb.crops;
  if (pv > 0) {  // block 1's input: block 0's output
    torch::NoGradGuard ng;
    VisionText first(c, 0, pv);
    xv = first->forward(mb.crops, mb);
  }
  VisionText vision(c, pv, pv + 1), text(c, pt, pt + 1);
  if (!train_vision)
    for (auto& p : vision->parameters()) p.requires_grad_(false);
  const auto hidden = torch::randn({mb.tokens.size(0), c.prefix() + mb.tokens.size(1), c.text.dim});
  const auto [vf, vb] = time(vision, xv, train_vision);
  const auto [tf, tb] = time(text, hidden, true);
  auto per_flop = [](double s, std::int64_t f) { return s / double(std::max<std::int64_t>(f, 1)); };
  const double decoder = per_flop(tf + tb, flops[std::size_t(pt)].forward + flops[std::size_t(pt)].backward);
  if (decoder_seconds_per_flop) *decoder_seconds_per_flop = decoder;
  CostScale scale;
  scale.vision_forward = per_flop(vf, flops[std::size_t(pv)].forward) / decoder;
  if (train_vision) scale.vision_backward = per_flop(vb, flops[std::size_t(pv)].backward) / decoder;
  return scale;
}

}  // namespace moondream
