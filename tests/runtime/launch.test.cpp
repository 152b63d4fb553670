// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/runtime/launch.hpp and the mpxrun tool: real processes (small shell programs).
#include "support/catch.hpp"

#include <mpx/runtime/launch.hpp>

#include <array>
#include <chrono>
#include <cstdio>
#include <memory>
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
