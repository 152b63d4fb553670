// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file runtime/shm_links.hpp
/// `ShmLinks`: which of this rank's pipeline peers share its host, and the shared-memory rings
/// (wire/shm_ring.hpp) to and from them, each opened at its channel's first message. Two ranks share a
/// host when their boot id and their IPC, mount, network and PID namespaces are the same (ranks in
/// separate network namespaces count as separate nodes) and both have shared memory on (`MPX_SHM`, 1 by
/// default; 0 sends every pipeline message over Gloo). Each rank publishes that in the run's store, and
/// reads a peer's at the first message to or from it, so both ends of a channel choose the same way.
/// `world_sum` gives the world's end-of-step sum through shared memory when every rank shares the host.
/// The first local rank of a run removes the segments that killed runs left in /dev/shm (once per process;
/// shm_segment.hpp) and says so on stderr.
/// World rank 0 publishes a random token for the ring names and the ring size (`MPX_SHM_RING_KB`, 8192 by
/// default: messages that do not fit go over Gloo; `MPX_SHM_SPIN_US` is how long a wait spins before it sleeps: 1000 µs by
/// default when the host has a CPU for every rank's threads, else 50). Every
/// `ShmLinks` of a process takes the next set of keys: ranks build their trainers in the same order.
/// Messages on the device (NCCL) never come here.

#include <mpx/runtime/env.hpp>             // mpx::detail::getenv_int, getenv_str
#include <mpx/runtime/errors.hpp>          // mpx::config_error, mpx::peer_error
#include <mpx/runtime/wire/shm_ring.hpp>   // mpx::ShmRing
#include <mpx/runtime/wire/shm_segment.hpp>  // mpx::detail::remove_stale_shm_segments
#include <mpx/runtime/wire/shm_sum.hpp>    // mpx::ShmSum
#include <mpx/runtime/world.hpp>           // mpx::World
#include <mpx/runtime/linkage.hpp>  // MPX_DECL, MPX_DEFINITIONS

#include <sched.h>   // sched_getaffinity, CPU_COUNT
#include <unistd.h>  // readlink

#include <ATen/Parallel.h>  // at::get_num_threads

#include <algorithm>  // std::max

#include <chrono>    // std::chrono
#include <cstdio>    // std::fprintf
#include <fstream>   // std::ifstream
#include <map>       // std::map
#include <memory>    // std::unique_ptr
#include <mutex>     // std::call_once
#include <optional>  // std::optional
#include <random>    // std::random_device
#include <sstream>   // std::ostringstream
#include <string>    // std::string
#include <tuple>     // std::tuple
#include <vector>    // std::vector

namespace mpx
{

namespace detail
{
/// What makes two processes able to share a ring: the same boot and the same namespaces ("" when this
/// system does not say, which shares with nobody).
MPX_DECL std::string host_identity();

/// How long a wait spins before it sleeps unless `MPX_SHM_SPIN_US` says: 1000 µs when this process may
/// use a CPU for every intra-op thread of every rank on the host (a spin then takes a CPU nobody else
/// wants, and a receiver that sleeps costs its sender a futex wake, 10-20 µs on a VM), else 50 µs.
MPX_DECL int default_spin_us(int local_ranks);

/// A process's count of ShmLinks built so far (their store keys).
MPX_DECL int next_shm_links_id();

/// Removes the stale segments of /dev/shm (shm_segment.hpp) the first time a process calls it, saying so on stderr.
MPX_DECL void remove_stale_shm_once();

inline std::string bytes_text(const std::vector<std::uint8_t>& v) { return std::string(v.begin(), v.end()); }
inline std::vector<std::uint8_t> text_bytes(const std::string& s) { return std::vector<std::uint8_t>(s.begin(), s.end()); }
}  // namespace detail

class ShmLinks
{
 public:
  /// `on`: this rank's pipeline messages are CPU tensors (Gloo); otherwise nothing goes through here.
  ShmLinks(World& w, bool on);

  /// The ring that brings `channel`'s messages from slot `src` on `lane`, or null when they come over Gloo.
  ShmRing* incoming(int lane, int src, int channel);
  /// The ring that takes `channel`'s messages to slot `dst` on `lane`, or null when they go over Gloo.
  ShmRing* outgoing(int lane, int dst, int channel);

  /// The world's end-of-step sum through shared memory (wire/shm_sum.hpp) when every rank shares this host,
  /// else null (it goes over Gloo). World rank 0 decides from what each rank published and says so in the
  /// store, so every rank chooses the same way. A collective: every rank calls it once.
  std::unique_ptr<ShmSum> world_sum();

  /// Whether shared memory is on in this process's environment (`MPX_SHM`).
  static bool enabled();

 private:
  ShmRing* ring(int src, int dst, int lane, int channel, ShmRing::End end, int peer);

  bool shares_host(int peer);

  void read_token();

  World& w_;
  bool on_;
  std::string key_, host_, token_;
  std::uint64_t capacity_ = 0;
  std::chrono::microseconds spin_{50};
  std::map<int, bool> shares_;
  std::map<std::tuple<int, int, int, int>, std::unique_ptr<ShmRing>> rings_;
};

}  // namespace mpx

#if MPX_DEFINITIONS
// ---- definitions (compiled once under MPX_SEPARATE_COMPILATION: runtime/linkage.hpp) ----

namespace mpx::detail
{

MPX_DECL std::string host_identity()
{
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::string id;
  if (!std::getline(boot, id) || id.empty()) return "";
  for (const char* ns : {"ipc", "mnt", "net", "pid"}) {
    char buf[128];
    const auto n = ::readlink((std::string("/proc/self/ns/") + ns).c_str(), buf, sizeof buf);
    if (n <= 0) return "";
    id += '|' + std::string(buf, std::size_t(n));
  }
  return id;
}

MPX_DECL int default_spin_us(int local_ranks)
{
  cpu_set_t set;
  CPU_ZERO(&set);
  const int cpus = ::sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
  return local_ranks * std::max(1, at::get_num_threads()) <= cpus ? 1000 : 50;
}

MPX_DECL int next_shm_links_id()
{
  static int next = 0;
  return next++;
}

MPX_DECL void remove_stale_shm_once()
{
  static std::once_flag once;
  std::call_once(once, [] {
    const auto removed = remove_stale_shm_segments();
    if (!removed.empty())
      std::fprintf(stderr, "mpx: removed %s from /dev/shm, left by a run whose ranks were killed\n", describe_removed_segments(removed).c_str());
  });
}

}  // namespace mpx::detail

namespace mpx
{

MPX_DECL ShmLinks::ShmLinks(World& w, bool on)
    : w_(w), on_(on && w.store && w.env.world_size > 1)
{
  if (!on_) return;
  if (w_.env.local_rank == 0) detail::remove_stale_shm_once();
  key_ = "mpx/shm/" + std::to_string(detail::next_shm_links_id()) + "/";
  host_ = enabled() ? detail::host_identity() : "";  // published as it is: "" shares with nobody, not even another ""
  w_.store->set(key_ + "host/" + std::to_string(w_.env.rank), detail::text_bytes("host " + host_));
  if (w_.env.rank == 0) {
    std::random_device rd;
    std::ostringstream token;
    token << std::hex << rd() << rd();
    const int kb = detail::getenv_int("MPX_SHM_RING_KB", 8192);
    if (kb < 4 || kb > (1 << 22) || (kb & (kb - 1)) != 0)
      throw config_error("mpx: MPX_SHM_RING_KB=" + std::to_string(kb) + " must be a power of two from 4 to 4194304 (KiB per ring; tiny rings send most messages over Gloo)");
    w_.store->set(key_ + "token", detail::text_bytes(token.str() + " " + std::to_string(kb)));
  }
  const int spin = detail::getenv_int("MPX_SHM_SPIN_US", detail::default_spin_us(w_.env.local_world_size));
  if (spin < 0 || spin > 1'000'000) throw config_error("mpx: MPX_SHM_SPIN_US=" + std::to_string(spin) + " must be from 0 to 1000000 (µs)");
  spin_ = std::chrono::microseconds(spin);
}

MPX_DECL ShmRing* ShmLinks::incoming(int lane, int src, int channel)
{
  const int peer = w_.global_rank(w_.replica, src, lane % w_.degree[std::size_t(src)]);
  return ring(peer, w_.env.rank, lane, channel, ShmRing::End::receiver, peer);
}

MPX_DECL ShmRing* ShmLinks::outgoing(int lane, int dst, int channel)
{
  const int peer = w_.global_rank(w_.replica, dst, lane % w_.degree[std::size_t(dst)]);
  return ring(w_.env.rank, peer, lane, channel, ShmRing::End::sender, peer);
}

MPX_DECL std::unique_ptr<ShmSum> ShmLinks::world_sum()
{
  if (!on_) return nullptr;
  const std::string key = key_ + "sum";
  if (w_.env.rank == 0) {
    bool all = w_.env.local_world_size >= w_.env.world_size;  // fewer local ranks than the world: the launcher says more than one node
    for (int r = 1; all && r < w_.env.world_size; ++r) all = shares_host(r);
    w_.store->set(key, detail::text_bytes(all && !host_.empty() ? "shm" : "gloo"));
  }
  std::string how;
  try {
    how = detail::bytes_text(w_.store->get(key));
  } catch (const std::exception& e) {
    throw peer_error("mpx: rank " + std::to_string(w_.env.rank) + ": rank 0 did not say how the world sums (shared-memory set-up): " + e.what());
  }
  if (how == "gloo") return nullptr;
  if (how != "shm") throw peer_error("mpx: the run's store holds a malformed choice '" + how + "' for the world's sum");
  read_token();
  return std::make_unique<ShmSum>("/mpx-" + token_ + "-sum", w_.env.world_size, w_.env.rank, w_.timeout, spin_);
}

MPX_DECL bool ShmLinks::enabled()
{
  const auto v = detail::getenv_str("MPX_SHM");
  if (!v || *v == "1") return true;
  if (*v == "0") return false;
  throw config_error("mpx: MPX_SHM=\"" + *v + "\": set it to 1 (pipeline messages between ranks of one host through shared memory, the default) or 0 (over Gloo)");
}

MPX_DECL ShmRing* ShmLinks::ring(int src, int dst, int lane, int channel, ShmRing::End end, int peer)
{
  if (!on_ || !shares_host(peer)) return nullptr;
  auto& slot = rings_[{src, dst, lane, channel}];
  if (!slot) {
    read_token();
    const std::string name = "/mpx-" + token_ + "-" + std::to_string(src) + "-" + std::to_string(dst) + "-" + std::to_string(lane) + "-" +
                             std::to_string(channel);
    slot = std::make_unique<ShmRing>(name, capacity_, end, "rank " + std::to_string(peer), w_.timeout, spin_);
  }
  return slot.get();
}

MPX_DECL bool ShmLinks::shares_host(int peer)
{
  auto it = shares_.find(peer);
  if (it != shares_.end()) return it->second;
  std::string theirs;
  try {
    theirs = detail::bytes_text(w_.store->get(key_ + "host/" + std::to_string(peer)));
  } catch (const std::exception& e) {
    throw peer_error("mpx: rank " + std::to_string(w_.env.rank) + ": rank " + std::to_string(peer) +
                     " did not say where it runs (shared-memory set-up): " + e.what());
  }
  return shares_[peer] = !host_.empty() && theirs == "host " + host_;
}

MPX_DECL void ShmLinks::read_token()
{
  if (!token_.empty()) return;
  std::string v;
  try {
    v = detail::bytes_text(w_.store->get(key_ + "token"));
  } catch (const std::exception& e) {
    throw peer_error("mpx: rank " + std::to_string(w_.env.rank) + ": rank 0 did not publish the shared-memory token: " + e.what());
  }
  std::istringstream in(v);
  long kb = 0;
  if (!(in >> token_ >> kb) || kb < 4 || kb > (1 << 22)) throw peer_error("mpx: the run's store holds a malformed shared-memory token '" + v + "'");
  capacity_ = std::uint64_t(kb) << 10;
}

}  // namespace mpx
#endif  // MPX_DEFINITIONS
