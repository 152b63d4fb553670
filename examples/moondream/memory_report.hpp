// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file examples/moondream/memory_report.hpp
/// `moondream_train --memory-report`: what this rank holds, measured with malloc's statistics (bytes in use:
/// run with MPX_KEEP_HOST_MEMORY=0, so that every tensor comes from malloc at its own size) beside the
/// formula's bytes — weights (what building the trainer added), gradients at the optimizer's entry (bytes in
/// use in the `before_optimizer` hook less those once the step returned, the median over the steps after the
/// first; the whole gradients, before a ZeRO-2 or -3 stage keeps its shard of them), optimizer state (what
/// the first step added) and the peak resident set; under ZeRO-3 the weights kept between steps are the
/// shard. benchmarks/zero/moondream_memory.sh runs it.

#include <malloc.h>        // mallinfo2
#include <sys/resource.h>  // getrusage

#include <mpx/torch/host_memory.hpp>  // mpx::host_memory_stats

#include <fmt/format.h>  // fmt::format
#include <torch/torch.h>  // torch::nn::Module

#include <algorithm>  // std::sort
#include <cstdint>    // std::int64_t
#include <string>     // std::string
#include <utility>    // std::index_sequence
#include <vector>     // std::vector

namespace moondream
{

class MemoryReport
{
 public:
  static std::int64_t in_use()
  {
    const struct mallinfo2 mi = ::mallinfo2();
    return std::int64_t(mi.uordblks + mi.hblkhd + mpx::host_memory_stats().live_bytes);
  }

  void before_build() { before_build_ = in_use(); }
  void built() { built_ = in_use(); }
  /// In the `before_optimizer` hook: its first call of a step counts.
  void at_optimizer()
  {
    if (hook_ < 0) hook_ = in_use();
  }
  /// After `Trainer::step` returned, its micro-batches still held (as they were in the hook).
  void step_returned()
  {
    if (hook_ >= 0 && steps_++ > 0) grads_.push_back(hook_ - in_use());
    hook_ = -1;
  }
  /// Once the step's micro-batches are gone: the first time, what the first step added is the state.
  void batch_dropped()
  {
    if (after_first_ < 0) after_first_ = in_use();
  }

  /// One line: each figure, then the formula's. `weight_bytes`: this rank's stages' weights (4 bytes per fp32
  /// element; a base held packed, --base-precision, its codes and scales); `trainable` and `stepped` count
  /// elements (fp32): those that train, those its optimizers step (its ZeRO shards');
  /// `eight_bit`: AdamW8bit's state (2 bytes per element and a float per 256-block; the quantizers'
  /// lookup tables once per process), else fp32 AdamW's 8 bytes.
  std::string line(int rank, std::int64_t weight_bytes, std::int64_t trainable, std::int64_t stepped, bool eight_bit) const
  {
    const double mib = 1024.0 * 1024.0;
    std::vector<std::int64_t> g = grads_;
    std::sort(g.begin(), g.end());
    const std::int64_t grads = g.empty() ? 0 : g[g.size() / 2];
    const std::int64_t state_formula = eight_bit ? 2 * stepped + 4 * 2 * ((stepped + 255) / 256) + 2 * (65536 * 2 + 256 * 4) : 8 * stepped;
    struct rusage ru{};
    ::getrusage(RUSAGE_SELF, &ru);
    auto pct = [](std::int64_t a, std::int64_t b) { return b > 0 ? 100.0 * double(a - b) / double(b) : 0.0; };
    return fmt::format("memory rank {}: weights {:.2f} MiB (formula {:.2f}, {:+.1f}%), gradients {:.2f} MiB (formula {:.2f}, {:+.1f}%), "
                       "optimizer state {:.2f} MiB (formula {:.2f}, {:+.1f}%), peak resident {:.1f} MiB\n",
                       rank, double(built_ - before_build_) / mib, double(weight_bytes) / mib, pct(built_ - before_build_, weight_bytes),
                       double(grads) / mib, double(4 * trainable) / mib, pct(grads, 4 * trainable), double(after_first_ - built_) / mib,
                       double(state_formula) / mib, pct(after_first_ - built_, state_formula), double(ru.ru_maxrss) / 1024.0);
  }

 private:
  std::int64_t before_build_ = 0, built_ = 0, hook_ = -1, after_first_ = -1;
  long steps_ = 0;
  std::vector<std::int64_t> grads_;
};

/// `mem`'s line for this rank of pipeline `P`: its stages' elements counted from their modules (a collective:
/// ZeRO-3's weights gathered to be counted; `weights_sharded`: what it keeps of them is the stepped shard).
template <class P, class Trainer>
std::string report_memory(Trainer& t, const MemoryReport& mem, int rank, bool eight_bit, bool weights_sharded = false)
{
  t.gather_parameters();
  std::int64_t weight_bytes = 0, trainable = 0, stepped = 0;
  auto count = [&](int s, const torch::nn::Module& m) {
    for (const auto& p : m.parameters()) weight_bytes += p.numel() * std::int64_t(p.element_size()), trainable += p.requires_grad() ? p.numel() : 0;
    for (const auto& b : m.named_buffers())  // a packed base's codes and scales (tp/quantized.hpp)
      if (b.key().find("weight_codes") != std::string::npos || b.key().find("weight_scale") != std::string::npos)
        weight_bytes += b.value().numel() * std::int64_t(b.value().element_size());
    stepped += t.stepped_elements(s);
  };
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    ((t.holds(int(I)) ? (count(int(I), *t.template module<int(I)>()), 0) : 0), ...);
  }(std::make_index_sequence<P::num_stages>{});
  return mem.line(rank, weights_sharded ? weight_bytes - 4 * (trainable - stepped) : weight_bytes, trainable, stepped, eight_bit);
}

}  // namespace moondream
