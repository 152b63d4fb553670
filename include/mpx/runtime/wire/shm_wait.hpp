// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file runtime/wire/shm_wait.hpp
/// Waiting for another process through shared memory: `shm_wait` spins for a while (yielding the CPU to
/// anyone waiting for it), then sleeps on a futex word in the mapping, looking every 20 ms whether the
/// peer still exists and giving up after the timeout; `shm_wake`, on the publishing side, bumps the word
/// and wakes a sleeper only when one says it sleeps (a wake is a system call). The rings (shm_ring.hpp) and
/// the world's sum (shm_sum.hpp) wait with them. Linux (futex).

#include <mpx/linkage.hpp>  // MPX_DECL, MPX_DEFINITIONS

#include <linux/futex.h>  // FUTEX_WAIT, FUTEX_WAKE
#include <sched.h>        // sched_yield
#include <time.h>         // timespec

#include <atomic>   // std::atomic
#include <chrono>   // std::chrono
#include <cstdint>  // std::uint32_t

namespace mpx::detail
{

MPX_DECL long futex(std::atomic<std::uint32_t>* word, int op, std::uint32_t val, const timespec* t);

MPX_DECL void cpu_relax();

/// Waits until `ready()`: spins for `spin`, then sleeps on the futex word `seq` (counted in `sleepers`,
/// which the publishing side reads to know whether to wake anyone), calling `check()` every 20 ms (it
/// throws when a peer has gone) and `late()` once `timeout` has passed (it throws).
template <class Ready, class Check, class Late>
void shm_wait(Ready&& ready, std::atomic<std::uint32_t>& seq, std::atomic<std::uint32_t>& sleepers, std::chrono::microseconds spin,
              std::chrono::milliseconds timeout, Check&& check, Late&& late)
{
  using clock = std::chrono::steady_clock;
  if (ready()) return;
  const auto start = clock::now();
  while (clock::now() - start < spin) {
    for (int i = 0; i < 64; ++i) {
      if (ready()) return;
      cpu_relax();
    }
    ::sched_yield();  // a spin gives way to any other thread waiting for this CPU (more ranks than CPUs)
  }
  const timespec slice{0, 20'000'000};
  for (;;) {
    const std::uint32_t seen = seq.load(std::memory_order_seq_cst);
    sleepers.fetch_add(1, std::memory_order_seq_cst);
    std::atomic_thread_fence(std::memory_order_seq_cst);  // the count above before ready()'s load (the other side: publish)
    if (ready()) {
      sleepers.fetch_sub(1, std::memory_order_seq_cst);
      return;
    }
    futex(&seq, FUTEX_WAIT, seen, &slice);
    sleepers.fetch_sub(1, std::memory_order_seq_cst);
    if (ready()) return;
    check();
    if (clock::now() - start > timeout) late();
  }
}

/// The other side of `shm_wait`, after publishing what a waiter waits for: bumps the futex word `seq` and
/// wakes whoever sleeps on it (only when `sleepers` says someone does: a wake is a system call).
MPX_DECL void shm_wake(std::atomic<std::uint32_t>& seq, const std::atomic<std::uint32_t>& sleepers);

}  // namespace mpx::detail

#if MPX_DEFINITIONS
// ---- definitions (compiled once under MPX_SEPARATE_COMPILATION: linkage.hpp) ----
#include <sys/syscall.h>  // SYS_futex
#include <unistd.h>       // syscall

#include <climits>  // INT_MAX

#if defined(__SSE2__)
#include <emmintrin.h>  // _mm_pause
#endif

namespace mpx::detail
{

MPX_DECL long futex(std::atomic<std::uint32_t>* word, int op, std::uint32_t val, const timespec* t)
{
  return ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), op, val, t, nullptr, 0);
}

MPX_DECL void cpu_relax()
{
#if defined(__SSE2__)
  _mm_pause();
#endif
}

MPX_DECL void shm_wake(std::atomic<std::uint32_t>& seq, const std::atomic<std::uint32_t>& sleepers)
{
  seq.fetch_add(1, std::memory_order_seq_cst);
  std::atomic_thread_fence(std::memory_order_seq_cst);  // the bump before the count's load (the other side: shm_wait)
  if (sleepers.load(std::memory_order_seq_cst)) futex(&seq, FUTEX_WAKE, INT_MAX, nullptr);
}

}  // namespace mpx::detail
#endif  // MPX_DEFINITIONS
