// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file runtime/wire/shm_ring.hpp
/// `ShmRing`: one direction of one pipeline channel between two ranks on the same host, as a
/// single-producer single-consumer byte ring in POSIX shared memory. The sender copies a packed boundary
/// message (format.hpp) straight into the ring and goes on — no socket, no helper thread, no hand-shake
/// with the receiver — and the receiver copies it out into a tensor of its own. A frame is an 8-byte word
/// (the message's length, or `over_group`), then the message padded to 8 bytes. A message that does not
/// fit the ring's free space (less a reserve) is not waited for: its frame says "over the group" and the
/// message goes over Gloo as a packed message (boundary_links.hpp), so sends never wait on a ring and a
/// schedule that is deadlock-free over Gloo is deadlock-free here.
///
/// A sender that finds the ring empty, at least 16 of its frames plus the reserve from the ring's start,
/// writes its next frame at the start (a `wrap` word where it stood says so). So the bytes both ends touch
/// are the few that the messages in flight need, and they stay in the CPUs' caches, instead of a walk
/// through the whole ring: with the default 8 MiB ring and 16 KB messages a send's copy took 23–29 µs
/// walking and 2–3 µs wrapping (2026-12-05). Until the receiver reads the `wrap` word, the ring holds
/// at least 16 such frames more; rings too small for that, or messages too large, walk as before.
///
/// The segment's pages are allocated and mapped when it is opened (a fresh page of shared memory costs a
/// fault on each side the first time a frame reaches it: ~50 µs for a 16 KB message before this), so a
/// ring holds its whole size in memory from the start, and a /dev/shm without room for it is a
/// `config_error` at its first message, not a SIGBUS later.
///
/// Waits spin for a while (`Env::shm.spin_us`; shm_links.hpp sets the default), then sleep on a futex in the
/// mapping (shm_wait.hpp), looking every 20 ms whether the peer's process still exists; a dead peer, or the run's timeout, ends
/// the wait with a `peer_error` naming the peer. Both ends open the segment by name (`O_CREAT`: whichever
/// comes first creates it, zero-filled, which is an empty ring) and count themselves in it; the second to
/// open unlinks the name (both have it mapped), so a run leaves nothing in /dev/shm however it ends — but
/// a ring whose other end never opened it: the receiver unlinks it when it closes (not the sender, whose
/// unread frames would go with the name). A ring whose ends were killed before both opened it stays in
/// /dev/shm until the launcher or the next run on the host removes it (shm_segment.hpp: the segment starts
/// with a stamp naming where its ends' pids lie). Names carry a random token per run (`ShmLinks`), so a
/// ring left by a killed run is never read by a later one.

#include <mpx/errors.hpp>  // mpx::peer_error, mpx::config_error
#include <mpx/linkage.hpp>  // MPX_DECL, MPX_DEFINITIONS
#include <mpx/runtime/wire/shm_segment.hpp>  // mpx::detail::map_shm_segment, process_alive, shm_stamp_bytes
#include <mpx/runtime/wire/shm_wait.hpp>     // mpx::detail::shm_wait, shm_wake

#include <torch/torch.h>  // torch::empty

#include <sys/mman.h>  // munmap, shm_unlink
#include <unistd.h>    // getpid

#include <algorithm>  // std::min
#include <atomic>   // std::atomic
#include <chrono>   // std::chrono
#include <cstddef>  // offsetof
#include <cstdint>  // std::uint64_t
#include <cstring>  // std::memcpy
#include <string>   // std::string

namespace mpx
{

namespace detail
{
/// The ring's control block, at the start of the mapping; each end writes its own cache line.
struct ShmRingControl
{
  alignas(64) std::atomic<std::uint64_t> written;  ///< bytes the sender has published (monotonic)
  std::atomic<std::uint32_t> written_seq;           ///< futex word: bumped at each publish
  std::atomic<std::uint32_t> reader_sleeping;
  std::atomic<std::int32_t> sender_pid;
  alignas(64) std::atomic<std::uint64_t> read;  ///< bytes the receiver has consumed (monotonic)
  std::atomic<std::uint32_t> read_seq;          ///< futex word: bumped at each consume
  std::atomic<std::uint32_t> writer_sleeping;
  std::atomic<std::int32_t> receiver_pid;
  alignas(64) std::atomic<std::uint32_t> opened;  ///< ends that have mapped the segment
};
static_assert(std::atomic<std::uint64_t>::is_always_lock_free && std::atomic<std::uint32_t>::is_always_lock_free,
              "mpx: the shared-memory ring needs lock-free atomics (address-free across processes)");
/// The mapping: the stamp (shm_segment.hpp), the control block, the data from 4 KiB on.
inline constexpr std::size_t ring_control_offset = shm_stamp_bytes;
inline constexpr std::size_t ring_data_offset = 4096;
static_assert(ring_control_offset + sizeof(ShmRingControl) <= ring_data_offset);
/// Where the ends write their pids: the sender's, then 64 bytes on the receiver's.
inline constexpr ShmOwnerSlots ring_owners{2, std::uint32_t(ring_control_offset + offsetof(ShmRingControl, sender_pid)),
                                           std::uint32_t(offsetof(ShmRingControl, receiver_pid) - offsetof(ShmRingControl, sender_pid))};
static_assert(offsetof(ShmRingControl, receiver_pid) - offsetof(ShmRingControl, sender_pid) == 64, "mpx: the ends' pids lie a line apart");

}  // namespace detail

class ShmRing
{
 public:
  using clock = std::chrono::steady_clock;
  /// A frame word saying that the message travels over the group instead (its length in the low bits).
  static constexpr std::uint64_t over_group = std::uint64_t(1) << 63;
  /// A frame word saying that the next frame is at the ring's start (the next lap's first byte).
  static constexpr std::uint64_t wrap = std::uint64_t(1) << 62;
  /// How many frames of a message's size the ring's start must have room for before a sender wraps to it.
  static constexpr std::uint64_t wrap_frames = 16;
  /// The smallest ring, in bytes.
  static constexpr std::uint64_t min_capacity = 4 * 1024;

  enum class End { sender, receiver };

  /// Opens (creating if needed) the ring `name` of `capacity` data bytes (a power of two) at one end;
  /// `peer` names the other end in errors.
  ShmRing(std::string name, std::uint64_t capacity, End end, std::string peer, std::chrono::milliseconds timeout, std::chrono::microseconds spin);
  ShmRing(const ShmRing&) = delete;
  ShmRing& operator=(const ShmRing&) = delete;
  ~ShmRing();

  /// Writes a frame of `bytes` message bytes that `fill(put)` copies in, calling put(source, n) in order,
  /// if it fits the free space less a reserve (`reserve()`: room for that many bytes of "over the group"
  /// frames); returns whether it did. When the ring is empty the frame goes to its start (see the file comment).
  template <class Fill>
  bool try_write(std::uint64_t bytes, Fill&& fill)
  {
    const std::uint64_t need = 8 + pad(bytes);
    const std::uint64_t w = ctl_->written.load(std::memory_order_relaxed), r = ctl_->read.load(std::memory_order_acquire);
    const std::uint64_t start = wrap_start(w, r, need);
    if (capacity_ - (start - r) < need + reserve()) return false;
    std::uint64_t at = w;
    if (start != w) copy_in(at, &wrap, 8), at = start;
    copy_in(at, &bytes, 8);
    fill([&](const void* src, std::uint64_t n) { copy_in(at, src, n); });
    publish(start + need);
    return true;
  }

  /// Writes a frame saying that a message of `bytes` goes over the group (waits only if the ring holds
  /// more than reserve() / 8 unread frames).
  void write_over_group(std::uint64_t bytes, const std::string& what);

  /// The next frame: a message as a fresh byte tensor (`over` false), or the length of one that comes
  /// over the group (`over` true, an empty tensor). Waits for it (see the file comment).
  at::Tensor read(bool& over, std::uint64_t& over_bytes, const std::string& what);

 private:
  static std::uint64_t pad(std::uint64_t n) { return (n + 7) & ~std::uint64_t(7); }
  /// Free bytes a data frame leaves for "over the group" frames: 64 KiB (8192 of them), less in small rings.
  std::uint64_t reserve() const { return std::min<std::uint64_t>(capacity_ / 16, 64 * 1024); }
  /// Where a frame of `need` bytes goes when the sender stands at `w` and the receiver at `r`: the next
  /// lap's start when the ring is empty and the start leaves room for `wrap_frames` such frames (the
  /// receiver may read them later than the `wrap` word that frees the rest), else `w`.
  std::uint64_t wrap_start(std::uint64_t w, std::uint64_t r, std::uint64_t need) const
  {
    const std::uint64_t off = w & (capacity_ - 1);
    return r == w && off >= wrap_frames * need + reserve() ? w + (capacity_ - off) : w;
  }

  void copy_in(std::uint64_t& at, const void* src, std::uint64_t n);
  void copy_out(std::uint64_t& at, void* dst, std::uint64_t n) const;

  void publish(std::uint64_t w);
  void consume(std::uint64_t r);

  /// Waits until `ready()` (detail::shm_wait), checking the peer process (`peer_pid`) every 20 ms.
  template <class Ready>
  void wait_until(Ready&& ready, std::atomic<std::uint32_t>& seq, std::atomic<std::uint32_t>& sleeping, const std::atomic<std::int32_t>& peer_pid,
                  const std::string& what)
  {
    detail::shm_wait(ready, seq, sleeping, spin_, timeout_, [&] {
      const std::int32_t pid = peer_pid.load(std::memory_order_acquire);
      if (!detail::process_alive(pid)) throw peer_error(what + " from " + peer_ + ", whose process (pid " + std::to_string(pid) + ") has exited");
    }, [&] { throw peer_error(what + " from " + peer_ + " within " + std::to_string(timeout_.count()) + " ms (a stopped or stuck peer)"); });
  }

  void unlink();

  std::string name_;
  std::uint64_t capacity_;
  End end_;
  std::string peer_;
  std::chrono::milliseconds timeout_;
  std::chrono::microseconds spin_;
  std::uint8_t* base_ = nullptr;
  detail::ShmRingControl* ctl_ = nullptr;
  std::uint8_t* data_ = nullptr;
  bool unlinked_ = false;
};

}  // namespace mpx

#if MPX_DEFINITIONS
// ---- definitions (compiled once under MPX_SEPARATE_COMPILATION: linkage.hpp) ----

namespace mpx
{

MPX_DECL ShmRing::ShmRing(std::string name, std::uint64_t capacity, End end, std::string peer,
                          std::chrono::milliseconds timeout, std::chrono::microseconds spin)
    : name_(std::move(name)), capacity_(capacity), end_(end), peer_(std::move(peer)), timeout_(timeout), spin_(spin)
{
  if (capacity_ < min_capacity || (capacity_ & (capacity_ - 1)) != 0)
    throw config_error("mpx: a shared-memory ring of " + std::to_string(capacity_) + " bytes: MPX_SHM_RING_KB must be a power of two of at least 4");
  void* p = detail::map_shm_segment(name_, detail::ring_data_offset + capacity_, detail::ring_owners, "the channel to/from " + peer_,
                                    "set MPX_SHM=0 to send pipeline messages over Gloo instead", "lower MPX_SHM_RING_KB");
  base_ = static_cast<std::uint8_t*>(p);
  ctl_ = reinterpret_cast<detail::ShmRingControl*>(base_ + detail::ring_control_offset);
  data_ = base_ + detail::ring_data_offset;
  (end_ == End::sender ? ctl_->sender_pid : ctl_->receiver_pid).store(std::int32_t(::getpid()), std::memory_order_release);
  if (ctl_->opened.fetch_add(1, std::memory_order_acq_rel) == 1) unlink();  // both ends have it: the name can go
}

MPX_DECL ShmRing::~ShmRing()
{
  ::munmap(base_, detail::ring_data_offset + capacity_);
  if (end_ == End::receiver && !unlinked_) unlink();  // only the receiver: a sender gone first must not take unread frames with it
}

MPX_DECL void ShmRing::write_over_group(std::uint64_t bytes, const std::string& what)
{
  const std::uint64_t w = ctl_->written.load(std::memory_order_relaxed);
  wait_until([&] { return capacity_ - (w - ctl_->read.load(std::memory_order_acquire)) >= 8; }, ctl_->read_seq, ctl_->writer_sleeping,
             ctl_->receiver_pid, what + ": the shared-memory ring is full (the receiver takes nothing)");
  std::uint64_t at = w;
  const std::uint64_t word = over_group | bytes;
  copy_in(at, &word, 8);
  publish(w + 8);
}

MPX_DECL at::Tensor ShmRing::read(bool& over, std::uint64_t& over_bytes, const std::string& what)
{
  const std::uint64_t r = ctl_->read.load(std::memory_order_relaxed);
  wait_until([&] { return ctl_->written.load(std::memory_order_acquire) - r >= 8; }, ctl_->written_seq, ctl_->reader_sleeping,
             ctl_->sender_pid, what + ": nothing arrived");
  std::uint64_t word = 0, at = r;
  copy_out(at, &word, 8);
  std::uint64_t avail = ctl_->written.load(std::memory_order_acquire) - r;
  if (word == wrap) {  // the frame is at the next lap's start, published with this word
    const std::uint64_t skip = capacity_ - (r & (capacity_ - 1));
    if (avail < skip + 8)
      throw peer_error(what + ": the shared-memory ring " + name_ + " says its next frame is at its start, but nothing is there (corrupt, or written by another program); restart the run");
    at = r + skip, avail -= skip;
    copy_out(at, &word, 8);
    if (word == wrap) throw peer_error(what + ": the shared-memory ring " + name_ + " wraps twice in a row (corrupt); restart the run");
  }
  const std::uint64_t frame = at - 8;  // where the frame that counts starts
  over = (word & over_group) != 0;
  const std::uint64_t bytes = word & ~over_group;
  if (over) {
    if (bytes > (std::uint64_t(1) << 40)) throw peer_error(what + ": the shared-memory ring " + name_ + " announces a message of " + std::to_string(bytes) + " bytes (corrupt); restart the run");
    over_bytes = bytes;
    consume(frame + 8);
    return {};
  }
  if (bytes > capacity_ || 8 + pad(bytes) > avail)
    throw peer_error(what + ": the shared-memory ring " + name_ + " holds a frame of " + std::to_string(bytes) +
                     " bytes that it cannot hold (corrupt, or written by another program); restart the run");
  at::Tensor msg = torch::empty({std::int64_t(bytes)}, torch::kByte);
  copy_out(at, msg.data_ptr<std::uint8_t>(), bytes);
  consume(frame + 8 + pad(bytes));
  return msg;
}

MPX_DECL void ShmRing::copy_in(std::uint64_t& at, const void* src, std::uint64_t n)
{
  const std::uint64_t off = at & (capacity_ - 1), first = std::min(n, capacity_ - off);
  if (n) std::memcpy(data_ + off, src, first);
  if (first < n) std::memcpy(data_, static_cast<const std::uint8_t*>(src) + first, n - first);
  at += n;
}

MPX_DECL void ShmRing::copy_out(std::uint64_t& at, void* dst, std::uint64_t n) const
{
  const std::uint64_t off = at & (capacity_ - 1), first = std::min(n, capacity_ - off);
  if (n) std::memcpy(dst, data_ + off, first);
  if (first < n) std::memcpy(static_cast<std::uint8_t*>(dst) + first, data_, n - first);
  at += n;
}

MPX_DECL void ShmRing::publish(std::uint64_t w)
{
  ctl_->written.store(w, std::memory_order_release);
  detail::shm_wake(ctl_->written_seq, ctl_->reader_sleeping);
}

MPX_DECL void ShmRing::consume(std::uint64_t r)
{
  ctl_->read.store(r, std::memory_order_release);
  detail::shm_wake(ctl_->read_seq, ctl_->writer_sleeping);
}

MPX_DECL void ShmRing::unlink()
{
  ::shm_unlink(name_.c_str());  // ENOENT: already gone
  unlinked_ = true;
}

}  // namespace mpx
#endif  // MPX_DEFINITIONS
