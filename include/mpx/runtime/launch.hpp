// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file runtime/launch.hpp
/// Starting ranks without Python: `mpx::launch` forks one process per local rank with torchrun's
/// variables set, prefixes every line they print with `[rank r] `, forwards SIGINT/SIGTERM, ends every
/// rank when one fails and returns the failing rank's exit status. `mpxrun` (tools/mpxrun.cpp) is this
/// function behind a command line; a program started without RANK can also launch its own local ranks
/// with `mpx::relaunch_self` (the examples do).

#include <mpx/runtime/env.hpp>     // mpx::read_env
#include <mpx/runtime/errors.hpp>  // mpx::config_error

#include <arpa/inet.h>   // htonl
#include <netinet/in.h>  // sockaddr_in
#include <poll.h>        // poll
#include <signal.h>      // kill, sigaction
#include <sys/socket.h>  // socket, bind
#include <sys/wait.h>    // waitpid
#include <unistd.h>      // fork, execvp, pipe

#include <cerrno>    // errno
#include <chrono>    // std::chrono
#include <cstdio>    // std::fwrite, std::fprintf
#include <cstdlib>   // std::getenv
#include <cstring>   // std::strerror
#include <random>    // std::random_device
#include <string>    // std::string
#include <vector>    // std::vector

namespace mpx
{

/// What `launch` starts.
struct LaunchOptions
{
  int nproc_per_node = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;  ///< 0: pick a free port (single node only)
  std::chrono::milliseconds grace{5000};  ///< after a failure: SIGTERM, then SIGKILL after this long
  bool prefix_output = true;
};

namespace detail
{
inline volatile sig_atomic_t launch_signal = 0;
inline void on_launch_signal(int sig) { launch_signal = sig; }

/// A per-run secret: 128 random bits as hex (std::random_device reads the kernel's generator).
inline std::string make_secret()
{
  std::random_device rd;
  static constexpr char hex[] = "0123456789abcdef";
  std::string out;
  for (int i = 0; i < 4; ++i) {
    const std::uint32_t x = rd();
    for (int k = 0; k < 8; ++k) out += hex[(x >> (4 * k)) & 15];
  }
  return out;
}

/// The run's store secret: MPX_STORE_SECRET when set, a fresh one for a single node, none (with a warning)
/// for several nodes, whose launchers cannot agree on a fresh one.
inline std::string store_secret(int nnodes)
{
  if (const char* s = std::getenv("MPX_STORE_SECRET"); s != nullptr && *s != 0) return s;
  if (nnodes == 1) return make_secret();
  std::fprintf(stderr, "mpx::launch: several nodes and no MPX_STORE_SECRET: the run's store keys are open to anyone who reaches "
                       "MASTER_PORT; export the same MPX_STORE_SECRET on every node (e.g. openssl rand -hex 16)\n");
  return {};
}

/// A TCP port on 127.0.0.1 that was free a moment ago.
inline int free_port()
{
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw config_error(std::string("mpx: socket(): ") + std::strerror(errno));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    throw config_error(std::string("mpx: bind(): ") + std::strerror(errno));
  }
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

struct child
{
  pid_t pid = -1;
  int fd = -1;  // read end of its stdout+stderr
  int rank = 0;
  std::string pending;
  bool running = true;
  int status = 0;
};

inline void write_all(const std::string& s)
{
  std::size_t off = 0;
  while (off < s.size()) {
    ssize_t n = ::write(1, s.data() + off, s.size() - off);
    if (n <= 0) {
      if (errno == EINTR) continue;
      return;
    }
    off += std::size_t(n);
  }
}

inline void flush_lines(child& c, bool prefix, bool all)
{
  std::size_t nl;
  while ((nl = c.pending.find('\n')) != std::string::npos) {
    write_all((prefix ? "[rank " + std::to_string(c.rank) + "] " : std::string()) + c.pending.substr(0, nl + 1));
    c.pending.erase(0, nl + 1);
  }
  if (all && !c.pending.empty()) {
    write_all((prefix ? "[rank " + std::to_string(c.rank) + "] " : std::string()) + c.pending + "\n");
    c.pending.clear();
  }
}

inline int exit_code(int status)
{
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}
}  // namespace detail

/// Starts `argv` once per local rank and supervises the ranks (see the file comment). Returns 0 when all
/// ranks exit 0, else the exit status of the first rank that failed (128 + signal for a signal).
inline int launch(const LaunchOptions& o, const std::vector<std::string>& argv)
{
  using namespace detail;
  if (argv.empty()) throw config_error("mpx::launch: no program given; pass the program and its arguments");
  if (o.nproc_per_node < 1) throw config_error("mpx::launch: --nproc-per-node must be at least 1");
  if (o.nnodes < 1 || o.node_rank < 0 || o.node_rank >= o.nnodes)
    throw config_error("mpx::launch: --node-rank must be in [0, --nnodes)");
  if (o.master_port == 0 && o.nnodes > 1)
    throw config_error("mpx::launch: several nodes need an agreed --master-port; pass the same one on every node");
  const int port = o.master_port != 0 ? o.master_port : free_port();
  const int world = o.nnodes * o.nproc_per_node;
  const std::string secret = store_secret(o.nnodes);

  struct sigaction sa{};
  sa.sa_handler = on_launch_signal;
  sigemptyset(&sa.sa_mask);
  struct sigaction old_int{}, old_term{};
  sigaction(SIGINT, &sa, &old_int);
  sigaction(SIGTERM, &sa, &old_term);
  launch_signal = 0;

  std::vector<child> kids(std::size_t(o.nproc_per_node));
  for (int local = 0; local < o.nproc_per_node; ++local) {
    int fds[2];
    if (::pipe(fds) != 0) throw config_error(std::string("mpx::launch: pipe(): ") + std::strerror(errno));
    const int rank = o.node_rank * o.nproc_per_node + local;
    const pid_t pid = ::fork();
    if (pid < 0) throw config_error(std::string("mpx::launch: fork(): ") + std::strerror(errno));
    if (pid == 0) {
      ::setpgid(0, 0);  // each rank leads its own process group: signals reach whatever it started
      ::signal(SIGINT, SIG_DFL);
      ::signal(SIGTERM, SIG_DFL);
      ::dup2(fds[1], 1);
      ::dup2(fds[1], 2);
      ::close(fds[0]);
      ::close(fds[1]);
      ::setenv("RANK", std::to_string(rank).c_str(), 1);
      ::setenv("LOCAL_RANK", std::to_string(local).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
      ::setenv("LOCAL_WORLD_SIZE", std::to_string(o.nproc_per_node).c_str(), 1);
      ::setenv("GROUP_RANK", std::to_string(o.node_rank).c_str(), 1);
      ::setenv("MASTER_ADDR", o.master_addr.c_str(), 1);
      ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      if (!secret.empty()) ::setenv("MPX_STORE_SECRET", secret.c_str(), 1);
      std::vector<char*> args;
      for (auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      ::execvp(args[0], args.data());
      std::fprintf(stderr, "mpx::launch: cannot start %s: %s\n", args[0], std::strerror(errno));
      ::_exit(127);
    }
    ::setpgid(pid, pid);  // also here, so it holds before the parent signals
    ::close(fds[1]);
    kids[std::size_t(local)] = child{pid, fds[0], rank, {}, true, 0};
  }

  int failed_code = 0;
  int failed_rank = -1;
  int forwarded = 0;
  auto deadline = std::chrono::steady_clock::time_point::max();
  auto signal_all = [&](int sig) {  // the rank and everything in its process group
    for (auto& k : kids)
      if (k.running) ::kill(-k.pid, sig);
  };
  int open = o.nproc_per_node;
  int alive = o.nproc_per_node;
  auto drained_by = std::chrono::steady_clock::time_point::max();
  while (alive > 0 || open > 0) {
    if (alive == 0) {  // all ranks are gone: give their output a moment, then stop reading (a stray
      const auto now = std::chrono::steady_clock::now();  // grandchild may still hold a pipe open)
      if (drained_by == std::chrono::steady_clock::time_point::max()) drained_by = now + o.grace;
      if (now > drained_by) {
        for (auto& k : kids)
          if (k.fd >= 0) {
            flush_lines(k, o.prefix_output, true);
            ::close(k.fd);
            k.fd = -1;
          }
        break;
      }
    }
    if (launch_signal != 0 && forwarded != launch_signal) {  // forward Ctrl-C / SIGTERM once
      forwarded = launch_signal;
      signal_all(forwarded);
      if (deadline == std::chrono::steady_clock::time_point::max()) deadline = std::chrono::steady_clock::now() + o.grace;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      signal_all(SIGKILL);
      deadline = std::chrono::steady_clock::time_point::max() - std::chrono::hours(1);
    }
    std::vector<pollfd> pf;
    for (auto& k : kids)
      if (k.fd >= 0) pf.push_back({k.fd, POLLIN, 0});
    if (!pf.empty()) ::poll(pf.data(), pf.size(), 100);
    else ::usleep(100 * 1000);
    for (auto& p : pf) {
      if (!(p.revents & (POLLIN | POLLHUP | POLLERR))) continue;
      for (auto& k : kids) {
        if (k.fd != p.fd) continue;
        char buf[4096];
        ssize_t n = ::read(k.fd, buf, sizeof buf);
        if (n > 0) {
          k.pending.append(buf, std::size_t(n));
          flush_lines(k, o.prefix_output, false);
        } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
          flush_lines(k, o.prefix_output, true);
          ::close(k.fd);
          k.fd = -1;
          --open;
        }
      }
    }
    for (auto& k : kids) {
      if (!k.running) continue;
      int st = 0;
      if (::waitpid(k.pid, &st, WNOHANG) == k.pid) {
        k.running = false;
        k.status = st;
        --alive;
        const int code = exit_code(st);
        if (code != 0 && failed_rank < 0) {
          failed_rank = k.rank;
          failed_code = code;
          write_all("mpx::launch: rank " + std::to_string(k.rank) + " exited with status " + std::to_string(code) +
                    "; stopping the other ranks\n");
          signal_all(SIGTERM);
          deadline = std::chrono::steady_clock::now() + o.grace;
        }
      }
    }
  }
  sigaction(SIGINT, &old_int, nullptr);
  sigaction(SIGTERM, &old_term, nullptr);
  if (failed_rank >= 0) return failed_code;
  if (forwarded != 0) return 128 + forwarded;
  return 0;
}

/// For programs that launch their own local ranks: when RANK is not set, starts this executable
/// `nproc` times under `launch` and returns its status (the caller exits with it); when RANK is set,
/// returns -1 and the caller goes on as one rank.
inline int relaunch_self(int nproc, int argc, char** argv)
{
  if (read_env().launched()) return -1;
  std::vector<std::string> args{"/proc/self/exe"};
  for (int i = 1; i < argc; ++i) args.emplace_back(argv[i]);
  LaunchOptions o;
  o.nproc_per_node = nproc;
  if (const char* port = std::getenv("MASTER_PORT")) o.master_port = std::atoi(port);
  return launch(o, args);
}

}  // namespace mpx
