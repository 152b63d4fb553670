// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file runtime/sampler.hpp
/// `DistributedSampler`: the sample indices one replica reads in one epoch, with PyTorch's semantics —
/// an epoch-seeded shuffle shared by all replicas, padded (by wrapping) to a multiple of the replica
/// count, then every replica takes every `replicas`-th index starting at its own.

#include <mpx/errors.hpp>  // mpx::config_error

#include <cstdint>    // std::uint64_t
#include <numeric>    // std::iota
#include <random>     // std::mt19937_64
#include <string>     // std::to_string
#include <vector>     // std::vector

namespace mpx
{

struct DistributedSampler
{
  std::size_t size = 0;  ///< samples in the data set
  int replicas = 1;
  int replica = 0;
  bool shuffle = true;
  std::uint64_t seed = 0;

  /// Samples per replica per epoch.
  std::size_t per_replica() const { return (size + std::size_t(replicas) - 1) / std::size_t(replicas); }

  /// This replica's indices for `epoch`.
  std::vector<std::size_t> indices(std::uint64_t epoch) const
  {
    if (size == 0) throw config_error("mpx::DistributedSampler: the data set is empty; give it at least one sample");
    if (replica < 0 || replica >= replicas)
      throw config_error("mpx::DistributedSampler: replica " + std::to_string(replica) + " out of [0, " + std::to_string(replicas) + ")");
    std::vector<std::size_t> all(size);
    std::iota(all.begin(), all.end(), std::size_t{0});
    if (shuffle) {
      std::mt19937_64 g(seed * 0x9E3779B97F4A7C15ull + epoch);
      for (std::size_t i = size; i > 1; --i) std::swap(all[i - 1], all[g() % i]);  // Fisher-Yates, portable
    }
    const std::size_t total = per_replica() * std::size_t(replicas);
    for (std::size_t i = size; i < total; ++i) all.push_back(all[i - size]);
    std::vector<std::size_t> mine;
    for (std::size_t i = std::size_t(replica); i < total; i += std::size_t(replicas)) mine.push_back(all[i]);
    return mine;
  }
};

}  // namespace mpx
