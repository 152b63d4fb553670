// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file runtime/reachability.hpp
/// Can every rank reach every other before Gloo tries? `check_reachable` opens a listening socket on the
/// address this rank's Gloo groups will use, publishes it in the rendezvous store, connects to every other
/// rank's (each connect bounded by the timeout), and publishes what it found; then every rank reads every
/// rank's findings. One unreachable pair stops every rank at once with a `peer_error` naming which rank
/// cannot reach which address and the fix — instead of one side failing inside Gloo and the other waiting
/// for it without end (Gloo's listening side does not time out in LibTorch 1.13).

#include <mpx/runtime/errors.hpp>  // mpx::peer_error, mpx::config_error

#include <torch/csrc/distributed/c10d/Store.hpp>  // c10d::Store

#include <arpa/inet.h>   // inet_pton, inet_ntop
#include <fcntl.h>       // fcntl
#include <ifaddrs.h>     // getifaddrs
#include <netinet/in.h>  // sockaddr_in
#include <poll.h>        // poll
#include <sys/socket.h>  // socket, bind, listen, connect
#include <unistd.h>      // close

#include <cerrno>   // errno
#include <chrono>   // std::chrono::milliseconds
#include <cstring>  // std::strerror
#include <string>   // std::string
#include <vector>   // std::vector

namespace mpx
{

namespace detail
{
/// The IPv4 address of interface `name`, or empty.
inline std::string interface_address(const std::string& name)
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

/// Connects to ip:port within `timeout`; empty on success, else why not.
inline std::string try_connect(const std::string& ip, int port, std::chrono::milliseconds timeout)
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
}  // namespace detail

/// Checks that every rank reaches every other at the address its Gloo groups will listen on (`ip`, an IPv4
/// address of this host); see the file comment. A collective over the store: every rank calls it.
inline void check_reachable(c10d::Store& store, const std::string& ip, int rank, int world, std::chrono::milliseconds timeout)
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
  if (!all.empty())
    throw peer_error("mpx: rank " + std::to_string(rank) + ": the ranks cannot all reach each other: " + all +
                     ". Every node must reach every other node's address: set MASTER_ADDR to an address of the first node that the "
                     "others reach, and GLOO_SOCKET_IFNAME on each node to the interface on that network");
}

}  // namespace mpx
