// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file runtime/launch.hpp
/// Starting ranks without Python: `mpx::launch` forks one process per local rank with torchrun's
/// variables set, prefixes every line they print with `[rank r] `, forwards SIGINT/SIGTERM, and when a
/// rank fails reports it first (rank, exit status or signal, its last lines), lets the others stop by
/// themselves for a moment (their named errors), ends them, and restarts the job up to `max_restarts`
/// times on a fresh rendezvous. Ranks die with their launcher (parent-death signal). Once they have ended,
/// it removes the shared-memory segments that killed ranks left in /dev/shm (wire/shm_segment.hpp). `mpxrun`
/// (tools/mpxrun.cpp) is this function behind a command line; a program started without RANK can also
/// launch its own local ranks with `mpx::relaunch_self` (the examples do).

#include <mpx/runtime/linkage.hpp>  // MPX_DECL, MPX_DEFINITIONS

#include <chrono>  // std::chrono::milliseconds
#include <string>  // std::string
#include <vector>  // std::vector

namespace mpx
{

/// What `launch` starts.
struct LaunchOptions
{
  int nproc_per_node = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;  ///< 0: pick a free port (single node only), a fresh one for every restart
  std::chrono::milliseconds grace{5000};   ///< after SIGTERM, how long before SIGKILL
  std::chrono::milliseconds notice{3000};  ///< after the first failure, how long the others have to stop by
                                           ///< themselves (printing their named errors) before SIGTERM
  int max_restarts = 0;  ///< after a failure, start every rank again (a fresh rendezvous) up to this many times
  int tail_lines = 10;   ///< the first failing rank's last lines, quoted in the report
  bool prefix_output = true;
};

/// Starts `argv` once per local rank and supervises the ranks. When a rank fails, the launcher reports it
/// first (rank, exit status or signal, its last lines; a rank seen stopped before it), gives the others
/// `notice` to stop by themselves (their named errors), then SIGTERM, then SIGKILL after `grace`. With
/// `max_restarts` K it then starts every rank again on a fresh rendezvous (TORCHELASTIC_RESTART_COUNT set to
/// the attempt: programs resume from their checkpoint) up to K times, logging each restart's cause. Ranks
/// die with the launcher (parent-death signal). Returns 0 when all ranks exit 0, else the exit status of
/// the first rank that failed in the last attempt (128 + signal for a signal).
MPX_DECL int launch(const LaunchOptions& o, const std::vector<std::string>& argv);

/// For programs that launch their own local ranks: when RANK is not set, starts this executable
/// `nproc` times under `launch` and returns its status (the caller exits with it); when RANK is set,
/// returns -1 and the caller goes on as one rank.
MPX_DECL int relaunch_self(int nproc, int argc, char** argv, int max_restarts = 0);

}  // namespace mpx

#if MPX_DEFINITIONS
// ---- definitions (compiled once under MPX_SEPARATE_COMPILATION: runtime/linkage.hpp) ----
#include <mpx/runtime/env.hpp>     // mpx::read_env
#include <mpx/runtime/errors.hpp>  // mpx::config_error
#include <mpx/runtime/wire/shm_segment.hpp>  // mpx::detail::remove_stale_shm_segments

#include <arpa/inet.h>   // htonl
#include <netinet/in.h>  // sockaddr_in
#include <poll.h>        // poll
#include <signal.h>      // kill, sigaction
#include <fcntl.h>       // fcntl
#include <string.h>      // sigabbrev_np
#include <sys/prctl.h>   // prctl(PR_SET_PDEATHSIG)
#include <sys/socket.h>  // socket, bind
#include <sys/wait.h>    // waitpid
#include <unistd.h>      // fork, execvp, pipe

#include <algorithm>  // std::count_if
#include <cerrno>    // errno
#include <chrono>    // std::chrono
#include <cstdio>    // std::fwrite, std::fprintf
#include <cstdlib>   // std::getenv
#include <cstring>   // std::strerror
#include <deque>     // std::deque
#include <random>    // std::random_device
#include <string>    // std::string
#include <vector>    // std::vector

namespace mpx
{

namespace detail
{
inline volatile sig_atomic_t launch_signal = 0;
inline void on_launch_signal(int sig) { launch_signal = sig; }
inline void on_child_signal(int) {}  // only wakes poll()

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

/// " at 3.2 s".
inline std::string fmt_seconds(std::chrono::steady_clock::duration d)
{
  char buf[32];
  std::snprintf(buf, sizeof buf, " at %.1f s", std::chrono::duration<double>(d).count());
  return buf;
}

/// "signal 9 (SIGKILL)".
inline std::string signal_text(int sig)
{
  const char* abbrev = ::sigabbrev_np(sig);
  return "signal " + std::to_string(sig) + (abbrev ? std::string(" (SIG") + abbrev + ")" : std::string());
}

/// How a wait status ended: "exited with status 7", "was killed by signal 9 (SIGKILL)".
inline std::string status_text(int status)
{
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return "was killed by " + signal_text(WTERMSIG(status)) + (WCOREDUMP(status) ? ", core dumped" : "");
  return "ended with wait status " + std::to_string(status);
}

inline int exit_code(int status)
{
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

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

/// One local rank as the launcher sees it: its process, its output (read from a pipe, line by line, the
/// last lines kept for the report) and how it ended.
struct child
{
  pid_t pid = -1;
  int fd = -1;  // read end of its stdout+stderr, non-blocking
  int rank = 0;
  std::string pending;
  std::deque<std::string> tail;
  bool running = true;
  int status = 0;
  std::chrono::steady_clock::time_point stopped{};  // when it was seen stopped (SIGSTOP, SIGTSTP), if it was

  void print_lines(const LaunchOptions& o, bool all)
  {
    std::size_t nl;
    while ((nl = pending.find('\n')) != std::string::npos) {
      emit(o, pending.substr(0, nl));
      pending.erase(0, nl + 1);
    }
    if (all && !pending.empty()) {
      emit(o, pending);
      pending.clear();
    }
  }
  void emit(const LaunchOptions& o, const std::string& line)
  {
    write_all((o.prefix_output ? "[rank " + std::to_string(rank) + "] " : std::string()) + line + "\n");
    tail.push_back(line);
    if (int(tail.size()) > o.tail_lines) tail.pop_front();
  }
  /// Reads what is in its pipe now; at the end of the output (or an error) closes the pipe.
  void read_output(const LaunchOptions& o)
  {
    while (fd >= 0) {
      char buf[4096];
      const ssize_t n = ::read(fd, buf, sizeof buf);
      if (n > 0) {
        pending.append(buf, std::size_t(n));
        print_lines(o, false);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno == EAGAIN) return;
      print_lines(o, true);
      ::close(fd);
      fd = -1;
    }
  }
};

/// The start of one rank: torchrun's variables, its own process group, and death with the launcher.
[[noreturn]] inline void exec_rank(const LaunchOptions& o, const std::vector<std::string>& argv, int local, int world, int port,
                                   const std::string& secret, int attempt, pid_t launcher, int out_fd)
{
  ::setpgid(0, 0);                    // each rank leads its own process group: signals reach whatever it started
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // the launcher dies (even by SIGKILL): so does the rank, no orphan trains on
  if (::getppid() != launcher) ::_exit(1);  // it died before prctl took hold
  ::signal(SIGINT, SIG_DFL);
  ::signal(SIGTERM, SIG_DFL);
  ::signal(SIGCHLD, SIG_DFL);
  ::dup2(out_fd, 1);
  ::dup2(out_fd, 2);
  ::close(out_fd);
  const int rank = o.node_rank * o.nproc_per_node + local;
  ::setenv("RANK", std::to_string(rank).c_str(), 1);
  ::setenv("LOCAL_RANK", std::to_string(local).c_str(), 1);
  ::setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
  ::setenv("LOCAL_WORLD_SIZE", std::to_string(o.nproc_per_node).c_str(), 1);
  ::setenv("GROUP_RANK", std::to_string(o.node_rank).c_str(), 1);
  ::setenv("MASTER_ADDR", o.master_addr.c_str(), 1);
  ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
  ::setenv("TORCHELASTIC_RESTART_COUNT", std::to_string(attempt).c_str(), 1);  // as torchrun: programs resume, keys differ
  ::setenv("TORCHELASTIC_MAX_RESTARTS", std::to_string(o.max_restarts).c_str(), 1);
  if (!secret.empty()) ::setenv("MPX_STORE_SECRET", secret.c_str(), 1);
  std::vector<char*> args;
  for (auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  ::execvp(args[0], args.data());
  std::fprintf(stderr, "mpx::launch: cannot start %s: %s\n", args[0], std::strerror(errno));
  ::_exit(127);
}

/// How one attempt ended.
struct attempt_result
{
  int code = 0;            // 0, the first failing rank's exit code, or 128 + a forwarded signal
  int interrupted = 0;     // the signal the launcher itself got (Ctrl-C, SIGTERM): no restart
  std::string cause;       // "rank 1 was killed by signal 9 (SIGKILL)"
};

/// Removes what ranks killed before their peers opened it left in /dev/shm (shm_segment.hpp), saying so.
inline void remove_leftover_shm()
{
  const auto removed = remove_stale_shm_segments();
  if (!removed.empty()) write_all("mpx::launch: removed " + describe_removed_segments(removed) + " from /dev/shm, left by ranks that were killed\n");
}

/// Starts every local rank once and supervises them until all have ended (see `launch`).
inline attempt_result run_attempt(const LaunchOptions& o, const std::vector<std::string>& argv, int attempt)
{
  using clock = std::chrono::steady_clock;
  const int port = o.master_port != 0 ? o.master_port : free_port();  // a fresh rendezvous for every attempt
  const int world = o.nnodes * o.nproc_per_node;
  const std::string secret = store_secret(o.nnodes);
  const pid_t self = ::getpid();
  const auto started = clock::now();

  std::vector<child> kids(std::size_t(o.nproc_per_node));
  for (int local = 0; local < o.nproc_per_node; ++local) {
    int fds[2];
    if (::pipe(fds) != 0) throw config_error(std::string("mpx::launch: pipe(): ") + std::strerror(errno));
    const pid_t pid = ::fork();
    if (pid < 0) throw config_error(std::string("mpx::launch: fork(): ") + std::strerror(errno));
    if (pid == 0) {
      ::close(fds[0]);
      exec_rank(o, argv, local, world, port, secret, attempt, self, fds[1]);
    }
    ::setpgid(pid, pid);  // also here, so it holds before the parent signals
    ::close(fds[1]);
    ::fcntl(fds[0], F_SETFL, ::fcntl(fds[0], F_GETFL) | O_NONBLOCK);
    auto& k = kids[std::size_t(local)];
    k.pid = pid, k.fd = fds[0], k.rank = o.node_rank * o.nproc_per_node + local;
  }

  attempt_result out;
  constexpr auto never = clock::time_point::max();
  auto term_at = never, kill_at = never, drained_by = never;
  int forwarded = 0;
  auto signal_all = [&](int sig) {  // the rank and everything in its process group
    for (auto& k : kids)
      if (k.running) {
        ::kill(-k.pid, sig);
        if (sig == SIGTERM) ::kill(-k.pid, SIGCONT);  // a stopped rank acts on SIGTERM only once continued
      }
  };
  auto alive = [&] { return std::count_if(kids.begin(), kids.end(), [](auto& k) { return k.running; }); };
  auto open = [&] { return std::count_if(kids.begin(), kids.end(), [](auto& k) { return k.fd >= 0; }); };
  // the root cause, before anything else: which rank, how, its last words (and a rank seen stopped before it)
  auto report_first = [&](child& k) {
    k.read_output(o);  // its last lines first
    std::string stopped;  // a rank stopped before it: its peers then time out, the likelier root cause
    for (auto& s : kids)
      if (s.running && s.stopped != clock::time_point{})
        stopped += "; rank " + std::to_string(s.rank) + " was stopped (SIGSTOP or SIGTSTP)" + fmt_seconds(s.stopped - started) +
                   " and never continued, so its peers could not go on";
    out.cause = "rank " + std::to_string(k.rank) + " " + status_text(k.status);
    std::string msg = "mpx::launch: " + out.cause + fmt_seconds(clock::now() - started) + ", the first rank to fail" + stopped + "\n";
    out.cause += stopped.empty() ? "" : " (" + stopped.substr(2) + ")";
    if (!k.tail.empty()) {
      msg += "mpx::launch: rank " + std::to_string(k.rank) + "'s last lines:\n";
      for (auto& l : k.tail) msg += "  | " + l + "\n";
    }
    if (alive() > 0)
      msg += "mpx::launch: the other ranks have " + std::to_string(o.notice.count()) + " ms to stop by themselves, then SIGTERM (SIGKILL " +
             std::to_string(o.grace.count()) + " ms later)\n";
    write_all(msg);
    out.code = exit_code(k.status);
    term_at = clock::now() + o.notice;
  };

  while (alive() > 0 || open() > 0) {
    const auto now = clock::now();
    if (alive() == 0) {  // all ranks are gone: give their output a moment, then stop reading (a stray
      if (drained_by == never) drained_by = now + o.grace;  // grandchild may still hold a pipe open)
      if (now > drained_by) {
        for (auto& k : kids)
          if (k.fd >= 0) k.print_lines(o, true), ::close(k.fd), k.fd = -1;
        break;
      }
    }
    if (launch_signal != 0 && forwarded != launch_signal) {  // forward Ctrl-C / SIGTERM once
      forwarded = launch_signal;
      signal_all(forwarded);
      if (kill_at == never) kill_at = now + o.grace;
    }
    if (now > term_at) {
      signal_all(SIGTERM);
      term_at = never;
      kill_at = now + o.grace;
    }
    if (now > kill_at) {
      signal_all(SIGKILL);
      kill_at = never;
    }
    // reap before reading: a rank's end is known before its peers' reactions to it are printed
    for (auto& k : kids) {
      if (!k.running) continue;
      int st = 0;
      const pid_t r = ::waitpid(k.pid, &st, WNOHANG | WUNTRACED | WCONTINUED);
      if (r != k.pid) continue;
      if (WIFSTOPPED(st)) {
        k.stopped = clock::now();
        continue;
      }
      if (WIFCONTINUED(st)) {
        k.stopped = {};
        continue;
      }
      k.running = false;
      k.status = st;
      if (exit_code(st) != 0 && out.cause.empty() && forwarded == 0) report_first(k);
    }
    std::vector<pollfd> pf;
    for (auto& k : kids)
      if (k.fd >= 0) pf.push_back({k.fd, POLLIN, 0});
    if (!pf.empty()) ::poll(pf.data(), pf.size(), 100);  // SIGCHLD interrupts it
    else ::usleep(100 * 1000);
    for (auto& k : kids) k.read_output(o);
  }
  out.interrupted = forwarded;
  if (out.cause.empty() && forwarded != 0) out.code = 128 + forwarded;
  remove_leftover_shm();
  return out;
}

}  // namespace detail

MPX_DECL int launch(const LaunchOptions& o, const std::vector<std::string>& argv)
{
  using namespace detail;
  if (argv.empty()) throw config_error("mpx::launch: no program given; pass the program and its arguments");
  if (o.nproc_per_node < 1) throw config_error("mpx::launch: --nproc-per-node must be at least 1");
  if (o.nnodes < 1 || o.node_rank < 0 || o.node_rank >= o.nnodes)
    throw config_error("mpx::launch: --node-rank must be in [0, --nnodes)");
  if (o.master_port == 0 && o.nnodes > 1)
    throw config_error("mpx::launch: several nodes need an agreed --master-port; pass the same one on every node");
  if (o.max_restarts < 0) throw config_error("mpx::launch: --max-restarts must be 0 or more");
  if (o.max_restarts > 0 && o.nnodes > 1)
    throw config_error("mpx::launch: --max-restarts restarts one node's ranks, and the launchers of several nodes cannot agree "
                       "when to restart together; on several nodes use torchrun --max-restarts with its c10d rendezvous, or "
                       "restart the job (programs resume from their checkpoint)");

  struct sigaction sa{}, chld{};
  sa.sa_handler = on_launch_signal;
  sigemptyset(&sa.sa_mask);
  chld.sa_handler = on_child_signal;  // no SA_RESTART: a rank's end interrupts poll()
  sigemptyset(&chld.sa_mask);
  struct sigaction old_int{}, old_term{}, old_chld{};
  sigaction(SIGINT, &sa, &old_int);
  sigaction(SIGTERM, &sa, &old_term);
  sigaction(SIGCHLD, &chld, &old_chld);
  launch_signal = 0;
  attempt_result r;
  for (int attempt = 0;; ++attempt) {
    r = run_attempt(o, argv, attempt);
    if (r.code == 0 || r.interrupted != 0 || attempt == o.max_restarts) break;
    write_all("mpx::launch: restart " + std::to_string(attempt + 1) + " of " + std::to_string(o.max_restarts) + " (" + r.cause +
              "): starting all " + std::to_string(o.nproc_per_node) + " ranks again on a fresh rendezvous\n");
  }
  sigaction(SIGINT, &old_int, nullptr);
  sigaction(SIGTERM, &old_term, nullptr);
  sigaction(SIGCHLD, &old_chld, nullptr);
  if (!r.cause.empty())
    write_all("mpx::launch: the run failed: " + r.cause + " first" +
              (o.max_restarts > 0 ? " (after " + std::to_string(o.max_restarts) + " restarts)" : std::string()) + "; exit status " +
              std::to_string(r.code) + "\n");
  return r.code;
}

MPX_DECL int relaunch_self(int nproc, int argc, char** argv, int max_restarts)
{
  if (read_env().launched()) return -1;
  std::vector<std::string> args{"/proc/self/exe"};
  for (int i = 1; i < argc; ++i) args.emplace_back(argv[i]);
  LaunchOptions o;
  o.nproc_per_node = nproc;
  o.max_restarts = max_restarts;
  if (const char* port = std::getenv("MASTER_PORT")) o.master_port = std::atoi(port);
  return launch(o, args);
}

}  // namespace mpx
#endif  // MPX_DEFINITIONS
