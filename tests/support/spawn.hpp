// SPDX-License-Identifier: Apache-2.0
#pragma once
/// Test helper: start n real processes of a program on loopback (torchrun variables, a free port), each
/// with its output captured, and wait for all of them — within a deadline, after which all are killed and
/// the test fails. Unlike mpx::launch it does not stop the others when one fails, so tests can see how
/// the survivors end.

#include <mpx/runtime/launch/launch.hpp>  // mpx::detail::free_port

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace test
{

struct RankResult
{
  int code = -1;       // exit status (128 + signal for a signal, -1 if killed at the deadline)
  std::string output;  // stdout + stderr
  double seconds = 0;  // from start to exit
};

inline std::vector<RankResult> spawn(int n, const std::vector<std::string>& args, std::chrono::seconds deadline,
                                     const std::vector<std::pair<std::string, std::string>>& env = {})
{
  const int port = mpx::detail::free_port();
  const std::string dir = "/tmp/mpx-test-" + std::to_string(::getpid()) + "-" + std::to_string(port);
  ::mkdir(dir.c_str(), 0700);
  std::vector<pid_t> pids;
  const auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < n; ++r) {
    pid_t pid = ::fork();
    if (pid == 0) {
      const std::string log = dir + "/rank" + std::to_string(r) + ".log";
      FILE* f = std::fopen(log.c_str(), "w");
      ::dup2(::fileno(f), 1);
      ::dup2(::fileno(f), 2);
      ::setenv("RANK", std::to_string(r).c_str(), 1);
      ::setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(n).c_str(), 1);
      ::setenv("LOCAL_WORLD_SIZE", std::to_string(n).c_str(), 1);
      ::setenv("MASTER_ADDR", "127.0.0.1", 1);
      ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      ::setenv("OMP_NUM_THREADS", "1", 1);
      for (auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
      std::vector<char*> a;
      for (auto& s : args) a.push_back(const_cast<char*>(s.c_str()));
      a.push_back(nullptr);
      ::execv(a[0], a.data());
      ::_exit(127);
    }
    pids.push_back(pid);
  }
  std::vector<RankResult> out(static_cast<std::size_t>(n));
  std::vector<bool> done(static_cast<std::size_t>(n), false);
  int left = n;
  while (left > 0) {
    for (int r = 0; r < n; ++r) {
      if (done[std::size_t(r)]) continue;
      int st = 0;
      if (::waitpid(pids[std::size_t(r)], &st, WNOHANG) == pids[std::size_t(r)]) {
        done[std::size_t(r)] = true;
        --left;
        out[std::size_t(r)].code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        out[std::size_t(r)].seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      }
    }
    if (std::chrono::steady_clock::now() - t0 > deadline) {
      for (int r = 0; r < n; ++r)
        if (!done[std::size_t(r)]) {
          ::kill(pids[std::size_t(r)], SIGKILL);
          ::waitpid(pids[std::size_t(r)], nullptr, 0);
          out[std::size_t(r)].code = -1;
        }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (int r = 0; r < n; ++r) {
    std::ifstream f(dir + "/rank" + std::to_string(r) + ".log");
    std::stringstream ss;
    ss << f.rdbuf();
    out[std::size_t(r)].output = ss.str();
    std::remove((dir + "/rank" + std::to_string(r) + ".log").c_str());
  }
  ::rmdir(dir.c_str());
  return out;
}

/// Every rank's exit status and output, for a failing check's message.
inline std::string all_output(const std::vector<RankResult>& rs)
{
  std::ostringstream o;
  for (std::size_t r = 0; r < rs.size(); ++r) o << "---- rank " << r << " (exit " << rs[r].code << ")\n" << rs[r].output;
  return o.str();
}

/// The values of a rank's "<key> <step> <value>" lines, in order.
inline std::vector<double> values_of(const std::string& out, const std::string& key)
{
  std::vector<double> v;
  std::istringstream in(out);
  std::string word;
  long step;
  double x;
  while (in >> word)
    if (word == key && in >> step >> x) v.push_back(x);
  return v;
}

}  // namespace test
