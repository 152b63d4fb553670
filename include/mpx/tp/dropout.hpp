// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file tp/dropout.hpp
/// Dropout under tensor parallelism. Activations inside a sharded region (this rank's heads, MLP columns)
/// differ on every tensor-parallel rank, so their masks must too: there `tp::dropout(x, p, train,
/// Region::sharded)` draws from `sharded_region_generator()`, one per process, seeded per tensor-parallel rank
/// (`seed_sharded_regions`; the runtime does it when it builds a stage, from the run's seed). Outside a sharded
/// region the activations are replicated and must stay equal on every rank: `Region::replicated` draws from
/// the default generator, which every rank of a group seeds alike and advances alike (nothing else draws
/// from it differently on one rank). In a group of one both are plain dropout from the default generator,
/// so the model code runs whole unchanged. Activation checkpointing saves and restores this generator
/// with the default one (runtime/activation_checkpoint.hpp), so a recompute repeats its masks, and a
/// checkpoint saves it beside the rank's generator (runtime/checkpoint/save.hpp).

#include <mpx/tp/group.hpp>  // mpx::tp::current

#include <ATen/CPUGeneratorImpl.h>  // at::CPUGeneratorImpl
#include <torch/torch.h>            // at::Tensor, at::Generator

#include <cstdint>  // std::uint64_t
#include <string>   // std::to_string
#include <mutex>    // std::lock_guard

namespace mpx::tp
{

/// Where a dropout sits: in a sharded region (per-rank masks) or in a replicated one (the same mask on every rank).
enum class Region
{
  sharded,
  replicated,
};

/// The generator a sharded region's dropout draws from (see the file comment).
inline at::Generator& sharded_region_generator()
{
  static at::Generator g = at::make_generator<at::CPUGeneratorImpl>(2718);
  return g;
}

/// Seeds `sharded_region_generator()` for tensor-parallel rank `rank` from the run's `seed`: another stream on
/// every rank of a group, and another than the default generator's.
inline void seed_sharded_regions(std::uint64_t seed, int rank)
{
  at::Generator& g = sharded_region_generator();
  std::lock_guard<std::mutex> lock(g.mutex());
  g.set_current_seed(seed + 2718 + 1000003ull * std::uint64_t(rank + 1));
}

/// Dropout of `x` with probability `p` when `training` (see the file comment): in a sharded region of a group
/// larger than one, the mask is drawn on the CPU from the rank's own generator (and moved to x's device).
inline at::Tensor dropout(const at::Tensor& x, double p, bool training, Region region, const GroupPtr& g = current())
{
  if (!(p >= 0 && p <= 1)) throw config_error("mpx::tp::dropout: the probability " + std::to_string(p) + " is not in [0, 1]");
  if (!training || p == 0) return x;
  if (p == 1) return x * 0;
  if (region == Region::replicated || g->size == 1) return torch::dropout(x, p, true);
  at::Tensor keep = at::empty(x.sizes(), x.options().device(at::kCPU).dtype(at::kFloat));
  keep.bernoulli_(1 - p, sharded_region_generator());  // (the kernel locks the generator itself)
  return x * (keep.to(x.device(), x.scalar_type()) / (1 - p));
}

}  // namespace mpx::tp
