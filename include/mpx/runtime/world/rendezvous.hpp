// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file runtime/world/rendezvous.hpp
/// How the ranks of a job find each other. `make_store` joins the rendezvous store at MASTER_ADDR:PORT:
/// rank 0 serves it (mpxrun, srun, mpirun), or every rank joins as a client the one torchrun's agent
/// already serves (TORCHELASTIC_USE_AGENT_STORE); the run's keys live under a prefix of the restart
/// (`mpx/<restart>/`, TORCHELASTIC_RESTART_COUNT), so a restarted job never reads an earlier attempt's —
/// and under the run's secret (`MPX_STORE_SECRET`, which mpxrun and relaunch_self create for a single node):
/// LibTorch 1.13's store has no authentication and listens on every interface, and it cannot list keys, so
/// a client that does not know the secret can neither read nor change the run's keys (it cannot name them).
/// `gloo_endpoint` chooses where this rank's Gloo groups listen: the interface GLOO_SOCKET_IFNAME names, or
/// this host's address of the route to MASTER_ADDR (never what the host name resolves to: loopback on a
/// default Debian). `check_reachable`, before Gloo tries: every rank listens on that address, publishes it
/// in the store and connects to every other rank's (each connect bounded by the timeout), then reads
/// everyone's findings, so one unreachable pair stops every rank at once with a `peer_error` naming the
/// pair and the fix — instead of one side failing inside Gloo and the other waiting without end (Gloo's
/// listening side does not time out in LibTorch 1.13).

#include <mpx/runtime/launch/env.hpp>      // mpx::Env
#include <mpx/errors.hpp>   // mpx::peer_error, mpx::config_error
#include <mpx/linkage.hpp>  // MPX_DECL, MPX_DEFINITIONS

#include <torch/csrc/distributed/c10d/Store.hpp>  // c10d::Store

#include <chrono>   // std::chrono::milliseconds
#include <string>   // std::string

namespace mpx
{

/// Joins (or serves) the run's rendezvous store (see the file comment).
MPX_DECL c10::intrusive_ptr<c10d::Store> make_store(const Env& env, std::chrono::milliseconds timeout);

namespace detail
{
/// Where this rank's Gloo groups listen and what they tell their peers: an interface by name
/// (`GLOO_SOCKET_IFNAME`), or an address of this host.
struct GlooEndpoint
{
  std::string interface;  ///< GLOO_SOCKET_IFNAME when set (its first name)
  std::string address;    ///< else: the local address of the route to MASTER_ADDR (loopback for a local master)
  std::string describe() const { return interface.empty() ? "address " + address : "interface " + interface + " (GLOO_SOCKET_IFNAME)"; }
};

/// The local address this host uses to reach `host` (the kernel's route choice: a UDP socket connected
/// to it sends nothing); empty when there is no route or `host` does not resolve.
MPX_DECL std::string route_address(const std::string& host, int port);

/// This rank's Gloo endpoint (see GlooEndpoint): `e.gloo_socket_ifname` (GLOO_SOCKET_IFNAME) if set, else the route to the master.
MPX_DECL GlooEndpoint gloo_endpoint(const Env& e);

}  // namespace detail

namespace detail
{
/// The IPv4 address of interface `name`, or empty.
MPX_DECL std::string interface_address(const std::string& name);

/// Connects to ip:port within `timeout`; empty on success, else why not.
MPX_DECL std::string try_connect(const std::string& ip, int port, std::chrono::milliseconds timeout);
}  // namespace detail

/// Checks that every rank reaches every other at the address its Gloo groups will listen on (`ip`, an IPv4
/// address of this host); see the file comment. A collective over the store: every rank calls it.
MPX_DECL void check_reachable_at(c10d::Store& store, const std::string& ip, int rank, int world, std::chrono::milliseconds timeout);


/// `check_reachable_at` this rank's Gloo endpoint (IPv4; an IPv6 endpoint is left to Gloo). A rank that
/// never reports is a `peer_error` after the timeout.
MPX_DECL void check_reachable(c10d::Store& store, const detail::GlooEndpoint& at, const Env& env, std::chrono::milliseconds timeout);

}  // namespace mpx

#if MPX_DEFINITIONS
// ---- definitions (compiled once under MPX_SEPARATE_COMPILATION: linkage.hpp) ----
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>  // c10d::PrefixStore
#include <torch/csrc/distributed/c10d/TCPStore.hpp>     // c10d::TCPStore

#include <arpa/inet.h>   // inet_pton, inet_ntop
#include <netdb.h>       // getaddrinfo
#include <fcntl.h>       // fcntl
#include <ifaddrs.h>     // getifaddrs
#include <netinet/in.h>  // sockaddr_in
#include <poll.h>        // poll
#include <sys/socket.h>  // socket, bind, listen, connect
#include <unistd.h>      // close

#include <cerrno>   // errno
#include <cstring>  // std::strerror
#include <vector>   // std::vector

namespace mpx
{
MPX_DECL c10::intrusive_ptr<c10d::Store> make_store(const Env& env, std::chrono::milliseconds timeout)
{
  c10d::TCPStoreOptions so;
  so.port = static_cast<std::uint16_t>(env.master_port);
  so.isServer = env.rank == 0 && !env.agent_store;
  so.numWorkers = static_cast<std::size_t>(env.world_size);
  so.waitWorkers = true;  // a client counts itself in; the server (ours) waits for all of them
  so.timeout = timeout;
  c10::intrusive_ptr<c10d::Store> store;
  try {
    store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, so);
  } catch (const std::exception& e) {
    throw config_error("mpx: rank " + std::to_string(env.rank) + " could not join the rendezvous at " + env.master_addr + ":" +
                       std::to_string(env.master_port) + " within " + std::to_string(timeout.count()) +
                       " ms (are all WORLD_SIZE=" + std::to_string(env.world_size) + " ranks started, with the same "
                       "MASTER_ADDR/MASTER_PORT?): " + e.what());
  }
  const std::string prefix = "mpx/" + std::to_string(env.restart_count);  // PrefixStore adds the "/"
  return c10::make_intrusive<c10d::PrefixStore>(env.store_secret.empty() ? prefix : env.store_secret + "/" + prefix, store);
}

}  // namespace mpx

namespace mpx::detail
{
MPX_DECL std::string route_address(const std::string& host, int port)
{
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0 || res == nullptr) return {};
  std::string out;
  for (addrinfo* a = res; a != nullptr && out.empty(); a = a->ai_next) {
    const int fd = ::socket(a->ai_family, SOCK_DGRAM, 0);
    if (fd < 0) continue;
    sockaddr_storage local{};
    socklen_t len = sizeof local;
    if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0 && ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
      char text[INET6_ADDRSTRLEN] = {};
      const void* ip = local.ss_family == AF_INET ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&local)->sin_addr)
                                                  : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr);
      if (::inet_ntop(local.ss_family, ip, text, sizeof text)) out = text;
    }
    ::close(fd);
  }
  ::freeaddrinfo(res);
  return out;
}

MPX_DECL GlooEndpoint gloo_endpoint(const Env& e)
{
  if (!e.gloo_socket_ifname.empty()) return {e.gloo_socket_ifname, {}};
  if (e.master_addr == "127.0.0.1" || e.master_addr == "localhost" || e.master_addr == "::1") return {{}, "127.0.0.1"};
  std::string a = route_address(e.master_addr, e.master_port);
  if (a.empty())
    throw config_error("mpx: rank " + std::to_string(e.rank) + ": no route to MASTER_ADDR=" + e.master_addr +
                       " from this host; set MASTER_ADDR to an address every node reaches, or name the interface with GLOO_SOCKET_IFNAME");
  return {{}, a};
}

MPX_DECL std::string interface_address(const std::string& name)
{
  ifaddrs* all = nullptr;
  if (::getifaddrs(&all) != 0) return {};
  std::string out;
  for (ifaddrs* i = all; i != nullptr && out.empty(); i = i->ifa_next)
    if (i->ifa_addr != nullptr && i->ifa_addr->sa_family == AF_INET && name == i->ifa_name) {
      char text[INET_ADDRSTRLEN] = {};
      if (::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, text, sizeof text)) out = text;
    }
  ::freeifaddrs(all);
  return out;
}

/// A TCP socket (IPv4) that closes itself.
struct Socket
{
  int fd = -1;
  Socket() : fd(::socket(AF_INET, SOCK_STREAM, 0)) {}
  ~Socket() { if (fd >= 0) ::close(fd); }
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
};

inline sockaddr_in ipv4(const std::string& ip, int port)
{
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  if (::inet_pton(AF_INET, ip.c_str(), &a.sin_addr) != 1) throw config_error("mpx: '" + ip + "' is not an IPv4 address");
  return a;
}

MPX_DECL std::string try_connect(const std::string& ip, int port, std::chrono::milliseconds timeout)
{
  Socket s;
  if (s.fd < 0) return std::string("socket(): ") + std::strerror(errno);
  ::fcntl(s.fd, F_SETFL, ::fcntl(s.fd, F_GETFL) | O_NONBLOCK);
  const sockaddr_in a = ipv4(ip, port);
  if (::connect(s.fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) == 0) return {};
  if (errno != EINPROGRESS) return std::strerror(errno);
  pollfd p{s.fd, POLLOUT, 0};
  const int n = ::poll(&p, 1, int(timeout.count()));
  if (n == 0) return "no answer within " + std::to_string(timeout.count()) + " ms";
  int err = 0;
  socklen_t len = sizeof err;
  ::getsockopt(s.fd, SOL_SOCKET, SO_ERROR, &err, &len);
  return err == 0 ? std::string() : std::string(std::strerror(err));
}

}  // namespace mpx::detail

namespace mpx
{
MPX_DECL void check_reachable_at(c10d::Store& store, const std::string& ip, int rank, int world, std::chrono::milliseconds timeout)
{
  using namespace detail;
  if (world == 1) return;
  auto text = [](const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); };
  auto bytes = [](const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); };
  Socket listener;
  sockaddr_in a = ipv4(ip, 0);
  socklen_t len = sizeof a;
  if (listener.fd < 0 || ::bind(listener.fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(listener.fd, world) != 0 ||
      ::getsockname(listener.fd, reinterpret_cast<sockaddr*>(&a), &len) != 0)
    throw config_error("mpx: rank " + std::to_string(rank) + ": cannot listen on " + ip + " (" + std::strerror(errno) +
                       "); name an interface of this host with GLOO_SOCKET_IFNAME");
  const std::string mine = ip + ":" + std::to_string(ntohs(a.sin_port));
  store.set("mpx/reach/at/" + std::to_string(rank), bytes(mine));
  std::string found;
  for (int r = 0; r < world && found.empty(); ++r) {
    if (r == rank) continue;
    const std::string key = "mpx/reach/at/" + std::to_string(r);
    store.wait({key}, timeout);
    const std::string at = text(store.get(key));
    const auto colon = at.rfind(':');
    const std::string why = try_connect(at.substr(0, colon), std::stoi(at.substr(colon + 1)), timeout);
    if (!why.empty()) found = "rank " + std::to_string(rank) + " (at " + mine + ") cannot reach rank " + std::to_string(r) + " at " + at + " (" + why + ")";
  }
  store.set("mpx/reach/done/" + std::to_string(rank), bytes(found));
  std::string all;
  for (int r = 0; r < world; ++r) {
    const std::string key = "mpx/reach/done/" + std::to_string(r);
    store.wait({key}, timeout);
    const std::string f = text(store.get(key));
    if (!f.empty()) all += (all.empty() ? "" : "; ") + f;
  }
  if (all.empty()) return;
  // every rank reads the same verdict; rank 0 (the store's host, or on the node of the agent that hosts
  // it) stops only once the others have read it, else they would see the store vanish instead
  store.set("mpx/reach/read/" + std::to_string(rank), bytes("1"));
  if (rank == 0)
    for (int r = 1; r < world; ++r) store.wait({"mpx/reach/read/" + std::to_string(r)}, timeout);
  throw peer_error("mpx: rank " + std::to_string(rank) + ": the ranks cannot all reach each other: " + all +
                     ". Every node must reach every other node's address: set MASTER_ADDR to an address of the first node that the "
                     "others reach, and GLOO_SOCKET_IFNAME on each node to the interface on that network");
}

MPX_DECL void check_reachable(c10d::Store& store, const detail::GlooEndpoint& at, const Env& env, std::chrono::milliseconds timeout)
{
  const std::string ip = at.interface.empty() ? at.address : detail::interface_address(at.interface);
  if (ip.empty() || ip.find(':') != std::string::npos) return;
  try {
    check_reachable_at(store, ip, env.rank, env.world_size, timeout);
  } catch (const peer_error&) {
    throw;
  } catch (const c10::Error& e) {
    throw peer_error("mpx: rank " + std::to_string(env.rank) + ": a rank did not report whether it reaches the others within " +
                     std::to_string(timeout.count()) + " ms (did it die, or is it stuck before the rendezvous?): " + e.what_without_backtrace());
  } catch (const std::exception& e) {  // the store's socket: its host stopped
    throw peer_error("mpx: rank " + std::to_string(env.rank) + ": the rendezvous store (MASTER_ADDR:MASTER_PORT) went away while the ranks checked "
                     "that they reach each other (did the first node stop?): " + e.what());
  }
}

}  // namespace mpx
#endif  // MPX_DEFINITIONS
