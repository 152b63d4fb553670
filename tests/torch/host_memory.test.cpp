// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/torch/host_memory.hpp: after mpx::keep_host_memory(), large CPU tensors come from a cache
// of mapped blocks: the same sizes, allocated and freed step after step, are served from the cache
// (no page faults after the first step), the cache never holds more per size class than was live at once,
// and release_host_memory() gives it back.
#include "support/catch_torch.hpp"

#include <mpx/runtime/launch/env.hpp>  // mpx::read_env: MPX_KEEP_HOST_MEMORY
#include <mpx/torch/host_memory.hpp>

#include <torch/torch.h>

#include <cstdlib>  // setenv, unsetenv
#include <thread>
#include <vector>

#if defined(__unix__)
#include <sys/resource.h>  // getrusage: page faults
#endif

namespace
{
long minor_faults()
{
#if defined(__unix__)
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return long(u.ru_minflt);
#else
  return 0;
#endif
}
}  // namespace

TEST_CASE("HostCache::size_class rounds up by at most an eighth, to whole pages", "[torch][host_memory]")
{
  using mpx::detail::HostCache;
  STATIC_REQUIRE(HostCache::size_class(HostCache::min_bytes) == HostCache::min_bytes);
  STATIC_REQUIRE(HostCache::size_class(48u << 20) == (48u << 20));
  STATIC_REQUIRE(HostCache::size_class((32u << 20) + 1) == (36u << 20));  // a sixteenth of 64 MiB above
  for (std::size_t n = HostCache::min_bytes; n < (std::size_t{1} << 32); n = n * 13 / 10 + 7) {
    const auto c = HostCache::size_class(n);
    CHECK(c >= n);
    CHECK(c % HostCache::page == 0);
    CHECK(double(c) <= double(n) * 1.125 + HostCache::page);
    CHECK(HostCache::size_class(c) == c);  // a class is its own class
  }
}

TEST_CASE("keep_host_memory: large tensors reuse cached blocks instead of fresh mappings", "[torch][host_memory]")
{
#if MPX_HOST_CACHE_AVAILABLE
  ::setenv("MPX_KEEP_HOST_MEMORY", "0", 1);
  CHECK_FALSE(mpx::read_env().keep_host_memory);  // the opt-out, read with the environment: make_world then leaves the allocator
  CHECK(mpx::host_memory_stats().misses == 0);
  ::setenv("MPX_KEEP_HOST_MEMORY", "maybe", 1);
  CHECK_THROWS_WITH(mpx::read_env(), Catch::Contains("MPX_KEEP_HOST_MEMORY") && Catch::Contains("set it to 1"));
  ::unsetenv("MPX_KEEP_HOST_MEMORY");
  REQUIRE(mpx::read_env().keep_host_memory);
  REQUIRE(mpx::keep_host_memory());
  REQUIRE(mpx::keep_host_memory());  // idempotent
  REQUIRE(c10::GetCPUAllocator() == mpx::detail::host_cache());

  const std::int64_t floats = (48 << 20) / 4;  // 48 MiB
  const long pages = (48 << 20) / 4096;
  const auto start = mpx::host_memory_stats();
  long faults_after_first = 0;
  const int cycles = 10;
  for (int cycle = 0; cycle < cycles; ++cycle) {  // what a training step does: the same sizes, allocated and freed
    const long faults_before = minor_faults();
    {
      // two live at once, of slightly different sizes in one class (a shape that varies a little)
      auto a = cycle % 2 ? torch::zeros({floats}) : torch::ones({floats});
      auto b = torch::full({floats - 1000 * (cycle % 3)}, 2.0f);
      CHECK(a.sum().item<double>() == double(cycle % 2 ? 0 : floats));
      CHECK(b.sum().item<double>() == 2.0 * double(b.numel()));
      CHECK(reinterpret_cast<std::uintptr_t>(a.data_ptr()) % 64 == 0);  // LibTorch's alignment holds
      CHECK(mpx::host_memory_stats().live_bytes - start.live_bytes == 2 * (std::size_t(48) << 20));
    }
    if (cycle >= 1) faults_after_first += minor_faults() - faults_before;
  }
  const auto end = mpx::host_memory_stats();
  CHECK(end.misses - start.misses == 2);                 // mapped once per block ever live at once
  CHECK(end.hits - start.hits == 2 * (cycles - 1));      // then reused every cycle
  CHECK(end.cached_bytes - start.cached_bytes == 2 * (std::size_t(48) << 20));
  CHECK(end.live_bytes == start.live_bytes);
  // Reused blocks fault no pages in (a fresh 48 MiB tensor faults 12,288): allow a few pages for the
  // small allocations around them.
  INFO("minor page faults over " << cycles - 1 << " cycles after the first: " << faults_after_first);
  CHECK(faults_after_first < pages / 4);

  // small tensors still go to LibTorch's own allocator
  const auto before_small = mpx::host_memory_stats();
  { auto s = torch::ones({1000}); CHECK(s.sum().item<double>() == 1000.0); }
  CHECK(mpx::host_memory_stats().misses == before_small.misses);
  CHECK(mpx::host_memory_stats().hits == before_small.hits);

  // a tensor that outlives the release keeps its memory; the cache is emptied
  auto kept = torch::ones({floats});
  mpx::release_host_memory();
  CHECK(mpx::host_memory_stats().cached_bytes == 0);
  CHECK(kept.sum().item<double>() == double(floats));
  kept = torch::Tensor();
  CHECK(mpx::host_memory_stats().cached_bytes == (std::size_t(48) << 20));

  // c10's raw interface (c10d's Gloo path and some kernels use it), large and small blocks
  {
    c10::Allocator* alloc = c10::GetCPUAllocator();
    REQUIRE(alloc->raw_deleter() != nullptr);
    const auto before_raw = mpx::host_memory_stats();
    void* big = alloc->raw_allocate(std::size_t(48) << 20);  // the cached block
    void* small = alloc->raw_allocate(100);
    static_cast<char*>(big)[(std::size_t(48) << 20) - 1] = 1;
    static_cast<char*>(small)[99] = 1;
    CHECK(mpx::host_memory_stats().hits == before_raw.hits + 1);
    alloc->raw_deallocate(small);
    alloc->raw_deallocate(big);
    CHECK(mpx::host_memory_stats().cached_bytes == before_raw.cached_bytes);
    CHECK(mpx::host_memory_stats().live_bytes == before_raw.live_bytes);
  }

  // shapes that keep changing: classes that are never used again are not kept beyond the limit
  {
    const auto before = mpx::host_memory_stats();
    const auto limit = mpx::detail::HostCache::limit(before);
    std::size_t sizes = 0;
    for (std::int64_t n = (1 << 20); sizes < 4 * limit; n = n * 9 / 8 + 4096) {  // one class after another
      auto x = torch::empty({n});
      x.fill_(1.0f);
      sizes += std::size_t(n) * 4;
      CHECK(mpx::host_memory_stats().cached_bytes <= limit);
    }
    CHECK(mpx::host_memory_stats().unmapped > before.unmapped);
    CHECK(mpx::detail::HostCache::limit(mpx::host_memory_stats()) >= limit);
  }

  // threads allocating and freeing at once (LibTorch's intra-op and autograd threads do)
  mpx::release_host_memory();
  const auto before_threads = mpx::host_memory_stats();
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([t] {
      for (int i = 0; i < 50; ++i) {
        auto x = torch::full({(1 << 18) + 4096 * ((t + i) % 5)}, float(t));  // 1 MiB, five nearby sizes
        if (x[7].item<float>() != float(t)) std::abort();
      }
    });
  for (auto& th : threads) th.join();
  const auto after_threads = mpx::host_memory_stats();
  CHECK(after_threads.live_bytes == start.live_bytes);
  CHECK(after_threads.misses - before_threads.misses <= 4 * 2);  // at most one block per thread and size class (two)
#else
  CHECK_FALSE(mpx::keep_host_memory());
#endif
}
