// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file runtime/wire/shm_sum.hpp
/// `ShmSum`: the sum of a few numbers over every rank of a world that runs on one host, through POSIX
/// shared memory — the end-of-step agreement (loss, gradient norm, inf/NaN) without Gloo's round trip
/// (a Gloo all-reduce of three doubles between two local processes: ~260 µs median, a tail of
/// milliseconds when its helper threads wait for a core; here: a store, a wake and a read).
///
/// The segment holds one slot per rank, each on its own cache lines: the round it last arrived at and
/// its numbers for odd and even rounds. A round is `arrive` (write this rank's numbers for the round's
/// parity, then publish the round) and `finish` (wait until every rank has published the round, then add
/// the slots in rank order, so every rank gets the same bits). Two buffers are enough: a rank can
/// publish round r + 1 only after it has read round r, so no rank is ever two rounds ahead of a reader.
///
/// Waits spin (`MPX_SHM_SPIN_US`), then sleep on a futex word that every arrival bumps; every 20 ms a
/// waiter looks whether the ranks it still waits for are alive (their pids are in their slots): a killed
/// rank is a named `peer_error` at once, a silent one at the run's timeout. Every rank opens the segment
/// by name (the first creates it zero-filled: round 0) and counts itself in it; the last to open unlinks
/// the name (all have it mapped), so a run leaves nothing in /dev/shm however it ends (a rank closing a
/// segment that some rank never opened unlinks it too; one whose ranks were all killed before the last
/// opened it is removed by the launcher or the next run: shm_segment.hpp). The segment: the stamp
/// (shm_segment.hpp), the header, the slots.

#include <mpx/errors.hpp>           // mpx::peer_error, mpx::config_error
#include <mpx/runtime/wire/shm_wait.hpp>    // mpx::detail::shm_wait, shm_wake
#include <mpx/runtime/wire/shm_segment.hpp> // mpx::detail::map_shm_segment, process_alive, shm_stamp_bytes
#include <mpx/linkage.hpp>  // MPX_DECL, MPX_DEFINITIONS

#include <sys/mman.h>  // munmap, shm_unlink

#include <atomic>   // std::atomic
#include <chrono>   // std::chrono
#include <cstddef>  // offsetof
#include <cstdint>  // std::uint64_t
#include <string>   // std::string

namespace mpx
{

namespace detail
{
inline constexpr int shm_sum_values = 6;  ///< numbers per round at most

/// The segment's header: the futex word every arrival bumps, and how many ranks sleep on it.
struct ShmSumHeader
{
  alignas(64) std::atomic<std::uint32_t> arrivals;
  std::atomic<std::uint32_t> sleepers;
  std::atomic<std::uint32_t> opened;  ///< ranks that have mapped the segment
};
/// One rank's slot.
struct ShmSumSlot
{
  alignas(64) std::atomic<std::uint64_t> round;  ///< the last round this rank arrived at
  std::atomic<std::int32_t> pid;
  double values[2][shm_sum_values];  ///< this rank's numbers for even and odd rounds
};
static_assert(sizeof(ShmSumSlot) % 64 == 0 && std::atomic<std::uint64_t>::is_always_lock_free);
inline constexpr std::size_t shm_sum_header_offset = shm_stamp_bytes;
inline constexpr std::size_t shm_sum_slots_offset = shm_sum_header_offset + sizeof(ShmSumHeader);
}  // namespace detail

class ShmSum
{
 public:
  static constexpr int max_values = detail::shm_sum_values;

  /// Opens (creating if needed) the segment `name` for `ranks` ranks, as `rank`.
  ShmSum(std::string name, int ranks, int rank, std::chrono::milliseconds timeout, std::chrono::microseconds spin);
  ShmSum(const ShmSum&) = delete;
  ShmSum& operator=(const ShmSum&) = delete;
  ~ShmSum();

  /// This rank's `n` numbers for the next round; returns at once.
  void arrive(const double* v, int n);

  /// Waits until every rank has arrived at this round and writes the sums of their numbers (in rank order:
  /// the same on every rank) to `out`. `what()` names the round in errors (a string, made only for one).
  template <class What>
  void finish(double* out, What&& what)
  {
    if (!arrived_) throw config_error("mpx: ShmSum::finish without arrive");
    const std::uint64_t r = round_ + 1;
    const auto all_here = [&] {
      for (int k = 0; k < ranks_; ++k)
        if (slots_[k].round.load(std::memory_order_acquire) < r) return false;
      return true;
    };
    detail::shm_wait(all_here, header_->arrivals, header_->sleepers, spin_, timeout_, [&] { check_alive(r, what); },
                     [&] { throw peer_error(what() + ": " + missing(r) + " did not arrive within " + std::to_string(timeout_.count()) + " ms (a stopped or stuck rank)"); });
    for (int i = 0; i < n_; ++i) {
      double s = 0;
      for (int k = 0; k < ranks_; ++k) s += slots_[k].values[r & 1][i];
      out[i] = s;
    }
    round_ = r;
    arrived_ = false;
  }

 private:
  std::size_t bytes() const { return detail::shm_sum_slots_offset + std::size_t(ranks_) * sizeof(detail::ShmSumSlot); }
  void unlink();

  template <class What>
  void check_alive(std::uint64_t r, What& what) const
  {
    for (int k = 0; k < ranks_; ++k) {
      const std::int32_t pid = slots_[k].pid.load(std::memory_order_acquire);
      if (slots_[k].round.load(std::memory_order_acquire) < r && !detail::process_alive(pid))
        throw peer_error(what() + ": rank " + std::to_string(k) + "'s process (pid " + std::to_string(pid) + ") has exited");
    }
  }
  std::string missing(std::uint64_t r) const;

  std::string name_;
  int ranks_, rank_;
  std::chrono::milliseconds timeout_;
  std::chrono::microseconds spin_;
  void* base_ = nullptr;
  detail::ShmSumHeader* header_ = nullptr;
  detail::ShmSumSlot* slots_ = nullptr;
  std::uint64_t round_ = 0;
  bool arrived_ = false, unlinked_ = false;
  int n_ = 0;
};

}  // namespace mpx

#if MPX_DEFINITIONS
// ---- definitions (compiled once under MPX_SEPARATE_COMPILATION: linkage.hpp) ----

namespace mpx
{

MPX_DECL ShmSum::ShmSum(std::string name, int ranks, int rank, std::chrono::milliseconds timeout, std::chrono::microseconds spin)
    : name_(std::move(name)), ranks_(ranks), rank_(rank), timeout_(timeout), spin_(spin)
{
  if (ranks_ < 1 || rank_ < 0 || rank_ >= ranks_)
    throw config_error("mpx: ShmSum: rank " + std::to_string(rank_) + " of " + std::to_string(ranks_) + " ranks does not exist");
  const detail::ShmOwnerSlots owners{std::uint32_t(ranks_), std::uint32_t(detail::shm_sum_slots_offset + offsetof(detail::ShmSumSlot, pid)),
                                     std::uint32_t(sizeof(detail::ShmSumSlot))};
  base_ = detail::map_shm_segment(name_, bytes(), owners, "the end-of-step sum over the world", "set MPX_SHM=0 to reduce over Gloo instead", "set MPX_SHM=0");
  header_ = reinterpret_cast<detail::ShmSumHeader*>(static_cast<char*>(base_) + detail::shm_sum_header_offset);
  slots_ = reinterpret_cast<detail::ShmSumSlot*>(static_cast<char*>(base_) + detail::shm_sum_slots_offset);
  slots_[rank_].pid.store(std::int32_t(::getpid()), std::memory_order_release);
  if (header_->opened.fetch_add(1, std::memory_order_acq_rel) + 1 == std::uint32_t(ranks_)) unlink();  // all have it: the name can go
}

MPX_DECL ShmSum::~ShmSum()
{
  ::munmap(base_, bytes());
  if (!unlinked_) unlink();  // ENOENT: another rank did it
}

MPX_DECL void ShmSum::arrive(const double* v, int n)
{
  if (n < 0 || n > max_values) throw config_error("mpx: ShmSum: " + std::to_string(n) + " numbers; a round sums at most " + std::to_string(max_values));
  if (arrived_) throw config_error("mpx: ShmSum::arrive twice without finish");
  auto& me = slots_[rank_];
  const std::uint64_t r = round_ + 1;
  for (int i = 0; i < n; ++i) me.values[r & 1][i] = v[i];
  me.round.store(r, std::memory_order_release);
  detail::shm_wake(header_->arrivals, header_->sleepers);
  arrived_ = true;
  n_ = n;
}

MPX_DECL void ShmSum::unlink()
{
  ::shm_unlink(name_.c_str());
  unlinked_ = true;
}

MPX_DECL std::string ShmSum::missing(std::uint64_t r) const
{
  std::string s;
  for (int k = 0; k < ranks_; ++k)
    if (slots_[k].round.load(std::memory_order_acquire) < r) s += (s.empty() ? "rank " : ", ") + std::to_string(k);
  return s.empty() ? "a rank" : s;
}

}  // namespace mpx
#endif  // MPX_DEFINITIONS
