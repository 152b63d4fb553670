// SPDX-License-Identifier: Apache-2.0
#pragma once
// What the checkpoint rooms' tests share: a one-stage pipeline's stage and optimizer after one step (so it
// has optimizer state), and byte-level damage to a file.
#include "support/rooms.hpp"
#include "support/scratch_dir.hpp"

#include <filesystem>
#include <fstream>

namespace checkpoint_test
{
namespace fs = std::filesystem;
using Catch::Contains;

/// A stage, its optimizer after one step (so it has state).
struct Saved
{
  mpx::StageSet<rooms::P1> stages{0, torch::kCPU, rooms::make, {}};
  mpx::StageOptimizers optimizers{stages, {}};
  Saved()
  {
    for (auto& p : stages.parameters(0)) p.mutable_grad() = torch::ones_like(p);
    optimizers.step(1e-2);
  }
};

inline void flip_byte(const std::string& f, std::uintmax_t at)
{
  std::fstream io(f, std::ios::in | std::ios::out | std::ios::binary);
  io.seekg(std::streamoff(at));
  char c = 0;
  io.get(c);
  io.seekp(std::streamoff(at));
  io.put(char(c ^ 0x10));
}
}  // namespace checkpoint_test
