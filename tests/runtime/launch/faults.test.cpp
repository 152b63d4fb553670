// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/runtime/launch/faults.hpp: MPX_FAULT's form, and a planned fault met only where it is planned.
// (The faults themselves, raised in real training runs: moondream.train.restart and .crashsave.)
#include "support/catch.hpp"

#include <mpx/runtime/launch/env.hpp>
#include <mpx/runtime/launch/faults.hpp>

#include <cstdlib>

TEST_CASE("MPX_FAULT lists kind:rank:step[:attempt], a malformed entry names the form", "[faults]")
{
  const auto f = mpx::detail::parse_faults("sigkill:1:3,save2:0:4:1,exception:2:0");
  REQUIRE(f.size() == 3);
  CHECK(f[0].kind == "sigkill");
  CHECK(f[0].rank == 1);
  CHECK(f[0].step == 3);
  CHECK(f[0].attempt == 0);
  CHECK(f[1].kind == "save2");
  CHECK(f[1].attempt == 1);
  CHECK(f[2].kind == "exception");
  CHECK(mpx::detail::parse_faults("").empty());
  for (const char* bad : {"sigkill", "sigkill:1", "boom:1:2", "sigkill:-1:2", "sigkill:1:x", "save:0:1", "sigkill:1:2:3:4"})
    CHECK_THROWS_WITH(mpx::detail::parse_faults(bad), Catch::Contains("is not kind:rank:step[:attempt]") && Catch::Contains("MPX_FAULT=sigkill:1:3"));
}

TEST_CASE("A planned exception is thrown at its rank, step, point and attempt only", "[faults]")
{
  ::setenv("MPX_FAULT", "exception:1:2", 1);  // read with the rest of the environment (env.hpp)
  ::unsetenv("TORCHELASTIC_RESTART_COUNT");
  mpx::Env env = mpx::read_env();
  ::unsetenv("MPX_FAULT");
  REQUIRE(env.faults.size() == 1);
  using mpx::FaultPoint;
  auto at_rank = [&](int rank) {
    env.rank = rank;
    return env;
  };
  CHECK_NOTHROW(mpx::inject_fault(at_rank(0), FaultPoint::forward, 2));  // another rank
  CHECK_NOTHROW(mpx::inject_fault(at_rank(1), FaultPoint::forward, 1));  // another step
  CHECK_NOTHROW(mpx::inject_fault(at_rank(1), FaultPoint::step, 2));     // another point
  CHECK_NOTHROW(mpx::inject_fault(at_rank(1), FaultPoint::save, 2, 0));
  CHECK_THROWS_WITH(mpx::inject_fault(at_rank(1), FaultPoint::forward, 2), Catch::Contains("injected fault (MPX_FAULT=exception:1:2)"));
  ::setenv("TORCHELASTIC_RESTART_COUNT", "1", 1);  // the restarted job goes on
  env.restart_count = mpx::read_env().restart_count;
  CHECK_NOTHROW(mpx::inject_fault(at_rank(1), FaultPoint::forward, 2));
  ::unsetenv("TORCHELASTIC_RESTART_COUNT");
}
