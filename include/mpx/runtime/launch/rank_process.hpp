// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file runtime/launch/rank_process.hpp
/// One local rank's process as the launcher (launch.hpp) sees it. What it is started with (`RankStart`):
/// torchrun's variables, a port that was free (`free_port`) and the run's store secret (`store_secret`);
/// `exec_rank` starts it, in the forked child, in a process group of its own, dying with the launcher
/// (parent-death signal); `RankProcess` reads its output from a pipe line by line, prefixes each line with
/// `[rank r] `, keeps its last lines for the failure report, and `status_text` says how it ended ("was
/// killed by signal 9 (SIGKILL)"). Linux (prctl, pipes, signals).

#include <mpx/linkage.hpp>  // MPX_DECL, MPX_DEFINITIONS

#include <sys/types.h>  // pid_t

#include <chrono>  // std::chrono::steady_clock
#include <deque>   // std::deque
#include <string>  // std::string
#include <vector>  // std::vector

namespace mpx::detail
{

/// " at 3.2 s".
MPX_DECL std::string fmt_seconds(std::chrono::steady_clock::duration d);
/// "signal 9 (SIGKILL)".
MPX_DECL std::string signal_text(int sig);
/// How a wait status ended: "exited with status 7", "was killed by signal 9 (SIGKILL)".
MPX_DECL std::string status_text(int status);
/// The exit code a wait status stands for: its exit status, or 128 + its signal.
MPX_DECL int exit_code(int status);
/// Writes all of `s` to standard output (short writes retried).
MPX_DECL void write_all(const std::string& s);

/// A per-run secret: 128 random bits as hex (std::random_device reads the kernel's generator).
MPX_DECL std::string make_secret();
/// The run's store secret: `given` (MPX_STORE_SECRET) when set, a fresh one for a single node, none (with a
/// warning) for several nodes, whose launchers cannot agree on a fresh one.
MPX_DECL std::string store_secret(const std::string& given, int nnodes);
/// A TCP port on 127.0.0.1 that was free a moment ago.
MPX_DECL int free_port();

/// What a rank is started with: torchrun's variables (and the run's store secret).
struct RankStart
{
  int rank = 0, local_rank = 0, world_size = 1, local_world_size = 1, node_rank = 0;
  std::string master_addr;
  int master_port = 0;
  int attempt = 0, max_restarts = 0;  ///< TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_MAX_RESTARTS
  std::string secret;                 ///< MPX_STORE_SECRET ("": not set)
};

/// One local rank as the launcher sees it: its process, its output (read from a pipe, line by line, the
/// last lines kept for the report) and how it ended.
struct RankProcess
{
  pid_t pid = -1;
  int fd = -1;  ///< read end of its stdout+stderr, non-blocking
  int rank = 0;
  bool prefix_output = true;  ///< "[rank r] " before each line
  int tail_lines = 10;        ///< the last lines kept
  std::string pending;
  std::deque<std::string> tail;
  bool running = true;
  int status = 0;
  std::chrono::steady_clock::time_point stopped{};  ///< when it was seen stopped (SIGSTOP, SIGTSTP), if it was

  /// Prints the complete lines read so far (and, when `all`, the rest).
  void print_lines(bool all);
  /// Prints one line (prefixed) and keeps it among the last lines.
  void emit(const std::string& line);
  /// Reads what is in its pipe now; at the end of the output (or an error) closes the pipe.
  void read_output();
};

/// In the forked child: starts `argv` as the rank `s` describes, its output into `out_fd`, in a process
/// group of its own, killed when `launcher` dies. Never returns.
[[noreturn]] MPX_DECL void exec_rank(const RankStart& s, const std::vector<std::string>& argv, pid_t launcher, int out_fd);

}  // namespace mpx::detail

#if MPX_DEFINITIONS
// ---- definitions (compiled once under MPX_SEPARATE_COMPILATION: linkage.hpp) ----
#include <mpx/errors.hpp>  // mpx::config_error

#include <arpa/inet.h>   // htonl, ntohs
#include <netinet/in.h>  // sockaddr_in
#include <signal.h>      // signal
#include <sys/socket.h>  // socket, bind, getsockname
#include <string.h>     // sigabbrev_np
#include <sys/prctl.h>  // prctl(PR_SET_PDEATHSIG)
#include <sys/wait.h>   // WIFEXITED, WEXITSTATUS, WIFSIGNALED, WTERMSIG
#include <unistd.h>     // execvp, dup2, read, write, setpgid

#include <cerrno>   // errno
#include <cstdio>   // std::snprintf, std::fprintf
#include <cstdlib>  // setenv
#include <cstring>  // std::strerror
#include <random>   // std::random_device

namespace mpx::detail
{

MPX_DECL std::string make_secret()
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

MPX_DECL std::string store_secret(const std::string& given, int nnodes)
{
  if (!given.empty()) return given;
  if (nnodes == 1) return make_secret();
  std::fprintf(stderr, "mpx::launch: several nodes and no MPX_STORE_SECRET: the run's store keys are open to anyone who reaches "
                       "MASTER_PORT; export the same MPX_STORE_SECRET on every node (e.g. openssl rand -hex 16)\n");
  return {};
}

MPX_DECL int free_port()
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

MPX_DECL std::string fmt_seconds(std::chrono::steady_clock::duration d)
{
  char buf[32];
  std::snprintf(buf, sizeof buf, " at %.1f s", std::chrono::duration<double>(d).count());
  return buf;
}

MPX_DECL std::string signal_text(int sig)
{
  const char* abbrev = ::sigabbrev_np(sig);
  return "signal " + std::to_string(sig) + (abbrev ? std::string(" (SIG") + abbrev + ")" : std::string());
}

MPX_DECL std::string status_text(int status)
{
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return "was killed by " + signal_text(WTERMSIG(status)) + (WCOREDUMP(status) ? ", core dumped" : "");
  return "ended with wait status " + std::to_string(status);
}

MPX_DECL int exit_code(int status)
{
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

MPX_DECL void write_all(const std::string& s)
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

MPX_DECL void RankProcess::print_lines(bool all)
{
  std::size_t nl;
  while ((nl = pending.find('\n')) != std::string::npos) {
    emit(pending.substr(0, nl));
    pending.erase(0, nl + 1);
  }
  if (all && !pending.empty()) {
    emit(pending);
    pending.clear();
  }
}

MPX_DECL void RankProcess::emit(const std::string& line)
{
  write_all((prefix_output ? "[rank " + std::to_string(rank) + "] " : std::string()) + line + "\n");
  tail.push_back(line);
  if (int(tail.size()) > tail_lines) tail.pop_front();
}

MPX_DECL void RankProcess::read_output()
{
  while (fd >= 0) {
    char buf[4096];
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n > 0) {
      pending.append(buf, std::size_t(n));
      print_lines(false);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return;
    print_lines(true);
    ::close(fd);
    fd = -1;
  }
}

[[noreturn]] MPX_DECL void exec_rank(const RankStart& s, const std::vector<std::string>& argv, pid_t launcher, int out_fd)
{
  ::setpgid(0, 0);                     // each rank leads its own process group: signals reach whatever it started
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // the launcher dies (even by SIGKILL): so does the rank, no orphan trains on
  if (::getppid() != launcher) ::_exit(1);  // it died before prctl took hold
  ::signal(SIGINT, SIG_DFL);
  ::signal(SIGTERM, SIG_DFL);
  ::signal(SIGCHLD, SIG_DFL);
  ::dup2(out_fd, 1);
  ::dup2(out_fd, 2);
  ::close(out_fd);
  ::setenv("RANK", std::to_string(s.rank).c_str(), 1);
  ::setenv("LOCAL_RANK", std::to_string(s.local_rank).c_str(), 1);
  ::setenv("WORLD_SIZE", std::to_string(s.world_size).c_str(), 1);
  ::setenv("LOCAL_WORLD_SIZE", std::to_string(s.local_world_size).c_str(), 1);
  ::setenv("GROUP_RANK", std::to_string(s.node_rank).c_str(), 1);
  ::setenv("MASTER_ADDR", s.master_addr.c_str(), 1);
  ::setenv("MASTER_PORT", std::to_string(s.master_port).c_str(), 1);
  ::setenv("TORCHELASTIC_RESTART_COUNT", std::to_string(s.attempt).c_str(), 1);  // as torchrun: programs resume, keys differ
  ::setenv("TORCHELASTIC_MAX_RESTARTS", std::to_string(s.max_restarts).c_str(), 1);
  if (!s.secret.empty()) ::setenv("MPX_STORE_SECRET", s.secret.c_str(), 1);
  std::vector<char*> args;
  for (auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  ::execvp(args[0], args.data());
  std::fprintf(stderr, "mpx::launch: cannot start %s: %s\n", args[0], std::strerror(errno));
  ::_exit(127);
}

}  // namespace mpx::detail
#endif  // MPX_DEFINITIONS
