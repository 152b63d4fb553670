// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file runtime/wire/shm_segment.hpp
/// The POSIX shared-memory segments of mpx (the rings of shm_ring.hpp, the sums of shm_sum.hpp): how one is
/// opened, what its first 64 bytes say, and how segments that killed runs left in /dev/shm are removed.
///
/// A segment's name goes once every process that uses it has it open, so a run that ends, even by an
/// error, leaves nothing. A process killed (SIGKILL, OOM killer, a node's launcher ending it) before a
/// peer opened a segment leaves that name — an 8 MiB ring by default — and nothing of the dead run ever
/// opens it again (names carry a random token per run). So every segment starts with a **stamp**: mpx's
/// magic number, the pid space of the processes that open it (boot id and PID namespace) and where in the
/// segment each user writes its pid. `remove_stale_shm_segments` removes the segments named `mpx-*` that
/// are stamped in this pid space and whose users have all exited (or that none has claimed for `grace`);
/// a segment with a live user, stamped elsewhere, not mpx's, not this user's, or of a layout the stamp
/// cannot vouch for stays. It reads with `pread` (never maps what it inspects: a file truncated meanwhile
/// cannot fault) and never throws. The launcher (launch.hpp) calls it once its ranks have ended; the first
/// local rank of every run calls it at start-up (shm_links.hpp), for runs started without mpxrun.

#include <mpx/errors.hpp>   // mpx::config_error
#include <mpx/linkage.hpp>  // MPX_DECL, MPX_DEFINITIONS

#include <signal.h>  // kill

#include <atomic>   // std::atomic
#include <cerrno>   // errno, ESRCH
#include <chrono>   // std::chrono::seconds
#include <cstddef>  // std::size_t
#include <cstdint>  // std::uint64_t
#include <string>   // std::string
#include <vector>   // std::vector

namespace mpx::detail
{

/// Where a segment's users write their pids: `count` 4-byte pids, the first `at` bytes into the segment,
/// each `stride` bytes after the one before.
struct ShmOwnerSlots
{
  std::uint32_t count = 0, at = 0, stride = 0;
};

/// The first 64 bytes of every mpx segment.
struct ShmStamp
{
  alignas(64) std::atomic<std::uint64_t> magic;
  std::atomic<std::uint64_t> pid_space;
  std::atomic<std::uint32_t> owner_count, owner_at, owner_stride;
};
static_assert(sizeof(ShmStamp) == 64, "mpx: the shared-memory stamp is one cache line");
inline constexpr std::size_t shm_stamp_bytes = sizeof(ShmStamp);
inline constexpr std::uint64_t shm_magic = 0x31'6d'68'73'2d'78'70'6dull;  // "mpx-shm1" in memory order

/// A number for this process's pid space: the boot and the PID namespace (pids mean the same process
/// exactly where it is the same); 0 when this system does not say.
MPX_DECL std::uint64_t pid_space();

/// Whether the process `pid` exists (0: not known yet, which counts as alive).
inline bool process_alive(std::int32_t pid) { return pid <= 0 || ::kill(pid, 0) == 0 || errno != ESRCH; }

/// Opens the segment `name` (creating it zero-filled if it is not there yet: users open by name, whichever
/// comes first creates) and maps `bytes` of it with the pages allocated, so a /dev/shm without room is a
/// `config_error` here, not a SIGBUS at a later touch; stamps it (magic, pid space, `owners`). The caller
/// writes its pid in its owner slot. `what` names the segment's use in errors, `off` how to do without
/// shared memory, `smaller` how to need less of it.
MPX_DECL void* map_shm_segment(const std::string& name, std::size_t bytes, ShmOwnerSlots owners, const std::string& what,
                               const std::string& off, const std::string& smaller);

/// Removes every stale segment from /dev/shm (see the file comment) and returns their names (without the
/// leading '/'). `grace`: how old a stamped segment without any pid must be to count as abandoned.
MPX_DECL std::vector<std::string> remove_stale_shm_segments(std::chrono::seconds grace = std::chrono::seconds(60));

/// "2 segments (mpx-1f2e-0-1-0-0, mpx-1f2e-1-0-0-0)" for a log line; `names` as `remove_stale_shm_segments` returns them.
MPX_DECL std::string describe_removed_segments(const std::vector<std::string>& names);

}  // namespace mpx::detail

#if MPX_DEFINITIONS
// ---- definitions (compiled once under MPX_SEPARATE_COMPILATION: linkage.hpp) ----
#include <dirent.h>    // opendir, readdir
#include <fcntl.h>     // open, O_CREAT, O_RDWR, posix_fallocate
#include <sys/mman.h>  // mmap, shm_open, shm_unlink
#include <sys/stat.h>  // fstat
#include <unistd.h>    // pread, readlink, close, geteuid

#include <cstring>  // std::strerror
#include <ctime>    // std::time
#include <fstream>  // std::ifstream

namespace mpx::detail
{

MPX_DECL std::uint64_t pid_space()
{
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::string id;
  if (!std::getline(boot, id) || id.empty()) return 0;
  char ns[128];
  const auto n = ::readlink("/proc/self/ns/pid", ns, sizeof ns);
  if (n <= 0) return 0;
  id += '|' + std::string(ns, std::size_t(n));
  std::uint64_t h = 14695981039346656037ull;  // FNV-1a: the same number in every process, whatever built it
  for (unsigned char c : id) h = (h ^ c) * 1099511628211ull;
  return h == 0 ? 1 : h;
}

MPX_DECL void* map_shm_segment(const std::string& name, std::size_t bytes, ShmOwnerSlots owners, const std::string& what,
                               const std::string& off, const std::string& smaller)
{
  const auto fail = [&](const std::string& doing, int err, const std::string& more) {
    return config_error("mpx: " + doing + " " + name + " (" + std::strerror(err) + ") for " + what + "; " + off + more);
  };
  const int fd = ::shm_open(name.c_str(), O_CREAT | O_RDWR, 0600);
  if (fd < 0) throw fail("cannot open the shared-memory segment", errno, "");
  const int full = ::ftruncate(fd, off_t(bytes)) == 0 ? ::posix_fallocate(fd, 0, off_t(bytes)) : errno;
  void* p = full == 0 ? ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0) : MAP_FAILED;
  const int err = full != 0 ? full : errno;
  ::close(fd);
  if (p == MAP_FAILED)
    throw fail("cannot place " + std::to_string(bytes) + " bytes in /dev/shm as", err,
               " (or free /dev/shm, give the container more of it, e.g. docker --shm-size, or " + smaller + ")");
  auto* stamp = static_cast<ShmStamp*>(p);  // every user writes the same values: whichever comes first stamps
  stamp->owner_count.store(owners.count, std::memory_order_relaxed);
  stamp->owner_at.store(owners.at, std::memory_order_relaxed);
  stamp->owner_stride.store(owners.stride, std::memory_order_relaxed);
  stamp->pid_space.store(pid_space(), std::memory_order_relaxed);
  stamp->magic.store(shm_magic, std::memory_order_release);
  return p;
}

/// What the reaper reads of a stamp (the atomics' bytes, as plain numbers).
struct ShmStampBytes
{
  std::uint64_t magic, pid_space;
  std::uint32_t owner_count, owner_at, owner_stride;
};

/// Whether the segment open as `fd` is mpx's, stamped in `space`, and abandoned: all its users exited, or none
/// claimed it for `grace`. Anything it cannot vouch for is not stale.
inline bool shm_segment_stale(int fd, std::uint64_t space, std::chrono::seconds grace)
{
  struct stat st{};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != ::geteuid() || st.st_size < off_t(shm_stamp_bytes)) return false;
  ShmStampBytes s{};
  if (::pread(fd, &s, sizeof s, 0) != ssize_t(sizeof s) || s.magic != shm_magic || s.pid_space != space) return false;
  const std::uint64_t end = std::uint64_t(s.owner_at) + std::uint64_t(s.owner_stride) * (s.owner_count == 0 ? 0 : s.owner_count - 1) + 4;
  if (s.owner_count == 0 || s.owner_count > (1u << 16) || s.owner_stride < 4 || s.owner_at < shm_stamp_bytes || end > std::uint64_t(st.st_size))
    return false;
  bool claimed = false;
  for (std::uint32_t k = 0; k < s.owner_count; ++k) {
    std::int32_t pid = 0;
    if (::pread(fd, &pid, sizeof pid, off_t(s.owner_at + std::uint64_t(k) * s.owner_stride)) != ssize_t(sizeof pid)) return false;
    if (pid > 0 && process_alive(pid)) return false;
    claimed = claimed || pid > 0;
  }
  return claimed || std::time(nullptr) - st.st_mtime > grace.count();  // made (ftruncate) that long ago
}

MPX_DECL std::vector<std::string> remove_stale_shm_segments(std::chrono::seconds grace)
{
  std::vector<std::string> removed;
  const std::uint64_t space = pid_space();
  DIR* dir = space != 0 ? ::opendir("/dev/shm") : nullptr;
  if (!dir) return removed;
  while (const dirent* e = ::readdir(dir)) {
    const std::string name = e->d_name;
    if (name.rfind("mpx-", 0) != 0) continue;
    const int fd = ::open(("/dev/shm/" + name).c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) continue;
    const bool stale = shm_segment_stale(fd, space, grace);
    ::close(fd);
    if (stale && ::shm_unlink(("/" + name).c_str()) == 0) removed.push_back(name);
  }
  ::closedir(dir);
  return removed;
}

MPX_DECL std::string describe_removed_segments(const std::vector<std::string>& names)
{
  std::string list;
  for (std::size_t i = 0; i < names.size() && i < 4; ++i) list += (i ? ", " : "") + names[i];
  if (names.size() > 4) list += ", ...";
  return std::to_string(names.size()) + (names.size() == 1 ? " segment (" : " segments (") + list + ")";
}

}  // namespace mpx::detail
#endif  // MPX_DEFINITIONS
