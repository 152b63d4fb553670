// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file torch/host_memory.hpp
/// A caching allocator for large CPU tensors. LibTorch's CPU allocator is plain malloc: with glibc's
/// defaults a tensor of more than a few MB is a fresh `mmap` each time, returned to the kernel when freed,
/// so every new activation, gradient or optimizer temporary of that size is paid again in page faults —
/// on a VM about 10 µs per 4 KiB page. A training step allocates the same sizes every step, so this is
/// pure waste: measured on the 2-core VM (moondream tiny, text stage with its 51,200 × 128 embedding and
/// head), one step of 8 samples took 0.85 s with glibc's defaults and 0.14 s with freed memory kept.
///
/// `mpx::keep_host_memory()` installs `detail::HostCache` as LibTorch's CPU allocator: blocks of 128 KiB
/// and more are mapped once, rounded up to a size class (at most 12.5% larger, so shapes that vary a little
/// share blocks) and, when freed, kept in a list per class for the next tensor of that class — what
/// PyTorch's CUDA caching allocator does for device memory. Smaller blocks go to the allocator that was
/// there before. Why not just tell glibc to keep its heap (`mallopt`, the first version of this header):
/// glibc cannot reuse a freed 48 MiB hole for the next 48 MiB aligned request while a small block after
/// it is parked in its per-thread cache, so its heap grew by one large tensor per step for the first
/// seven steps (measured: 377 MB kept for one 48 MiB tensor); the cache here holds at most, per class,
/// the most blocks ever live at once, and in all at most twice the largest live total (`HostCache::limit`).
///
/// `make_world` calls it unless `WorldOptions::keep_host_memory` is false or the environment sets
/// `MPX_KEEP_HOST_MEMORY=0` (`Env::keep_host_memory`, runtime/launch/env.hpp). `mpx::release_host_memory()` returns the cached blocks to the kernel (after
/// evaluation, say); `mpx::host_memory_stats()` reports what is live and cached.

#include <mpx/linkage.hpp>  // MPX_DECL, MPX_DEFINITIONS
#include <c10/core/Allocator.h>     // c10::Allocator, c10::DataPtr
#include <c10/core/CPUAllocator.h>  // c10::GetCPUAllocator, c10::SetCPUAllocator
#include <c10/util/Exception.h>     // TORCH_CHECK

#include <bit>            // std::bit_width
#include <cstddef>        // std::size_t
#include <cstdint>        // std::uint64_t
#include <cstring>        // std::memcpy
#include <mutex>          // std::mutex
#include <string>         // std::string
#include <unordered_map>  // std::unordered_map
#include <vector>         // std::vector

#if defined(__unix__) || defined(__APPLE__)
#include <sys/mman.h>  // mmap, munmap
#define MPX_HOST_CACHE_AVAILABLE 1
#else
#define MPX_HOST_CACHE_AVAILABLE 0
#endif

namespace mpx
{

/// What the host cache holds (all zero before `keep_host_memory()`).
struct HostMemoryStats
{
  std::size_t live_bytes = 0;    ///< in large blocks that tensors use now (class-rounded)
  std::size_t cached_bytes = 0;  ///< in freed large blocks kept for reuse
  std::size_t peak_bytes = 0;    ///< largest live + cached so far
  std::size_t peak_live_bytes = 0;  ///< largest live so far
  std::uint64_t hits = 0;        ///< large allocations served from the cache
  std::uint64_t misses = 0;      ///< large allocations that mapped fresh memory
  std::uint64_t unmapped = 0;    ///< freed blocks returned to the kernel because the cache was full
};

namespace detail
{

/// The caching CPU allocator behind mpx::keep_host_memory (see the file comment). One instance per
/// process (`host_cache()`), never destroyed: tensors may outlive every static.
class HostCache final : public c10::Allocator
{
public:
  static constexpr std::size_t min_bytes = std::size_t{128} << 10;  ///< below this: the previous allocator
  static constexpr std::size_t page = 4096;
  static constexpr std::size_t min_limit = std::size_t(64) << 20;

  /// The most the cache keeps: twice the largest live total so far (a step's working set, with room for
  /// its phases to use different size classes), at least 64 MiB. Shapes that keep changing (variable
  /// sequence lengths) fill classes that may never be used again: beyond this, freed blocks are unmapped.
  static constexpr std::size_t limit(const HostMemoryStats& s)
  {
    return 2 * s.peak_live_bytes > min_limit ? 2 * s.peak_live_bytes : min_limit;
  }

  /// The size class of a request of n >= min_bytes bytes: n rounded up to a multiple of a sixteenth of
  /// the power of two at or above it (so at most 12.5% more than n, about 4% on average), and to pages.
  static constexpr std::size_t size_class(std::size_t n)
  {
    const std::size_t step_bits = std::bit_width(n - 1) > 4 ? std::bit_width(n - 1) - 4 : 0;
    std::size_t step = std::size_t{1} << step_bits;
    if (step < page) step = page;
    return (n + step - 1) / step * step;
  }

  explicit HostCache(c10::Allocator* small) : small_(small) {}

  // LibTorch 1.x declares allocate const, 2.3 and later non-const; each version overrides its own.
  c10::DataPtr allocate(std::size_t n) const { return allocate_block(n); }
  c10::DataPtr allocate(std::size_t n) { return allocate_block(n); }
  // Pure virtual from LibTorch 2.3 on (an unused extra member before).
  void copy_data(void* dest, const void* src, std::size_t count) const { std::memcpy(dest, src, count); }

  HostMemoryStats stats() const;

  /// Unmaps every cached block; live tensors keep theirs.
  void release() const;

  /// Frees what `allocate` or `raw_allocate` returned: a large block goes back to the cache, anything
  /// else to the previous allocator's raw deleter (LibTorch and c10d use the raw interface too).
  c10::DeleterFnPtr raw_deleter() const override { return small_->raw_deleter() ? &HostCache::free_block : nullptr; }

private:
  c10::DataPtr allocate_block(std::size_t n) const;

  static void free_block(void* data);  // defined below host_cache()

  static void* map(std::size_t bytes);

  void release_locked() const;

  c10::Allocator* small_;
  mutable std::mutex mutex_;
  mutable std::unordered_map<std::size_t, std::vector<void*>> free_;  // class bytes -> cached blocks
  mutable std::unordered_map<void*, std::size_t> live_;               // large block -> class bytes
  mutable HostMemoryStats stats_;
};

/// The process's cache, once installed (nullptr before).
MPX_DECL HostCache*& host_cache();

}  // namespace detail

/// Installs the caching allocator for large CPU tensors (see the file comment). Returns whether it is
/// LibTorch's CPU allocator now: false on a platform without mmap, or when
/// another allocator was installed with a higher priority. Call it once, early (tensors allocated before
/// keep their allocator); calling it again is harmless.
MPX_DECL bool keep_host_memory();

/// Returns the cached large blocks to the kernel (live tensors are untouched).
MPX_DECL void release_host_memory();

/// What the cache holds now (zeros before keep_host_memory()).
MPX_DECL HostMemoryStats host_memory_stats();

}  // namespace mpx

#if MPX_DEFINITIONS
// ---- definitions (compiled once under MPX_SEPARATE_COMPILATION: linkage.hpp) ----

namespace mpx::detail
{

MPX_DECL HostMemoryStats HostCache::stats() const
{
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

MPX_DECL void HostCache::release() const
{
  std::lock_guard<std::mutex> lock(mutex_);
  release_locked();
}

MPX_DECL c10::DataPtr HostCache::allocate_block(std::size_t n) const
{
  if (n < min_bytes) return small_->allocate(n);
  const std::size_t bytes = size_class(n);
  void* data = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = free_.find(bytes);
    if (it != free_.end() && !it->second.empty()) {
      data = it->second.back();
      it->second.pop_back();
      stats_.cached_bytes -= bytes;
      ++stats_.hits;
    } else {
      data = map(bytes);
      if (data == nullptr && stats_.cached_bytes > 0) {  // memory is short: give the cache back first
        release_locked();
        data = map(bytes);
      }
      TORCH_CHECK(data != nullptr, "mpx: out of host memory allocating ", n, " bytes (",
                  stats_.live_bytes, " bytes live in large tensors); reduce the micro-batch or checkpoint "
                  "activations (mpx::Checkpointed)");
      ++stats_.misses;
    }
    live_[data] = bytes;
    stats_.live_bytes += bytes;
    if (stats_.live_bytes > stats_.peak_live_bytes) stats_.peak_live_bytes = stats_.live_bytes;
    if (stats_.live_bytes + stats_.cached_bytes > stats_.peak_bytes)
      stats_.peak_bytes = stats_.live_bytes + stats_.cached_bytes;
  }
  // the context is the pointer itself, so that c10's raw_allocate accepts it
  return {data, data, &HostCache::free_block, c10::Device(c10::DeviceType::CPU)};
}

MPX_DECL void* HostCache::map(std::size_t bytes)
{
#if MPX_HOST_CACHE_AVAILABLE
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? nullptr : p;
#else
  (void)bytes;
  return nullptr;
#endif
}

MPX_DECL void HostCache::release_locked() const
{
  for (auto& [bytes, blocks] : free_) {
#if MPX_HOST_CACHE_AVAILABLE
    for (void* b : blocks) ::munmap(b, bytes);
#endif
    blocks.clear();
  }
  stats_.cached_bytes = 0;
}

MPX_DECL HostCache*& host_cache()
{
  static HostCache* cache = nullptr;
  return cache;
}

MPX_DECL void HostCache::free_block(void* data)
{
  HostCache& self = *host_cache();
  {
    std::lock_guard<std::mutex> lock(self.mutex_);
    auto it = self.live_.find(data);
    if (it != self.live_.end()) {
      const std::size_t bytes = it->second;
      self.live_.erase(it);
      self.stats_.live_bytes -= bytes;
      if (self.stats_.cached_bytes + bytes > limit(self.stats_)) {
#if MPX_HOST_CACHE_AVAILABLE
        ::munmap(data, bytes);
#endif
        ++self.stats_.unmapped;
        return;
      }
      self.stats_.cached_bytes += bytes;
      self.free_[bytes].push_back(data);
      return;
    }
  }
  self.small_->raw_deleter()(data);  // a small block that came through raw_allocate
}

}  // namespace mpx::detail

namespace mpx
{

MPX_DECL bool keep_host_memory()
{
#if MPX_HOST_CACHE_AVAILABLE
  static std::once_flag once;
  std::call_once(once, [] {
    detail::host_cache() = new detail::HostCache(c10::GetCPUAllocator());  // never deleted: see HostCache
    c10::SetCPUAllocator(detail::host_cache(), /*priority=*/1);  // above LibTorch's default (0)
  });
  return c10::GetCPUAllocator() == detail::host_cache();
#else
  return false;
#endif
}

MPX_DECL void release_host_memory()
{
  if (auto* cache = detail::host_cache()) cache->release();
}

MPX_DECL HostMemoryStats host_memory_stats()
{
  auto* cache = detail::host_cache();
  return cache ? cache->stats() : HostMemoryStats{};
}

}  // namespace mpx
#endif  // MPX_DEFINITIONS
