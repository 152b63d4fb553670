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

#include <mpx/runtime/profile.hpp>  // mpx::measure_layer_costs

#include <algorithm>  // std::max
#include <vector>     // std::vector

namespace moondream
{

/// The encoder's time per FLOP against the decoder's on this rank (`--costs measured`): an encoder block (forward,
/// and backward when the encoder trains) and a decoder layer after the first (forward and backward: the unit the
/// decoder's pieces are counted in) timed on micro-batch `mb` by `mpx::measure_layer_costs` (one untimed round, the
/// median of `rounds`). `decoder_seconds_per_flop`: the decoder layer's pace, to tell the fastest rank.
inline CostScale measure_scale(const Config& c, const Batch& mb, bool train_vision, int rounds = 3, double* decoder_seconds_per_flop = nullptr)
{
  const int V = c.vision.enc_n_layers, n = c.text.n_layers;
  if (n < 2) throw mpx::config_error("moondream_train: --costs measured times a decoder layer after the first; this config has one: use --costs flops");
  const int pv = V > 1 ? 1 : 0, pt = V + 1;
  const auto flops = piece_costs(c, workload_of({mb}));
  const mpx::ProfileOptions profile{1, rounds};
  auto time = [&](VisionText& piece, const torch::Tensor& x) {
    return mpx::measure_layer_costs({[&](const torch::Tensor& in) { return piece->forward(in, mb); }}, x, profile).front();
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
  const mpx::LayerCost v = time(vision, xv.detach().requires_grad_(train_vision)), t = time(text, hidden.requires_grad_(true));
  const double vf = double(v.forward) * 1e-9, vb = double(v.backward) * 1e-9, tf = double(t.forward) * 1e-9, tb = double(t.backward) * 1e-9;
  auto per_flop = [](double s, std::int64_t f) { return s / double(std::max<std::int64_t>(f, 1)); };
  const double decoder = per_flop(tf + tb, flops[std::size_t(pt)].forward + flops[std::size_t(pt)].backward);
  if (decoder_seconds_per_flop) *decoder_seconds_per_flop = decoder;
  CostScale scale;
  scale.vision_forward = per_flop(vf, flops[std::size_t(pv)].forward) / decoder;
  if (train_vision) scale.vision_backward = per_flop(vb, flops[std::size_t(pv)].backward) / decoder;
  return scale;
}

}  // namespace moondream
