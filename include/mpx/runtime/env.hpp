// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file runtime/env.hpp
/// Where this process sits in the job, read from the launcher's environment: torchrun's variables
/// (MASTER_ADDR, MASTER_PORT, RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE), else SLURM's (SLURM_PROCID,
/// SLURM_LOCALID, SLURM_NTASKS, ...), else Open MPI's (OMPI_COMM_WORLD_RANK, ...). Under torchrun, whether
/// its agent already serves the rendezvous store (TORCHELASTIC_USE_AGENT_STORE: every rank then joins it as
/// a client) and which restart this is (TORCHELASTIC_RESTART_COUNT: a restart's keys never meet an earlier
/// attempt's). Under SLURM, every form of SLURM_TASKS_PER_NODE (`2(x3),1`) and, when MASTER_ADDR is not
/// set, the first host of SLURM_JOB_NODELIST / SLURM_NODELIST (`node[01-04,07]` gives `node01`).

#include <mpx/runtime/errors.hpp>  // mpx::config_error
#include <mpx/runtime/linkage.hpp>  // MPX_DECL, MPX_DEFINITIONS

#include <cstdlib>   // std::getenv
#include <optional>  // std::optional
#include <string>    // std::string
#include <vector>    // std::vector

namespace mpx
{

/// This process's place in the job.
struct Env
{
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::string source = "none";  ///< "torchrun", "slurm", "openmpi" or "none" (a single process)
  bool agent_store = false;  ///< torchrun's agent serves the store at MASTER_ADDR:MASTER_PORT: join it as a client
  int restart_count = 0;     ///< torchrun's restart of this job (0: the first attempt)
  std::string store_secret;  ///< MPX_STORE_SECRET: the run's store keys are named under it (rendezvous.hpp)

  /// True when a launcher set this process up as one rank of several (or RANK is set at all).
  bool launched() const { return source != "none"; }
};

namespace detail
{
MPX_DECL std::optional<std::string> getenv_str(const char* name);

MPX_DECL int getenv_int(const char* name, int fallback);

/// SLURM_TASKS_PER_NODE's tasks of each node: "2(x3),1" is {2, 2, 2, 1}.
MPX_DECL std::vector<int> tasks_per_node(const std::string& v);

/// The first host of a SLURM node list: "node[01-04,07],gpu5" gives "node01", "a,b" gives "a".
MPX_DECL std::string first_host(const std::string& list);

MPX_DECL bool truthy(const std::optional<std::string>& v);
}  // namespace detail

/// Reads the environment (see the file comment). Validates ranges; the message names the variable.
MPX_DECL Env read_env();

}  // namespace mpx

#if MPX_DEFINITIONS
// ---- definitions (compiled once under MPX_SEPARATE_COMPILATION: runtime/linkage.hpp) ----

namespace mpx::detail
{
MPX_DECL std::optional<std::string> getenv_str(const char* name)
{
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

MPX_DECL int getenv_int(const char* name, int fallback)
{
  auto v = getenv_str(name);
  if (!v) return fallback;
  try {
    std::size_t used = 0;
    int x = std::stoi(*v, &used);
    if (used != v->size()) throw std::invalid_argument(*v);
    return x;
  } catch (const std::exception&) {
    throw config_error(std::string("mpx: environment variable ") + name + "=\"" + *v + "\" is not an integer; set it to one");
  }
}

MPX_DECL std::vector<int> tasks_per_node(const std::string& v)
{
  auto bad = [&] { return config_error("mpx: SLURM_TASKS_PER_NODE=\"" + v + "\" is not of the form 2(x3),1; srun sets it, do not edit it"); };
  std::vector<int> out;
  std::size_t i = 0;
  while (i < v.size()) {
    std::size_t used = 0;
    int n = 0, times = 1;
    try {
      n = std::stoi(v.substr(i), &used);
    } catch (const std::exception&) {
      throw bad();
    }
    i += used;
    if (i < v.size() && v[i] == '(') {
      if (v.compare(i, 2, "(x") != 0) throw bad();
      try {
        times = std::stoi(v.substr(i + 2), &used);
      } catch (const std::exception&) {
        throw bad();
      }
      i += 2 + used;
      if (i >= v.size() || v[i] != ')') throw bad();
      ++i;
    }
    if (n < 1 || times < 1 || times > 1000000) throw bad();
    out.insert(out.end(), std::size_t(times), n);
    if (i < v.size() && v[i++] != ',') throw bad();
  }
  if (out.empty()) throw bad();
  return out;
}

MPX_DECL std::string first_host(const std::string& list)
{
  const auto comma = list.find(','), bracket = list.find('[');
  if (bracket == std::string::npos || (comma != std::string::npos && comma < bracket)) return list.substr(0, comma);
  const auto end = list.find_first_of(",-]", bracket + 1);
  if (end == std::string::npos || end == bracket + 1)
    throw config_error("mpx: the SLURM node list \"" + list + "\" is malformed; set MASTER_ADDR to the first node's address");
  return list.substr(0, bracket) + list.substr(bracket + 1, end - bracket - 1);
}

MPX_DECL bool truthy(const std::optional<std::string>& v) { return v && (*v == "1" || *v == "True" || *v == "true"); }

}  // namespace mpx::detail

namespace mpx
{
MPX_DECL Env read_env()
{
  using detail::getenv_int;
  using detail::getenv_str;
  Env e;
  if (getenv_str("RANK") || getenv_str("WORLD_SIZE")) {
    e.source = "torchrun";
    e.rank = getenv_int("RANK", 0);
    e.world_size = getenv_int("WORLD_SIZE", 1);
    e.local_rank = getenv_int("LOCAL_RANK", e.rank);
    e.local_world_size = getenv_int("LOCAL_WORLD_SIZE", e.world_size);
    e.agent_store = detail::truthy(getenv_str("TORCHELASTIC_USE_AGENT_STORE"));
    e.restart_count = getenv_int("TORCHELASTIC_RESTART_COUNT", 0);
  } else if (getenv_str("SLURM_PROCID") && getenv_str("SLURM_NTASKS")) {
    e.source = "slurm";
    e.rank = getenv_int("SLURM_PROCID", 0);
    e.world_size = getenv_int("SLURM_NTASKS", 1);
    e.local_rank = getenv_int("SLURM_LOCALID", 0);
    if (getenv_str("SLURM_NTASKS_PER_NODE")) {
      e.local_world_size = getenv_int("SLURM_NTASKS_PER_NODE", 1);
    } else if (auto t = getenv_str("SLURM_TASKS_PER_NODE")) {
      const auto per_node = detail::tasks_per_node(*t);
      const int node = getenv_int("SLURM_NODEID", 0);
      if (node < 0 || node >= int(per_node.size()))
        throw config_error("mpx: SLURM_NODEID (" + std::to_string(node) + ") has no entry in SLURM_TASKS_PER_NODE=\"" + *t + "\"");
      e.local_world_size = per_node[std::size_t(node)];
    } else {
      e.local_world_size = e.world_size;
    }
    if (!getenv_str("MASTER_ADDR"))
      if (auto list = getenv_str("SLURM_JOB_NODELIST") ? getenv_str("SLURM_JOB_NODELIST") : getenv_str("SLURM_NODELIST"))
        e.master_addr = detail::first_host(*list);
  } else if (getenv_str("OMPI_COMM_WORLD_RANK")) {
    e.source = "openmpi";
    e.rank = getenv_int("OMPI_COMM_WORLD_RANK", 0);
    e.world_size = getenv_int("OMPI_COMM_WORLD_SIZE", 1);
    e.local_rank = getenv_int("OMPI_COMM_WORLD_LOCAL_RANK", 0);
    e.local_world_size = getenv_int("OMPI_COMM_WORLD_LOCAL_SIZE", e.world_size);
  }
  e.master_addr = getenv_str("MASTER_ADDR").value_or(e.master_addr);
  e.master_port = getenv_int("MASTER_PORT", 29500);
  e.store_secret = getenv_str("MPX_STORE_SECRET").value_or("");
  if (e.world_size < 1) throw config_error("mpx: WORLD_SIZE (" + std::to_string(e.world_size) + ") must be at least 1");
  if (e.rank < 0 || e.rank >= e.world_size)
    throw config_error("mpx: RANK (" + std::to_string(e.rank) + ") must be in [0, WORLD_SIZE = " + std::to_string(e.world_size) + ")");
  if (e.master_port < 1 || e.master_port > 65535)
    throw config_error("mpx: MASTER_PORT (" + std::to_string(e.master_port) + ") must be a TCP port in [1, 65535]");
  return e;
}

}  // namespace mpx
#endif  // MPX_DEFINITIONS
