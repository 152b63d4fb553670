// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file runtime/shm_links.hpp
/// Shared memory between the ranks of one host. Two ranks share a host when their boot id and their IPC,
/// mount, network and PID namespaces are the same (ranks in separate network namespaces count as separate
/// nodes) and both have shared memory on (`Env::shm.on`, MPX_SHM; 0 sends every pipeline message over
/// Gloo). `detail::ShmPeers` is what the ranks agree on through the store, under one key prefix
/// (`World::next_key("shm")`: every use takes the next, ranks build their trainers in the same order): each
/// rank publishes where it runs, and world rank 0 a random token for the segments' names and the ring size
/// (`Env::shm.ring_kb`, rank 0's counts: messages that do not fit go over Gloo). A wait spins
/// `Env::shm.spin_us` before it sleeps (default 1000 µs when the host has a CPU for every rank's threads,
/// else 50). Built on them:
/// - `ShmLinks`: the rings (wire/shm_ring.hpp) to and from this rank's pipeline peers that share its host,
///   each opened at its channel's first message;
/// - `make_world_sum`: the world's end-of-step sum through shared memory (wire/shm_sum.hpp) when every
///   rank shares the host, else null (it goes over Gloo).
/// The first local rank of a run removes the segments that killed runs left in /dev/shm (once per process;
/// wire/shm_segment.hpp) and says so on stderr. Messages on the device (NCCL) never come here.

#include <mpx/linkage.hpp>                 // MPX_DECL, MPX_DEFINITIONS
#include <mpx/runtime/wire/shm_ring.hpp>   // mpx::ShmRing
#include <mpx/runtime/wire/shm_sum.hpp>    // mpx::ShmSum
#include <mpx/runtime/world/world.hpp>     // mpx::World

#include <chrono>   // std::chrono::microseconds
#include <cstdint>  // std::uint64_t
#include <map>      // std::map
#include <memory>   // std::unique_ptr
#include <optional>  // std::optional
#include <string>   // std::string
#include <tuple>    // std::tuple

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

/// Removes the stale segments of /dev/shm (shm_segment.hpp) the first time a process calls it, saying so on stderr.
MPX_DECL void remove_stale_shm_once();

/// What the ranks agree on about shared memory, under one key prefix (see the file comment). Needs a
/// store and a world of more than one rank.
class ShmPeers
{
 public:
  explicit ShmPeers(World& w);
  /// Whether rank `peer` shares this rank's host (read from the store at the first question).
  bool shares_host(int peer);
  /// Whether every rank of the world shares this host (world rank 0 decides and publishes; a collective).
  bool all_share_host();
  /// The run's segment-name token and ring size, from world rank 0 (read at the first use).
  const std::string& token();
  std::uint64_t ring_bytes();
  std::chrono::microseconds spin() const { return spin_; }

 private:
  World& w_;
  std::string key_, host_, token_;
  std::uint64_t ring_bytes_ = 0;
  std::chrono::microseconds spin_{50};
  std::map<int, bool> shares_;
};
}  // namespace detail

/// The shared-memory rings of this rank's pipeline channels (see the file comment).
class ShmLinks
{
 public:
  /// `on`: this rank's pipeline messages are CPU tensors (Gloo); otherwise nothing goes through here.
  ShmLinks(World& w, bool on);

  /// The ring that brings `channel`'s messages from slot `src` on `lane`, or null when they come over Gloo.
  ShmRing* incoming(int lane, int src, int channel);
  /// The ring that takes `channel`'s messages to slot `dst` on `lane`, or null when they go over Gloo.
  ShmRing* outgoing(int lane, int dst, int channel);

 private:
  ShmRing* ring(int src, int dst, int lane, int channel, ShmRing::End end, int peer);

  World& w_;
  std::optional<detail::ShmPeers> peers_;  // none: off
  std::map<std::tuple<int, int, int, int>, std::unique_ptr<ShmRing>> rings_;
};

/// The world's end-of-step sum through shared memory when every rank shares this host, else null (it goes
/// over Gloo). A collective: every rank calls it, and all choose the same way.
MPX_DECL std::unique_ptr<ShmSum> make_world_sum(World& w);

}  // namespace mpx

#if MPX_DEFINITIONS
// ---- definitions (compiled once under MPX_SEPARATE_COMPILATION: linkage.hpp) ----
#include <mpx/errors.hpp>                    // mpx::config_error, mpx::peer_error
#include <mpx/runtime/wire/shm_segment.hpp>  // mpx::detail::remove_stale_shm_segments

#include <ATen/Parallel.h>  // at::get_num_threads

#include <sched.h>   // sched_getaffinity, CPU_COUNT
#include <unistd.h>  // readlink

#include <algorithm>  // std::max
#include <cstdio>     // std::fprintf
#include <fstream>    // std::ifstream
#include <mutex>      // std::call_once
#include <random>     // std::random_device
#include <sstream>    // std::ostringstream, std::istringstream
#include <vector>     // std::vector

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

MPX_DECL void remove_stale_shm_once()
{
  static std::once_flag once;
  std::call_once(once, [] {
    const auto removed = remove_stale_shm_segments();
    if (!removed.empty())
      std::fprintf(stderr, "mpx: removed %s from /dev/shm, left by a run whose ranks were killed\n", describe_removed_segments(removed).c_str());
  });
}

inline std::string bytes_text(const std::vector<std::uint8_t>& v) { return std::string(v.begin(), v.end()); }
inline std::vector<std::uint8_t> text_bytes(const std::string& s) { return std::vector<std::uint8_t>(s.begin(), s.end()); }

MPX_DECL ShmPeers::ShmPeers(World& w) : w_(w), key_(w.next_key("shm"))
{
  if (w_.env.local_rank == 0) remove_stale_shm_once();
  host_ = w_.env.shm.on ? host_identity() : "";  // published as it is: "" shares with nobody, not even another ""
  w_.store->set(key_ + "host/" + std::to_string(w_.env.rank), text_bytes("host " + host_));
  if (w_.env.rank == 0) {
    std::random_device rd;
    std::ostringstream token;
    token << std::hex << rd() << rd();
    w_.store->set(key_ + "token", text_bytes(token.str() + " " + std::to_string(w_.env.shm.ring_kb)));
  }
  spin_ = std::chrono::microseconds(w_.env.shm.spin_us.value_or(default_spin_us(w_.env.local_world_size)));
}

MPX_DECL bool ShmPeers::shares_host(int peer)
{
  auto it = shares_.find(peer);
  if (it != shares_.end()) return it->second;
  std::string theirs;
  try {
    theirs = bytes_text(w_.store->get(key_ + "host/" + std::to_string(peer)));
  } catch (const std::exception& e) {
    throw peer_error("mpx: rank " + std::to_string(w_.env.rank) + ": rank " + std::to_string(peer) +
                     " did not say where it runs (shared-memory set-up): " + e.what());
  }
  return shares_[peer] = !host_.empty() && theirs == "host " + host_;
}

MPX_DECL bool ShmPeers::all_share_host()
{
  const std::string key = key_ + "sum";
  if (w_.env.rank == 0) {
    bool all = w_.env.local_world_size >= w_.env.world_size;  // fewer local ranks than the world: the launcher says more than one node
    for (int r = 1; all && r < w_.env.world_size; ++r) all = shares_host(r);
    w_.store->set(key, text_bytes(all && !host_.empty() ? "shm" : "gloo"));
  }
  std::string how;
  try {
    how = bytes_text(w_.store->get(key));
  } catch (const std::exception& e) {
    throw peer_error("mpx: rank " + std::to_string(w_.env.rank) + ": rank 0 did not say how the world sums (shared-memory set-up): " + e.what());
  }
  if (how != "shm" && how != "gloo") throw peer_error("mpx: the run's store holds a malformed choice '" + how + "' for the world's sum");
  return how == "shm";
}

MPX_DECL const std::string& ShmPeers::token()
{
  if (!token_.empty()) return token_;
  std::string v;
  try {
    v = bytes_text(w_.store->get(key_ + "token"));
  } catch (const std::exception& e) {
    throw peer_error("mpx: rank " + std::to_string(w_.env.rank) + ": rank 0 did not publish the shared-memory token: " + e.what());
  }
  std::istringstream in(v);
  long kb = 0;
  if (!(in >> token_ >> kb) || kb < 4 || kb > (1 << 22)) throw peer_error("mpx: the run's store holds a malformed shared-memory token '" + v + "'");
  ring_bytes_ = std::uint64_t(kb) << 10;
  return token_;
}

MPX_DECL std::uint64_t ShmPeers::ring_bytes()
{
  token();
  return ring_bytes_;
}

}  // namespace mpx::detail

namespace mpx
{

MPX_DECL ShmLinks::ShmLinks(World& w, bool on) : w_(w)
{
  if (on && w.store && w.env.world_size > 1) peers_.emplace(w);
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

MPX_DECL ShmRing* ShmLinks::ring(int src, int dst, int lane, int channel, ShmRing::End end, int peer)
{
  if (!peers_ || !peers_->shares_host(peer)) return nullptr;
  auto& r = rings_[{src, dst, lane, channel}];
  if (!r) {
    const std::string name = "/mpx-" + peers_->token() + "-" + std::to_string(src) + "-" + std::to_string(dst) + "-" + std::to_string(lane) + "-" +
                             std::to_string(channel);
    r = std::make_unique<ShmRing>(name, peers_->ring_bytes(), end, "rank " + std::to_string(peer), w_.timeout, peers_->spin());
  }
  return r.get();
}

MPX_DECL std::unique_ptr<ShmSum> make_world_sum(World& w)
{
  if (!w.store || w.env.world_size <= 1) return nullptr;
  detail::ShmPeers peers(w);
  if (!peers.all_share_host()) return nullptr;
  return std::make_unique<ShmSum>("/mpx-" + peers.token() + "-sum", w.env.world_size, w.env.rank, w.timeout, peers.spin());
}

}  // namespace mpx
#endif  // MPX_DEFINITIONS
