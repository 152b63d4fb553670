// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/runtime/wire/shm_ring.hpp (and shm_links.hpp's settings): frames written at one end read
// back at the other, across the ring's wrap; a sender that finds the ring empty goes back to its start; a message without room says "over the group" instead; a wait
// ends in a named peer_error when the peer is gone (a real child process that exits) or silent; a corrupt
// frame is a peer_error; the name is gone from /dev/shm once both ends have opened the ring, and a receiver
// whose sender never came removes it when it closes; a ring whose ends were killed before both opened it is
// removed as stale (wire/shm_segment.hpp) once no end lives. Both ends in one process, except the dead
// peer's and the killed sender's.
#include "support/forked.hpp"
#include "support/rooms.hpp"

#include <mpx/runtime/shm_links.hpp>

#include <signal.h>    // kill, SIGKILL
#include <sys/wait.h>  // waitpid
#include <unistd.h>    // fork

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>

namespace
{
using mpx::ShmRing;
using namespace std::chrono_literals;

std::string ring_name(const std::string& what) { return "/mpx-test-" + what + "-" + std::to_string(::getpid()); }

ShmRing open_end(const std::string& name, ShmRing::End end, std::uint64_t capacity = 64 * 1024, std::chrono::milliseconds timeout = 2000ms)
{
  return ShmRing(name, capacity, end, end == ShmRing::End::sender ? "rank 1" : "rank 0", timeout, 20us);
}

/// Writes `n` bytes counting up from `first`; returns whether it went inline.
bool write_bytes(ShmRing& ring, std::uint64_t n, std::uint8_t first)
{
  std::vector<std::uint8_t> v(n);
  for (std::uint64_t i = 0; i < n; ++i) v[i] = std::uint8_t(first + i);
  return ring.try_write(n, [&](auto put) {
    put(v.data(), n / 2);  // in two pieces, as a header and a tensor come
    put(v.data() + n / 2, n - n / 2);
  });
}

void check_bytes(const at::Tensor& msg, std::uint64_t n, std::uint8_t first)
{
  REQUIRE(std::uint64_t(msg.numel()) == n);
  const auto* p = msg.data_ptr<std::uint8_t>();
  for (std::uint64_t i = 0; i < n; ++i)
    if (p[i] != std::uint8_t(first + i)) FAIL("byte " << i << " differs");
}

/// Another program's view of a ring's data, mapped by name while the name is there (before the second end
/// opens the ring): its frame words, read and overwritten.
class RingView
{
 public:
  RingView(const std::string& name, std::uint64_t capacity) : span_(mpx::detail::ring_data_offset + capacity)
  {
    const int fd = ::shm_open(name.c_str(), O_RDWR, 0600);
    REQUIRE(fd >= 0);
    void* p = ::mmap(nullptr, span_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ::close(fd);
    REQUIRE(p != MAP_FAILED);
    data_ = static_cast<std::uint8_t*>(p) + mpx::detail::ring_data_offset;
  }
  RingView(const RingView&) = delete;
  RingView& operator=(const RingView&) = delete;
  ~RingView() { ::munmap(data_ - mpx::detail::ring_data_offset, span_); }
  std::uint64_t word(std::uint64_t off) const
  {
    std::uint64_t w = 0;
    std::memcpy(&w, data_ + off, 8);
    return w;
  }
  void set_word(std::uint64_t off, std::uint64_t w) { std::memcpy(data_ + off, &w, 8); }

 private:
  std::size_t span_;
  std::uint8_t* data_ = nullptr;
};

at::Tensor read_inline(ShmRing& ring)
{
  bool over = true;
  std::uint64_t bytes = 0;
  auto msg = ring.read(over, bytes, "RF0 of stage 1");
  CHECK_FALSE(over);
  return msg;
}

/// A frame of 100 bytes whose length word another program overwrites with `word`: the read names it.
void check_corrupt_frame(const std::string& what, std::uint64_t word, const std::string& message)
{
  const auto name = ring_name(what);
  auto rx = open_end(name, ShmRing::End::receiver);
  RingView view(name, 64 * 1024);
  auto tx = open_end(name, ShmRing::End::sender);
  REQUIRE(write_bytes(tx, 100, 0));
  view.set_word(0, word);
  CHECK_THROWS_WITH(read_inline(rx), Catch::Contains(message));
}
}  // namespace

TEST_CASE("A shared-memory ring carries frames in order across its wrap, and lets go of its name once both ends have it open", "[rooms][shm]")
{
  const auto name = ring_name("order");
  auto rx = open_end(name, ShmRing::End::receiver);
  CHECK(std::filesystem::exists("/dev/shm" + name));  // for the sender to find
  auto tx = open_end(name, ShmRing::End::sender);
  CHECK_FALSE(std::filesystem::exists("/dev/shm" + name));  // unlinked by the second end: nothing left behind, whatever comes next
  // 64 KiB ring: frames of 20,001 bytes, two unread at a time, so that frames straddle the ring's end;
  // odd sizes test the padding
  for (int i = 0; i < 40; i += 2) {
    REQUIRE(write_bytes(tx, 20001, std::uint8_t(i)));
    REQUIRE(write_bytes(tx, 20001, std::uint8_t(i + 1)));
    check_bytes(read_inline(rx), 20001, std::uint8_t(i));
    check_bytes(read_inline(rx), 20001, std::uint8_t(i + 1));
  }
  REQUIRE(write_bytes(tx, 7, 1));  // two unread at once
  REQUIRE(write_bytes(tx, 9, 2));
  check_bytes(read_inline(rx), 7, 1);
  check_bytes(read_inline(rx), 9, 2);
}

TEST_CASE("A sender that finds the ring empty writes its next frame at the ring's start, so the ends touch few bytes", "[rooms][shm]")
{
  const auto name = ring_name("rewind");
  auto rx = open_end(name, ShmRing::End::receiver);
  const RingView view(name, 64 * 1024);
  auto word_at = [&](std::uint64_t off) { return view.word(off); };
  auto tx = open_end(name, ShmRing::End::sender);
  // 300 frames of 1,000 bytes (1,008 with the length word), each read before the next: walking, 4.6 laps;
  // wrapping as soon as the start leaves room for 16 of them and the reserve (4 KiB in a 64 KiB ring),
  // at 21 x 1,008 = 21,168 bytes in, never past that
  for (int i = 0; i < 300; ++i) {
    REQUIRE(write_bytes(tx, 1000, std::uint8_t(i)));
    check_bytes(read_inline(rx), 1000, std::uint8_t(i));
  }
  CHECK(word_at(0) == 1000);
  CHECK(word_at(20 * 1008) == 1000);
  CHECK(word_at(21 * 1008) == ShmRing::wrap);
  for (std::uint64_t off = 21 * 1008 + 8; off < 64 * 1024; off += 8) REQUIRE(word_at(off) == 0);  // never written
  // frames of 20,001 bytes cannot wrap in this ring (16 of them do not fit): they walk and straddle its end
  for (int i = 0; i < 10; ++i) {
    REQUIRE(write_bytes(tx, 20001, std::uint8_t(i)));
    check_bytes(read_inline(rx), 20001, std::uint8_t(i));
  }
}

TEST_CASE("A message the ring has no room for becomes an over-the-group frame, never a wait", "[rooms][shm]")
{
  const auto name = ring_name("over");
  auto rx = open_end(name, ShmRing::End::receiver);
  auto tx = open_end(name, ShmRing::End::sender);
  CHECK_FALSE(write_bytes(tx, 64 * 1024, 0));  // larger than the ring less its reserve
  REQUIRE(write_bytes(tx, 32000, 3));
  CHECK_FALSE(write_bytes(tx, 32000, 4));  // the first is unread: no room for a second
  tx.write_over_group(32000, "SF1 of stage 1");
  check_bytes(read_inline(rx), 32000, 3);
  bool over = false;
  std::uint64_t bytes = 0;
  CHECK_FALSE(rx.read(over, bytes, "RF1").defined());
  CHECK(over);
  CHECK(bytes == 32000);
  REQUIRE(write_bytes(tx, 32000, 5));  // room again
  check_bytes(read_inline(rx), 32000, 5);
}

TEST_CASE("A ring wait ends with a named error: a silent peer at the timeout, a dead one at once, a corrupt frame", "[rooms][shm]")
{
  {
    const auto name = ring_name("silent");
    auto tx = open_end(name, ShmRing::End::sender);
    auto rx = open_end(name, ShmRing::End::receiver, 64 * 1024, 200ms);
    CHECK_THROWS_WITH(read_inline(rx), Catch::Contains("nothing arrived from rank 0 within 200 ms"));
  }
  {
    const auto name = ring_name("dead");
    auto rx = open_end(name, ShmRing::End::receiver, 64 * 1024, 60000ms);
    const pid_t child = ::fork();
    if (child == 0) {  // the peer: opens the ring as the sender, writes nothing, exits
      { auto tx = open_end(name, ShmRing::End::sender); }
      ::_exit(0);
    }
    int status = 0;
    ::waitpid(child, &status, 0);
    const auto t0 = std::chrono::steady_clock::now();
    CHECK_THROWS_WITH(read_inline(rx), Catch::Contains("whose process (pid " + std::to_string(child) + ") has exited"));
    CHECK(std::chrono::steady_clock::now() - t0 < 5s);  // not the minute's timeout
  }
  check_corrupt_frame("corrupt", std::uint64_t(1) << 40, "that it cannot hold");  // a length more than the ring holds
  check_corrupt_frame("wrap", ShmRing::wrap, "says its next frame is at its start, but nothing is there");  // "go to the start", nothing there
}

TEST_CASE("A ring one end never opened: the receiver removes its name when it closes, the sender leaves it for the receiver", "[rooms][shm]")
{
  const auto lonely = ring_name("lonely-receiver");
  { auto rx = open_end(lonely, ShmRing::End::receiver); }
  CHECK_FALSE(std::filesystem::exists("/dev/shm" + lonely));
  const auto early = ring_name("early-sender");
  {
    auto tx = open_end(early, ShmRing::End::sender);
    REQUIRE(write_bytes(tx, 10, 7));
  }
  REQUIRE(std::filesystem::exists("/dev/shm" + early));  // the frame waits for its receiver
  auto rx = open_end(early, ShmRing::End::receiver);
  check_bytes(read_inline(rx), 10, 7);
  CHECK_FALSE(std::filesystem::exists("/dev/shm" + early));
}

TEST_CASE("A ring whose receiver was killed before it opened it: removed as stale once its sender is gone too, not before", "[rooms][shm][faults]")
{
  const auto name = ring_name("killed-receiver");
  const pid_t sender = test::fork_holding([&] {  // rank 0: sends its first activation, then waits for what never comes
    std::unique_ptr<ShmRing> tx(new ShmRing(open_end(name, ShmRing::End::sender)));  // (a ring does not move)
    write_bytes(*tx, 100, 1);
    return tx;
  });
  REQUIRE(sender > 0);
  const auto removed = [&](const std::vector<std::string>& v) { return std::find(v.begin(), v.end(), name.substr(1)) != v.end(); };
  CHECK_FALSE(removed(mpx::detail::remove_stale_shm_segments()));  // its sender lives: the receiver may still come
  CHECK(std::filesystem::exists("/dev/shm" + name));
  ::kill(sender, SIGKILL);  // the run is over: nobody will ever open it
  ::waitpid(sender, nullptr, 0);
  mpx::detail::remove_stale_shm_segments();  // (or a run that ctest starts meanwhile: its first local rank does the same)
  CHECK_FALSE(std::filesystem::exists("/dev/shm" + name));
}

TEST_CASE("Shared-memory settings: MPX_SHM takes 0 or 1, a ring size must be a power of two of at least 4 KiB, the spin follows the CPUs", "[rooms][shm]")
{
  ::setenv("MPX_SHM", "0", 1);
  CHECK_FALSE(mpx::read_env().shm.on);
  ::setenv("MPX_SHM", "yes", 1);
  CHECK_THROWS_WITH(mpx::read_env(), Catch::Contains("set it to 1") && Catch::Contains("or 0"));
  ::unsetenv("MPX_SHM");
  CHECK(mpx::read_env().shm.on);
  ::setenv("MPX_SHM_RING_KB", "100", 1);
  CHECK_THROWS_WITH(mpx::read_env(), Catch::Contains("MPX_SHM_RING_KB=100 must be a power of two"));
  ::setenv("MPX_SHM_RING_KB", "64", 1);
  CHECK(mpx::read_env().shm.ring_kb == 64);
  ::unsetenv("MPX_SHM_RING_KB");
  ::setenv("MPX_SHM_SPIN_US", "-1", 1);
  CHECK_THROWS_WITH(mpx::read_env(), Catch::Contains("MPX_SHM_SPIN_US=-1 must be from 0 to 1000000"));
  ::unsetenv("MPX_SHM_SPIN_US");
  CHECK(!mpx::read_env().shm.spin_us);
  CHECK_THROWS_WITH(open_end(ring_name("size"), ShmRing::End::sender, 100 * 1024), Catch::Contains("MPX_SHM_RING_KB must be a power of two"));
  CHECK_FALSE(mpx::detail::host_identity().empty());  // Linux says boot id and namespaces
  // the default spin: long where every rank's threads have a CPU, short where ranks share CPUs
  cpu_set_t set;
  CPU_ZERO(&set);
  REQUIRE(::sched_getaffinity(0, sizeof set, &set) == 0);
  CHECK(mpx::detail::default_spin_us(1) == (at::get_num_threads() <= CPU_COUNT(&set) ? 1000 : 50));
  CHECK(mpx::detail::default_spin_us(1 << 20) == 50);
}
