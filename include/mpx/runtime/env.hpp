// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file runtime/env.hpp
/// Where this process sits in the job, read from the launcher's environment: torchrun's variables
/// (MASTER_ADDR, MASTER_PORT, RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE), else SLURM's (SLURM_PROCID,
/// SLURM_LOCALID, SLURM_NTASKS, ...), else Open MPI's (OMPI_COMM_WORLD_RANK, ...).

#include <mpx/runtime/errors.hpp>  // mpx::config_error

#include <cstdlib>   // std::getenv
#include <optional>  // std::optional
#include <string>    // std::string

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

  /// True when a launcher set this process up as one rank of several (or RANK is set at all).
  bool launched() const { return source != "none"; }
};

namespace detail
{
inline std::optional<std::string> getenv_str(const char* name)
{
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

inline int getenv_int(const char* name, int fallback)
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
}  // namespace detail

/// Reads the environment (see the file comment). Validates ranges; the message names the variable.
inline Env read_env()
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
  } else if (getenv_str("SLURM_PROCID") && getenv_str("SLURM_NTASKS")) {
    e.source = "slurm";
    e.rank = getenv_int("SLURM_PROCID", 0);
    e.world_size = getenv_int("SLURM_NTASKS", 1);
    e.local_rank = getenv_int("SLURM_LOCALID", 0);
    e.local_world_size = getenv_int("SLURM_NTASKS_PER_NODE", getenv_int("SLURM_TASKS_PER_NODE", e.world_size));
  } else if (getenv_str("OMPI_COMM_WORLD_RANK")) {
    e.source = "openmpi";
    e.rank = getenv_int("OMPI_COMM_WORLD_RANK", 0);
    e.world_size = getenv_int("OMPI_COMM_WORLD_SIZE", 1);
    e.local_rank = getenv_int("OMPI_COMM_WORLD_LOCAL_RANK", 0);
    e.local_world_size = getenv_int("OMPI_COMM_WORLD_LOCAL_SIZE", e.world_size);
  }
  e.master_addr = getenv_str("MASTER_ADDR").value_or("127.0.0.1");
  e.master_port = getenv_int("MASTER_PORT", 29500);
  if (e.world_size < 1) throw config_error("mpx: WORLD_SIZE (" + std::to_string(e.world_size) + ") must be at least 1");
  if (e.rank < 0 || e.rank >= e.world_size)
    throw config_error("mpx: RANK (" + std::to_string(e.rank) + ") must be in [0, WORLD_SIZE = " + std::to_string(e.world_size) + ")");
  if (e.master_port < 1 || e.master_port > 65535)
    throw config_error("mpx: MASTER_PORT (" + std::to_string(e.master_port) + ") must be a TCP port in [1, 65535]");
  return e;
}

}  // namespace mpx
