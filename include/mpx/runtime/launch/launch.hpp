// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file runtime/launch/launch.hpp
/// Starting ranks without Python: `mpx::launch` forks one process per local rank with torchrun's
/// variables set, prefixes every line they print with `[rank r] `, forwards SIGINT/SIGTERM, and when a
/// rank fails reports it first (rank, exit status or signal, its last lines), lets the others stop by
/// themselves for a moment (their named errors), ends them, and restarts the job up to `max_restarts`
/// times on a fresh rendezvous. Ranks die with their launcher (parent-death signal). Once they have ended,
/// it removes the shared-memory segments that killed ranks left in /dev/shm (wire/shm_segment.hpp). `mpxrun`
/// (tools/mpxrun.cpp) is this function behind a command line; a program started without RANK can also
/// launch its own local ranks with `mpx::relaunch_self` (the examples do).

#include <mpx/linkage.hpp>  // MPX_DECL, MPX_DEFINITIONS

#include <chrono>  // std::chrono::milliseconds
#include <string>  // std::string
#include <vector>  // std::vector

namespace mpx
{

/// The exit status of a rank that saved a checkpoint and asks to be started again on a new plan (a straggler's
/// re-plan, speed_watch.hpp): a launcher with restarts left (`max_restarts`) starts every rank again.
inline constexpr int replan_exit_status = 75;

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
// ---- definitions (compiled once under MPX_SEPARATE_COMPILATION: linkage.hpp) ----
#include <mpx/errors.hpp>                      // mpx::config_error
#include <mpx/runtime/launch/env.hpp>           // mpx::read_env
#include <mpx/runtime/launch/rank_process.hpp>  // mpx::detail::RankProcess, exec_rank, status_text
#include <mpx/runtime/wire/shm_segment.hpp>     // mpx::detail::remove_stale_shm_segments

#include <fcntl.h>       // fcntl
#include <poll.h>        // poll
#include <signal.h>      // kill, sigaction
#include <sys/wait.h>    // waitpid
#include <unistd.h>      // fork, pipe

#include <algorithm>  // std::count_if
#include <cerrno>     // errno
#include <cstdio>     // std::fprintf
#include <cstring>    // std::strerror

namespace mpx
{

namespace detail
{
inline volatile sig_atomic_t launch_signal = 0;
inline void on_launch_signal(int sig) { launch_signal = sig; }
inline void on_child_signal(int) {}  // only wakes poll()

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

/// Starts every local rank of attempt `attempt` (a fresh rendezvous: a free port unless one is given, a
/// fresh secret unless MPX_STORE_SECRET gives one), each with its output on a pipe.
inline std::vector<RankProcess> start_ranks(const LaunchOptions& o, const std::vector<std::string>& argv, int attempt, const std::string& secret)
{
  RankStart s;
  s.world_size = o.nnodes * o.nproc_per_node, s.local_world_size = o.nproc_per_node, s.node_rank = o.node_rank;
  s.master_addr = o.master_addr, s.master_port = o.master_port != 0 ? o.master_port : free_port();
  s.attempt = attempt, s.max_restarts = o.max_restarts, s.secret = store_secret(secret, o.nnodes);
  const pid_t self = ::getpid();
  std::vector<RankProcess> ranks(std::size_t(o.nproc_per_node));
  for (int local = 0; local < o.nproc_per_node; ++local) {
    s.local_rank = local, s.rank = o.node_rank * o.nproc_per_node + local;
    int fds[2];
    if (::pipe(fds) != 0) throw config_error(std::string("mpx::launch: pipe(): ") + std::strerror(errno));
    const pid_t pid = ::fork();
    if (pid < 0) throw config_error(std::string("mpx::launch: fork(): ") + std::strerror(errno));
    if (pid == 0) {
      ::close(fds[0]);
      exec_rank(s, argv, self, fds[1]);
    }
    ::setpgid(pid, pid);  // also here, so it holds before the parent signals
    ::close(fds[1]);
    ::fcntl(fds[0], F_SETFL, ::fcntl(fds[0], F_GETFL) | O_NONBLOCK);
    auto& k = ranks[std::size_t(local)];
    k.pid = pid, k.fd = fds[0], k.rank = s.rank, k.prefix_output = o.prefix_output, k.tail_lines = o.tail_lines;
  }
  return ranks;
}

/// Starts every local rank once and supervises them until all have ended (see `launch`).
inline attempt_result run_attempt(const LaunchOptions& o, const std::vector<std::string>& argv, int attempt, const std::string& secret)
{
  using clock = std::chrono::steady_clock;
  const auto started = clock::now();
  std::vector<RankProcess> kids = start_ranks(o, argv, attempt, secret);

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
  auto report_first = [&](RankProcess& k) {
    k.read_output();  // its last lines first
    std::string stopped;  // a rank stopped before it: its peers then time out, the likelier root cause
    for (auto& s : kids)
      if (s.running && s.stopped != clock::time_point{})
        stopped += "; rank " + std::to_string(s.rank) + " was stopped (SIGSTOP or SIGTSTP)" + fmt_seconds(s.stopped - started) +
                   " and never continued, so its peers could not go on";
    out.cause = "rank " + std::to_string(k.rank) + " " + status_text(k.status) +
                (exit_code(k.status) == replan_exit_status ? ": it saved a checkpoint and asks to start again on a new plan" : "");
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
          if (k.fd >= 0) k.print_lines(true), ::close(k.fd), k.fd = -1;
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
    for (auto& k : kids) k.read_output();
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
  const std::string secret = read_env().store_secret;  // MPX_STORE_SECRET, or a fresh one per attempt
  attempt_result r;
  for (int attempt = 0;; ++attempt) {
    r = run_attempt(o, argv, attempt, secret);
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
  const Env env = read_env();
  if (env.launched()) return -1;
  std::vector<std::string> args{"/proc/self/exe"};
  for (int i = 1; i < argc; ++i) args.emplace_back(argv[i]);
  LaunchOptions o;
  o.nproc_per_node = nproc;
  o.max_restarts = max_restarts;
  if (env.master_port_set) o.master_port = env.master_port;
  return launch(o, args);
}

}  // namespace mpx
#endif  // MPX_DEFINITIONS
