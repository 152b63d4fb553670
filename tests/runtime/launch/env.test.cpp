// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/runtime/launch/env.hpp: torchrun, SLURM and Open MPI variables.
#include "support/catch.hpp"

#include <mpx/runtime/launch/env.hpp>

#include <cstdlib>

namespace
{
/// Sets variables for one scope and clears every launcher variable around it.
struct ScopedEnv
{
  static constexpr const char* all[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                                        "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE",
                                        "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                                        "OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_TASKS_PER_NODE", "SLURM_NODEID", "SLURM_JOB_NODELIST",
                                        "SLURM_NODELIST", "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RESTART_COUNT"};
  ScopedEnv(std::initializer_list<std::pair<const char*, const char*>> vars)
  {
    for (auto v : all) ::unsetenv(v);
    for (auto& [k, v] : vars) ::setenv(k, v, 1);
  }
  ~ScopedEnv()
  {
    for (auto v : all) ::unsetenv(v);
  }
};
}  // namespace

TEST_CASE("torchrun variables", "[env]")
{
  ScopedEnv e{{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "2"},
              {"MASTER_ADDR", "10.1.2.3"}, {"MASTER_PORT", "29511"}};
  auto env = mpx::read_env();
  CHECK(env.source == "torchrun");
  CHECK(env.rank == 3);
  CHECK(env.world_size == 4);
  CHECK(env.local_rank == 1);
  CHECK(env.local_world_size == 2);
  CHECK(env.master_addr == "10.1.2.3");
  CHECK(env.master_port == 29511);
  CHECK(env.launched());
}

TEST_CASE("SLURM and Open MPI variables", "[env]")
{
  {
    ScopedEnv e{{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "1"}, {"SLURM_NTASKS_PER_NODE", "4"}};
    auto env = mpx::read_env();
    CHECK(env.source == "slurm");
    CHECK(env.rank == 5);
    CHECK(env.world_size == 8);
    CHECK(env.local_rank == 1);
    CHECK(env.local_world_size == 4);
  }
  {
    ScopedEnv e{{"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "3"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                {"OMPI_COMM_WORLD_LOCAL_SIZE", "1"}};
    auto env = mpx::read_env();
    CHECK(env.source == "openmpi");
    CHECK(env.rank == 2);
    CHECK(env.world_size == 3);
  }
}

TEST_CASE("No launcher: one process", "[env]")
{
  ScopedEnv e{};
  auto env = mpx::read_env();
  CHECK(!env.launched());
  CHECK(env.world_size == 1);
}

TEST_CASE("Bad values name the variable and the fix", "[env]")
{
  {
    ScopedEnv e{{"RANK", "4"}, {"WORLD_SIZE", "4"}};
    CHECK_THROWS_WITH(mpx::read_env(), Catch::Contains("RANK (4) must be in [0, WORLD_SIZE = 4)"));
  }
  {
    ScopedEnv e{{"RANK", "x"}, {"WORLD_SIZE", "4"}};
    CHECK_THROWS_WITH(mpx::read_env(), Catch::Contains("RANK=\"x\" is not an integer"));
  }
  {
    ScopedEnv e{{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"MASTER_PORT", "70000"}};
    CHECK_THROWS_AS(mpx::read_env(), mpx::config_error);
  }
}

TEST_CASE("torchrun's agent store and restart count", "[env]")
{
  {
    ScopedEnv e{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"TORCHELASTIC_USE_AGENT_STORE", "True"}, {"TORCHELASTIC_RESTART_COUNT", "3"}};
    auto env = mpx::read_env();
    CHECK(env.agent_store);
    CHECK(env.restart_count == 3);
  }
  ScopedEnv e{{"RANK", "0"}, {"WORLD_SIZE", "2"}};
  CHECK(!mpx::read_env().agent_store);  // mpxrun: rank 0 serves the store itself
}

TEST_CASE("SLURM_TASKS_PER_NODE in every form srun writes, and MASTER_ADDR from the node list", "[env]")
{
  using mpx::detail::tasks_per_node;
  CHECK(tasks_per_node("4") == std::vector<int>{4});
  CHECK(tasks_per_node("2(x3),1") == std::vector<int>{2, 2, 2, 1});
  CHECK(tasks_per_node("1,3(x2)") == std::vector<int>{1, 3, 3});
  for (const char* bad : {"", "x", "2(x)", "2(3)", "2(x3", "2,,1", "0", "2(x0)"}) {
    CAPTURE(bad);
    CHECK_THROWS_AS(tasks_per_node(bad), mpx::config_error);
  }
  using mpx::detail::first_host;
  CHECK(first_host("node[01-04,07]") == "node01");
  CHECK(first_host("node[7,9]") == "node7");
  CHECK(first_host("a,b[1-2]") == "a");
  CHECK(first_host("gpu12") == "gpu12");
  CHECK_THROWS_AS(first_host("node["), mpx::config_error);
  {
    ScopedEnv e{{"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "4"}, {"SLURM_LOCALID", "1"}, {"SLURM_NODEID", "1"},
                {"SLURM_TASKS_PER_NODE", "2(x2)"}, {"SLURM_JOB_NODELIST", "cn[101-102]"}};
    auto env = mpx::read_env();
    CHECK(env.local_world_size == 2);
    CHECK(env.master_addr == "cn101");
  }
  {
    ScopedEnv e{{"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "4"}, {"SLURM_NODEID", "1"}, {"SLURM_TASKS_PER_NODE", "3,1"},
                {"SLURM_NODELIST", "cn[101-102]"}, {"MASTER_ADDR", "10.0.0.1"}};
    auto env = mpx::read_env();
    CHECK(env.local_world_size == 1);
    CHECK(env.master_addr == "10.0.0.1");  // set: kept
  }
  ScopedEnv e{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_TASKS_PER_NODE", "2(x2"}};
  CHECK_THROWS_WITH(mpx::read_env(), Catch::Contains("SLURM_TASKS_PER_NODE=\"2(x2\""));
}
