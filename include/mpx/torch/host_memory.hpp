// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file torch/host_memory.hpp
/// Keeping freed host memory for reuse. LibTorch's CPU allocator is plain malloc: with glibc's defaults a
/// tensor of more than a few MB is a fresh `mmap` each time (and a freed one goes back to the kernel),
/// so every new activation, gradient or optimizer temporary of that size is paid again in page faults —
/// on a VM, about 10 µs per 4 KiB page. A training step allocates the same sizes every step, so this is
/// pure waste: measured on the 2-core VM (moondream tiny, text stage with its 51,200 × 128 embedding and
/// head), one step of 8 samples took 0.85 s with glibc's defaults and 0.14 s with freed memory kept
/// (the embedding's gradient alone: 70 ms of page faults per backward). `mpx::keep_host_memory()` tells
/// glibc to serve every size from its heap and never return the heap's top to the kernel, which is what
/// a caching allocator (PyTorch's CUDA one, or jemalloc/tcmalloc preloaded) does: the resident size
/// stays at the peak a step needs (measured: the same peak either way). `mpx::make_world` calls it
/// unless `WorldOptions::keep_host_memory` is false or the environment sets `MPX_KEEP_HOST_MEMORY=0`.

#include <cstdlib>  // std::getenv
#include <string>   // std::string

#if defined(__GLIBC__)
#include <malloc.h>  // mallopt, M_MMAP_MAX, M_TRIM_THRESHOLD
#endif

namespace mpx
{

/// True when `MPX_KEEP_HOST_MEMORY` is unset or not "0".
inline bool keep_host_memory_wanted()
{
  const char* v = std::getenv("MPX_KEEP_HOST_MEMORY");
  return v == nullptr || std::string(v) != "0";
}

/// Serves every allocation from malloc's heap and keeps freed memory for reuse (glibc). Returns whether
/// the allocator was changed: false with another C library, or when `MPX_KEEP_HOST_MEMORY=0`.
/// Call it once, early (before large tensors exist); calling it again is harmless.
inline bool keep_host_memory()
{
#if defined(__GLIBC__)
  if (!keep_host_memory_wanted()) return false;
  const bool no_mmap = mallopt(M_MMAP_MAX, 0) == 1;                     // no fresh mapping per large tensor
  const bool no_trim = mallopt(M_TRIM_THRESHOLD, 0x7fffffff) == 1;      // never hand the heap's top back
  return no_mmap && no_trim;
#else
  return false;
#endif
}

}  // namespace mpx
