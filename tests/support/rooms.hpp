// SPDX-License-Identifier: Apache-2.0
#pragma once
// What the runtime rooms' single-process tests share: a one-stage pipeline of the tiny model on a
// one-rank world, the model the trainer would build, and a plain-LibTorch reference step.
#include "catch_torch.hpp"
#include "one_rank_world.hpp"
#include "tiny_transformer.hpp"

#include <mpx/mpx.hpp>

namespace rooms
{
using P1 = mpx::Pipeline<mpx::Stage<tiny::Model, mpx::CPU<0>, mpx::Layers<0, 6>>, mpx::Microbatches<4>, mpx::Batch<tiny::Batch>>;
using P1Frozen = mpx::Pipeline<mpx::Stage<tiny::Model, mpx::CPU<0>, mpx::Layers<0, 6>, mpx::Frozen>, mpx::Microbatches<4>,
                               mpx::Batch<tiny::Batch>>;
using P2 = mpx::Pipeline<mpx::Stage<tiny::Model, mpx::CPU<0>, mpx::Layers<0, 3>>, mpx::Stage<tiny::Model, mpx::CPU<1>, mpx::Layers<3, 6>>,
                         mpx::Microbatches<4>, mpx::Batch<tiny::Batch>>;
inline const tiny::Config config{};
inline constexpr int rows = 12;

inline tiny::Model make_model()
{
  torch::manual_seed(100);
  return tiny::Model(config, 0, config.layers);
}
inline auto make = [](auto) { return make_model(); };

inline std::vector<tiny::Batch> microbatches(long step) { return mpx::slice_microbatches(tiny::make_batch(config, rows, step, 0, 1), 4); }

/// A store value from text.
inline std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }

inline double rel(double a, double b) { return std::abs(a - b) / std::max(std::abs(b), 1e-12); }
}  // namespace rooms
