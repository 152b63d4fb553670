// SPDX-License-Identifier: Apache-2.0
#pragma once
/// Test helper: a real child process that opens something and holds it until the test kills it (SIGKILL:
/// no destructor runs), for tests of what a killed process leaves behind.

#include <signal.h>  // kill, SIGKILL
#include <unistd.h>  // fork, pipe, pause, _exit

namespace test
{

/// Forks a child that runs `open()` inside a scope that never ends (what it opens stays open), then waits
/// to be killed; returns the child's pid once `open` has returned there (-1 if it threw or the child could
/// not say).
template <class Open>
pid_t fork_holding(Open&& open)
{
  int ready[2];
  if (::pipe(ready) != 0) return -1;
  const pid_t child = ::fork();
  if (child == 0) {
    try {  // an exception must not unwind into the test runner's copy in this child
      [[maybe_unused]] auto held = open();
      const char c = 1;
      if (::write(ready[1], &c, 1) != 1) ::_exit(2);
      for (;;) ::pause();
    } catch (...) {
      ::_exit(3);
    }
  }
  char c = 0;
  const bool opened = child > 0 && ::read(ready[0], &c, 1) == 1;
  ::close(ready[0]);
  ::close(ready[1]);
  if (!opened && child > 0) ::kill(child, SIGKILL);
  return opened ? child : -1;
}

}  // namespace test
