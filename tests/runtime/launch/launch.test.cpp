// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/runtime/launch/launch.hpp and the mpxrun tool: real processes (small shell programs).
#include "support/catch.hpp"

#include <mpx/runtime/launch/launch.hpp>

#include <array>
#include <chrono>
#include <cstdio>
#include <memory>
#include <cstdlib>  // std::atof
#include <string>

namespace
{
/// Runs a command line, returns (exit status, output).
std::pair<int, std::string> sh(const std::string& cmd)
{
  std::string out;
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  std::array<char, 4096> buf;
  while (std::fgets(buf.data(), int(buf.size()), p)) out += buf.data();
  const int st = ::pclose(p);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st), out};
}
const std::string mpxrun = MPX_MPXRUN_EXE;
}  // namespace

TEST_CASE("mpxrun sets torchrun's variables and prefixes each rank's lines", "[launch]")
{
  auto [code, out] = sh(mpxrun + " --nproc-per-node 3 sh -c 'echo \"$RANK/$WORLD_SIZE $LOCAL_RANK $MASTER_ADDR:$MASTER_PORT\"'");
  INFO(out);
  CHECK(code == 0);
  CHECK(out.find("[rank 0] 0/3 0 127.0.0.1:") != std::string::npos);
  CHECK(out.find("[rank 1] 1/3 1 127.0.0.1:") != std::string::npos);
  CHECK(out.find("[rank 2] 2/3 2 127.0.0.1:") != std::string::npos);
}

TEST_CASE("mpxrun computes global ranks for several nodes", "[launch]")
{
  auto [code, out] = sh(mpxrun + " --nproc-per-node 2 --nnodes 3 --node-rank 2 --master-port 29123 sh -c 'echo r=$RANK w=$WORLD_SIZE'");
  INFO(out);
  CHECK(code == 0);
  CHECK(out.find("[rank 4] r=4 w=6") != std::string::npos);
  CHECK(out.find("[rank 5] r=5 w=6") != std::string::npos);
}

TEST_CASE("One failing rank ends the others, mpxrun exits with its status", "[launch]")
{
  const auto t0 = std::chrono::steady_clock::now();
  auto [code, out] = sh(mpxrun + " --nproc-per-node 3 --grace-ms 2000 sh -c 'if [ $RANK = 1 ]; then exit 7; fi; sleep 60'");
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO(out);
  CHECK(code == 7);
  CHECK(s < 30);
  CHECK(out.find("rank 1 exited with status 7") != std::string::npos);
}

TEST_CASE("Ranks that exit asking for a new plan are started again, the restart's cause saying so", "[launch]")
{
  auto [code, out] = sh(mpxrun + " --nproc-per-node 2 --max-restarts 1 sh -c 'if [ $TORCHELASTIC_RESTART_COUNT = 0 ]; then exit " +
                        std::to_string(mpx::replan_exit_status) + "; fi; echo again'");
  INFO(out);
  CHECK(code == 0);
  CHECK(out.find("restart 1 of 1 (rank ") != std::string::npos);
  CHECK(out.find("exited with status 75: it saved a checkpoint and asks to start again on a new plan)") != std::string::npos);
  CHECK(out.find("[rank 0] again") != std::string::npos);
  CHECK(out.find("[rank 1] again") != std::string::npos);
}

TEST_CASE("SIGTERM to mpxrun reaches every rank", "[launch]")
{
  // each rank traps TERM and reports it; mpxrun is terminated after the ranks started
  auto [code, out] = sh("(" + mpxrun + " --nproc-per-node 2 sh -c 'trap \"echo got TERM; exit 0\" TERM; echo up; sleep 30 & wait' & pid=$!; "
                        "sleep 2; kill -TERM $pid; wait $pid)");
  INFO(out);
  CHECK(out.find("[rank 0] got TERM") != std::string::npos);
  CHECK(out.find("[rank 1] got TERM") != std::string::npos);
  CHECK(code == 128 + SIGTERM);
}

TEST_CASE("Bad launch options name the fix", "[launch]")
{
  mpx::LaunchOptions o;
  o.nproc_per_node = 0;
  CHECK_THROWS_WITH(mpx::launch(o, {"true"}), Catch::Contains("--nproc-per-node must be at least 1"));
  o.nproc_per_node = 1;
  o.nnodes = 2;
  CHECK_THROWS_WITH(mpx::launch(o, {"true"}), Catch::Contains("agreed --master-port"));
  auto [code, out] = sh(mpxrun + " --nproc-per-node 1 /nonexistent/program");
  CHECK(code == 127);
  CHECK(out.find("cannot start /nonexistent/program") != std::string::npos);
}

TEST_CASE("mpxrun gives its ranks one fresh store secret per run, or passes the user's", "[launch]")
{
  auto [code, out] = sh("env -u MPX_STORE_SECRET " + mpxrun + " --nproc-per-node 2 sh -c 'echo \"secret=$MPX_STORE_SECRET\"'");
  INFO(out);
  CHECK(code == 0);
  const auto a = out.find("[rank 0] secret="), b = out.find("[rank 1] secret=");
  REQUIRE(a != std::string::npos);
  REQUIRE(b != std::string::npos);
  const std::string s0 = out.substr(a + 16, 32), s1 = out.substr(b + 16, 32);
  CHECK(s0 == s1);
  CHECK(s0.find_first_not_of("0123456789abcdef") == std::string::npos);
  auto [code2, again] = sh("env -u MPX_STORE_SECRET " + mpxrun + " --nproc-per-node 1 sh -c 'echo \"secret=$MPX_STORE_SECRET\"'");
  CHECK(again.find(s0) == std::string::npos);  // fresh per run
  auto [code3, given] = sh("MPX_STORE_SECRET=mine " + mpxrun + " --nproc-per-node 1 sh -c 'echo \"secret=$MPX_STORE_SECRET\"'");
  CHECK(given.find("[rank 0] secret=mine") != std::string::npos);
  auto [code4, nodes] = sh("env -u MPX_STORE_SECRET " + mpxrun + " --nnodes 2 --node-rank 1 --master-port 29124 --nproc-per-node 1 true");
  CHECK(nodes.find("export the same MPX_STORE_SECRET on every node") != std::string::npos);
}

TEST_CASE("The first rank to fail is reported first: its rank, signal and last lines, in 10 of 10 runs", "[launch][faults]")
{
  // rank 1 says something and kills itself; the others notice a moment later and stop with their own
  // error, which is still printed (they get --notice-ms to stop by themselves)
  const std::string prog = "sh -c 'if [ $RANK = 1 ]; then echo \"last words of 1\"; sleep 0.3; kill -KILL $$; fi; sleep 0.6; "
                           "echo \"rank $RANK: peer 1 is gone\"; exit 3'";
  for (int run = 0; run < 10; ++run) {
    auto [code, out] = sh(mpxrun + " --nproc-per-node 3 " + prog);
    INFO("run " << run << ":\n" << out);
    CHECK(code == 128 + SIGKILL);
    const auto first = out.find("mpx::launch: ");
    REQUIRE(first != std::string::npos);
    const std::string killed = "mpx::launch: rank 1 was killed by signal 9 (SIGKILL) at ";
    CHECK(out.compare(first, killed.size(), killed) == 0);
    const double at = std::atof(out.c_str() + first + killed.size());  // it slept 0.3 s; a loaded machine adds a little
    CHECK(at >= 0.3);
    CHECK(at < 2.0);
    CHECK(out.find("  | last words of 1", first) != std::string::npos);  // quoted in the report
    const auto noticed = out.find("[rank 0] rank 0: peer 1 is gone");
    CHECK(noticed != std::string::npos);  // the survivors' own errors are not cut off
    CHECK(noticed > first);
    CHECK(out.find("[rank 2] rank 2: peer 1 is gone") != std::string::npos);
    CHECK(out.find("mpx::launch: the run failed: rank 1 was killed by signal 9 (SIGKILL) first; exit status 137") != std::string::npos);
  }
}

TEST_CASE("A stopped rank is named when its peers time out, and is ended", "[launch][faults]")
{
  const auto t0 = std::chrono::steady_clock::now();
  auto [code, out] = sh(mpxrun + " --nproc-per-node 2 --notice-ms 500 --grace-ms 1000 sh -c "
                                 "'if [ $RANK = 1 ]; then kill -STOP $$; exit 0; fi; sleep 1; echo \"timed out waiting for rank 1\"; exit 4'");
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO(out);
  CHECK(code == 4);
  CHECK(s < 20);
  CHECK(out.find("mpx::launch: rank 0 exited with status 4") != std::string::npos);
  CHECK(out.find("; rank 1 was stopped (SIGSTOP or SIGTSTP) at 0.0 s and never continued, so its peers could not go on") != std::string::npos);
}

TEST_CASE("Restarts (--max-restarts) start every rank again after a failure, with the attempt in TORCHELASTIC_RESTART_COUNT", "[launch][faults]")
{
  // ranks fail in attempts 0 and 1 and succeed in attempt 2
  auto [code, out] = sh(mpxrun + " --nproc-per-node 2 --max-restarts 2 --notice-ms 200 sh -c "
                                 "'echo \"attempt $TORCHELASTIC_RESTART_COUNT of $TORCHELASTIC_MAX_RESTARTS\"; "
                                 "if [ $TORCHELASTIC_RESTART_COUNT -lt 2 ] && [ $RANK = 1 ]; then exit 5; fi; sleep 0.2'");
  INFO(out);
  CHECK(code == 0);
  CHECK(out.find("mpx::launch: restart 1 of 2 (rank 1 exited with status 5): starting all 2 ranks again on a fresh rendezvous") != std::string::npos);
  CHECK(out.find("mpx::launch: restart 2 of 2 (rank 1 exited with status 5)") != std::string::npos);
  CHECK(out.find("[rank 0] attempt 2 of 2") != std::string::npos);
  CHECK(out.find("the run failed") == std::string::npos);

  auto [code2, out2] = sh(mpxrun + " --nproc-per-node 1 --max-restarts 1 sh -c 'exit 4'");
  INFO(out2);
  CHECK(code2 == 4);
  CHECK(out2.find("restart 1 of 1") != std::string::npos);
  CHECK(out2.find("mpx::launch: the run failed: rank 0 exited with status 4 first (after 1 restarts); exit status 4") != std::string::npos);

  auto [code3, out3] = sh(mpxrun + " --nproc-per-node 1 --nnodes 2 --node-rank 0 --master-port 29125 --max-restarts 1 true");
  CHECK(code3 == 2);
  CHECK(out3.find("use torchrun --max-restarts") != std::string::npos);
}

TEST_CASE("Killing the launcher with SIGKILL leaves no rank alive", "[launch][faults]")
{
  const std::string pids = "/tmp/mpx-launch-orphans-" + std::to_string(::getpid());
  std::remove(pids.c_str());
  // each rank records its pid and becomes a long sleep; the launcher is then killed outright
  auto [code, out] = sh("(" + mpxrun + " --nproc-per-node 3 sh -c 'echo $$ >> " + pids + "; exec sleep 60' & pid=$!; "
                        "for i in $(seq 100); do [ $(wc -l < " + pids + " 2>/dev/null || echo 0) -ge 3 ] && break; sleep 0.05; done; "
                        "kill -KILL $pid; wait $pid; sleep 0.5; "
                        "for p in $(cat " + pids + "); do s=$(awk '{print $3}' /proc/$p/stat 2>/dev/null); "
                        "if [ -n \"$s\" ] && [ \"$s\" != Z ]; then echo \"alive: $p\"; kill -KILL $p; fi; done; wc -l < " + pids + ")");
  INFO(out);
  CHECK(out.find("alive:") == std::string::npos);
  CHECK(out.find("3\n") != std::string::npos);  // all three ranks had started
  std::remove(pids.c_str());
}
