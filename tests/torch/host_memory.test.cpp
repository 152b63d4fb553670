// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/torch/host_memory.hpp: after mpx::keep_host_memory(), a large CPU tensor is served from
// malloc's heap (no fresh mapping) and its memory stays with the process when it is freed, so the next
// tensor of that size costs no page faults.
#include "support/catch_torch.hpp"

#include <mpx/torch/host_memory.hpp>

#include <torch/torch.h>

#include <cstdlib>  // setenv, unsetenv

#if defined(__GLIBC__)
#include <malloc.h>  // mallinfo2
#endif

TEST_CASE("keep_host_memory: large tensors reuse the heap instead of fresh mappings", "[torch][host_memory]")
{
#if defined(__GLIBC__)
  ::setenv("MPX_KEEP_HOST_MEMORY", "0", 1);
  CHECK_FALSE(mpx::keep_host_memory_wanted());
  CHECK_FALSE(mpx::keep_host_memory());  // the opt-out is honoured
  ::unsetenv("MPX_KEEP_HOST_MEMORY");
  REQUIRE(mpx::keep_host_memory_wanted());
  REQUIRE(mpx::keep_host_memory());
  REQUIRE(mpx::keep_host_memory());  // idempotent

  const std::size_t bytes = 48u << 20;  // above glibc's largest mmap threshold (32 MiB)
  const auto mapped_before = mallinfo2().hblkhd;
  std::size_t heap_after_second = 0;
  for (int cycle = 0; cycle < 8; ++cycle) {  // what a training step does: the same sizes, allocated and freed
    {
      auto t = cycle % 2 ? torch::zeros({int64_t(bytes / sizeof(float))}) : torch::ones({int64_t(bytes / sizeof(float))});
      CHECK(t.sum().item<double>() == double(cycle % 2 ? 0 : bytes / sizeof(float)));
      CHECK(mallinfo2().hblkhd == mapped_before);  // served from the heap, not a fresh mapping
    }
    CHECK(mallinfo2().arena >= bytes);  // freed, but kept by the process
    if (cycle == 1) heap_after_second = mallinfo2().arena;
  }
  // steady state: later cycles reuse what was kept (measured: no growth at all after the second cycle;
  // one tensor of slack for whatever else the process allocated in between)
  CHECK(mallinfo2().arena <= heap_after_second + bytes);
#else
  CHECK_FALSE(mpx::keep_host_memory());
#endif
}
