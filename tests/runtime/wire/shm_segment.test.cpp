// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/runtime/wire/shm_segment.hpp: a segment whose users were killed (real child processes,
// SIGKILL) is removed from /dev/shm; one with a live user, one nobody has claimed yet, one stamped in another
// pid space, and files that are not mpx's segments (foreign, short, with impossible owner slots) stay, and
// reading them crashes nothing. (The rings and sums that use the stamp: shm_ring.test.cpp, shm_sum.test.cpp;
// the launcher and the first local rank that remove what killed ranks left: runtime.test.cpp.)
#include "support/catch.hpp"

#include <mpx/runtime/wire/shm_segment.hpp>

#include <fcntl.h>     // open
#include <signal.h>    // raise, SIGKILL
#include <sys/mman.h>  // munmap, shm_unlink
#include <sys/stat.h>  // futimens
#include <sys/wait.h>  // waitpid
#include <unistd.h>    // fork, getpid

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

namespace
{
using mpx::detail::ShmOwnerSlots;
using namespace std::chrono_literals;

constexpr std::size_t segment_bytes = 4096;
constexpr ShmOwnerSlots two_owners{2, 64, 64};  // pids at 64 and 128

std::string seg_name(const std::string& what) { return "/mpx-test-" + what + "-" + std::to_string(::getpid()); }
bool exists(const std::string& name) { return std::filesystem::exists("/dev/shm" + name); }

/// Opens the segment and writes this process's pid in owner slot `k`; leaves it mapped (a user of it).
void* open_as_owner(const std::string& name, int k)
{
  void* p = mpx::detail::map_shm_segment(name, segment_bytes, two_owners, "a test", "", "");
  const std::int32_t pid = ::getpid();
  std::memcpy(static_cast<char*>(p) + two_owners.at + std::size_t(k) * two_owners.stride, &pid, 4);
  return p;
}

/// A child process that opens `name` as owner `k`, runs `more` on the mapping, then is killed (SIGKILL, no clean-up).
template <class More>
void killed_owner(const std::string& name, int k, More&& more)
{
  const pid_t child = ::fork();
  if (child == 0) {
    void* p = open_as_owner(name, k);
    more(p);
    ::raise(SIGKILL);
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  REQUIRE(WIFSIGNALED(status));
  REQUIRE(WTERMSIG(status) == SIGKILL);
}
void killed_owner(const std::string& name, int k) { killed_owner(name, k, [](void*) {}); }

/// Sets the file's times `age` into the past.
void age_by(const std::string& name, std::chrono::seconds age)
{
  const int fd = ::open(("/dev/shm" + name).c_str(), O_RDWR);
  REQUIRE(fd >= 0);
  timespec t[2];
  ::clock_gettime(CLOCK_REALTIME, &t[0]);
  t[0].tv_sec -= age.count();
  t[1] = t[0];
  ::futimens(fd, t);
  ::close(fd);
}

bool removed(const std::vector<std::string>& names, const std::string& name)
{
  return std::find(names.begin(), names.end(), name.substr(1)) != names.end();
}
}  // namespace

TEST_CASE("A segment whose users were all killed is removed, one with a live user or not yet claimed stays", "[shm][faults]")
{
  REQUIRE(mpx::detail::pid_space() != 0);  // Linux with /proc: the stamp can say where its pids live
  const auto dead = seg_name("dead"), half = seg_name("half"), live = seg_name("live"), fresh = seg_name("fresh"), old = seg_name("old");
  killed_owner(dead, 0);
  killed_owner(dead, 1);  // both users gone
  killed_owner(half, 0);  // the other end never came
  void* mine = open_as_owner(live, 0);
  killed_owner(live, 1);  // one end killed, this process still uses it
  ::munmap(mpx::detail::map_shm_segment(fresh, segment_bytes, two_owners, "a test", "", ""), segment_bytes);  // nobody's pid yet
  ::munmap(mpx::detail::map_shm_segment(old, segment_bytes, two_owners, "a test", "", ""), segment_bytes);
  age_by(old, 120s);  // ... and nobody claimed it for two minutes: its creator died before writing its pid

  // ctest runs other tests beside this one, and a run's first local rank removes stale segments too: one of
  // them may remove `dead`, `half` or `old` first. What counts is that they are gone and the others stay.
  const auto gone = mpx::detail::remove_stale_shm_segments(60s);
  for (const auto& n : gone) CHECK_FALSE(exists("/" + n));
  CHECK_FALSE(removed(gone, live));
  CHECK_FALSE(removed(gone, fresh));
  CHECK_FALSE(exists(dead));
  CHECK_FALSE(exists(half));
  CHECK_FALSE(exists(old));
  CHECK(exists(live));
  CHECK(exists(fresh));
  CHECK(mpx::detail::describe_removed_segments({"mpx-a-0-1-0-0"}) == "1 segment (mpx-a-0-1-0-0)");
  CHECK(mpx::detail::describe_removed_segments({"a", "b", "c", "d", "e"}) == "5 segments (a, b, c, d, ...)");

  ::munmap(mine, segment_bytes);
  for (const auto& n : {live, fresh}) ::shm_unlink(n.c_str());
}

TEST_CASE("What the stamp cannot vouch for stays: another pid space, foreign and short files, impossible owner slots", "[shm][faults]")
{
  const auto elsewhere = seg_name("elsewhere"), foreign = seg_name("foreign"), tiny = seg_name("tiny"), wild = seg_name("wild");
  // users killed, but stamped in another pid space (a container sharing this /dev/shm): its pids mean other processes
  killed_owner(elsewhere, 0, [](void* p) { static_cast<mpx::detail::ShmStamp*>(p)->pid_space.store(12345); });
  // a user killed, but its stamp claims owner slots far beyond the segment's end
  killed_owner(wild, 0, [](void* p) { static_cast<mpx::detail::ShmStamp*>(p)->owner_at.store(1u << 30); });
  {  // not mpx's: a file of another program that happens to be called mpx-*, and one shorter than a stamp
    const int fd = ::shm_open(foreign.c_str(), O_CREAT | O_RDWR, 0600);
    REQUIRE(::ftruncate(fd, 4096) == 0);
    ::close(fd);
    const int fd2 = ::shm_open(tiny.c_str(), O_CREAT | O_RDWR, 0600);
    REQUIRE(::write(fd2, "mpx", 3) == 3);
    ::close(fd2);
  }
  for (const auto& n : {elsewhere, foreign, tiny, wild}) age_by(n, 3600s);

  const auto gone = mpx::detail::remove_stale_shm_segments(60s);
  for (const auto& n : {elsewhere, foreign, tiny, wild}) {
    CAPTURE(n);
    CHECK_FALSE(removed(gone, n));
    CHECK(exists(n));
    ::shm_unlink(n.c_str());
  }
}
