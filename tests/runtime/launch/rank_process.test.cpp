// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/runtime/launch/rank_process.hpp: how a rank's end is said, its output read line by line with
// the last lines kept, what it is started with (a free port, the run's secret), on a real forked process.
#include "support/catch.hpp"

#include <mpx/runtime/launch/rank_process.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

TEST_CASE("A rank's end is said as the launcher reports it", "[launch][rank_process]")
{
  auto status_of = [](auto&& body) {
    const pid_t pid = ::fork();
    if (pid == 0) body();
    int st = 0;
    ::waitpid(pid, &st, 0);
    return st;
  };
  const int seven = status_of([] { ::_exit(7); });
  CHECK(mpx::detail::status_text(seven) == "exited with status 7");
  CHECK(mpx::detail::exit_code(seven) == 7);
  const int killed = status_of([] { ::raise(SIGKILL); });
  CHECK(mpx::detail::status_text(killed) == "was killed by signal 9 (SIGKILL)");
  CHECK(mpx::detail::exit_code(killed) == 128 + 9);
  CHECK(mpx::detail::fmt_seconds(std::chrono::milliseconds(3200)) == " at 3.2 s");
}

TEST_CASE("A rank's output is read line by line, its last lines kept, and it starts with torchrun's variables", "[launch][rank_process]")
{
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  mpx::detail::RankStart s;
  s.rank = 5, s.local_rank = 1, s.world_size = 6, s.local_world_size = 2, s.node_rank = 2, s.master_addr = "127.0.0.1";
  s.master_port = mpx::detail::free_port(), s.attempt = 1, s.secret = mpx::detail::store_secret("", 1);
  CHECK(s.master_port > 0);
  CHECK(s.secret.size() == 32);  // 128 random bits as hex, fresh on one node
  CHECK(mpx::detail::store_secret("given", 2) == "given");
  const pid_t self = ::getpid(), pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    mpx::detail::exec_rank(s, {"sh", "-c", "echo dropped; echo $RANK $LOCAL_RANK $WORLD_SIZE $TORCHELASTIC_RESTART_COUNT; echo second; printf third"}, self, fds[1]);
  }
  ::close(fds[1]);
  mpx::detail::RankProcess r;
  r.pid = pid, r.fd = fds[0], r.rank = 5, r.prefix_output = false, r.tail_lines = 3;
  while (r.fd >= 0) r.read_output();  // (a blocking pipe: reads to its end)
  int st = 0;
  ::waitpid(pid, &st, 0);
  CHECK(mpx::detail::exit_code(st) == 0);
  REQUIRE(r.tail.size() == 3);  // the last three lines, the unterminated one included
  CHECK(r.tail[0] == "5 1 6 1");  // RANK, LOCAL_RANK, WORLD_SIZE, TORCHELASTIC_RESTART_COUNT
  CHECK(r.tail[1] == "second");
  CHECK(r.tail[2] == "third");
}
