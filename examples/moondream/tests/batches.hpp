// SPDX-License-Identifier: Apache-2.0
#pragma once
// A small batch for the moondream tests that time or plan on one: two samples of 1 + 2x1 and 1 + 1x1 crops, 12
// tokens each, the second half supervised (random crops and tokens).
#include "../model.hpp"  // moondream::Batch, Config, ignore_index

#include <torch/torch.h>

namespace moondream::testing
{
inline Batch two_samples(const Config& c)
{
  const int S = c.vision.crop_size;
  auto tokens = torch::randint(0, c.text.vocab_size - 1, {2, 12}, torch::kLong);
  auto targets = tokens.clone();
  targets.narrow(1, 0, 6).fill_(ignore_index);
  return {torch::rand({2, 3, 3, S, S}) * 2 - 1, torch::tensor({2, 1, 1, 1}, torch::kLong).view({2, 2}), tokens, targets};
}
}  // namespace moondream::testing
