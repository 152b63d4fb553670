// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file runtime/launch/env.hpp
/// The environment room: every environment variable mpx reads is read, parsed and validated here, once,
/// into `mpx::Env`, which the rest of the runtime receives (through `World::env`); no other header reads
/// the environment. A malformed value is a `config_error` naming the variable and the fix.
///
/// Where this process sits in the job, from the launcher: torchrun's variables (MASTER_ADDR, MASTER_PORT,
/// RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE), else SLURM's (SLURM_PROCID, SLURM_LOCALID,
/// SLURM_NTASKS, ...), else Open MPI's (OMPI_COMM_WORLD_RANK, ...). Under torchrun, whether its agent
/// already serves the rendezvous store (TORCHELASTIC_USE_AGENT_STORE: every rank then joins it as a client)
/// and which restart this is (TORCHELASTIC_RESTART_COUNT: a restart's keys never meet an earlier attempt's).
/// Under SLURM, every form of SLURM_TASKS_PER_NODE (`2(x3),1`) and, when MASTER_ADDR is not set, the first
/// host of SLURM_JOB_NODELIST / SLURM_NODELIST (`node[01-04,07]` gives `node01`).
///
/// mpx's own settings (docs/05_running.md, "Environment", is their one table): `MPX_STORE_SECRET`,
/// `MPX_SHM`, `MPX_SHM_RING_KB`, `MPX_SHM_SPIN_US`, `MPX_KEEP_HOST_MEMORY`, `MPX_FAULT`, `MPX_NCCL_RULES`; and Gloo's
/// `GLOO_SOCKET_IFNAME`.

#include <mpx/errors.hpp>   // mpx::config_error
#include <mpx/linkage.hpp>  // MPX_DECL, MPX_DEFINITIONS

#include <optional>  // std::optional
#include <string>    // std::string
#include <vector>    // std::vector

namespace mpx
{

/// One planned fault (`MPX_FAULT`, faults.hpp): global rank `rank` meets it at step `step` of restart
/// attempt `attempt`.
struct Fault
{
  std::string kind;  ///< sigkill, sigstop, sigsegv, abort, exception, save<k>
  int rank = 0;
  long step = 0;
  int attempt = 0;
};

/// Pipeline messages between ranks of one host through shared memory (runtime/shm_links.hpp).
struct ShmSettings
{
  bool on = true;                 ///< MPX_SHM=1 (default); 0: every pipeline message over Gloo
  int ring_kb = 8192;             ///< MPX_SHM_RING_KB: a ring's size in KiB, a power of two from 4 to 4194304 (rank 0's counts)
  std::optional<int> spin_us;     ///< MPX_SHM_SPIN_US: how long a wait spins before it sleeps, 0 to 1000000 µs (unset: by the host's CPUs)
};

/// This process's place in the job, and mpx's settings from the environment (see the file comment).
struct Env
{
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  bool master_port_set = false;  ///< MASTER_PORT was set (else master_port is its default)
  std::string source = "none";   ///< "torchrun", "slurm", "openmpi" or "none" (a single process)
  bool agent_store = false;      ///< torchrun's agent serves the store at MASTER_ADDR:MASTER_PORT: join it as a client
  int restart_count = 0;         ///< torchrun's (or mpxrun's) restart of this job (0: the first attempt)
  std::string store_secret;      ///< MPX_STORE_SECRET: the run's store keys are named under it (world/rendezvous.hpp)
  std::string gloo_socket_ifname;  ///< GLOO_SOCKET_IFNAME's first name: the interface Gloo listens on ("": the route to the master)
  ShmSettings shm;                 ///< MPX_SHM, MPX_SHM_RING_KB, MPX_SHM_SPIN_US
  bool keep_host_memory = true;    ///< MPX_KEEP_HOST_MEMORY (0: make_world leaves LibTorch's CPU allocator alone)
  bool nccl_rules = false;         ///< MPX_NCCL_RULES=1: CPU ranks' pipeline messages under NCCL's rules (torch/nccl_rules.hpp)
  std::vector<Fault> faults;       ///< MPX_FAULT: faults injected for real, for tests of failure handling (faults.hpp)

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

/// Parses MPX_FAULT's value, comma-separated `kind:rank:step[:attempt]` (faults.hpp); a malformed entry is a
/// `config_error` with the form.
MPX_DECL std::vector<Fault> parse_faults(const std::string& spec);

/// The launcher's variables: this process's place in the job.
MPX_DECL void read_place(Env& e);
/// mpx's own settings and GLOO_SOCKET_IFNAME.
MPX_DECL void read_settings(Env& e);
}  // namespace detail

/// Reads the environment (see the file comment). Validates ranges; the message names the variable.
MPX_DECL Env read_env();

}  // namespace mpx

#if MPX_DEFINITIONS
// ---- definitions (compiled once under MPX_SEPARATE_COMPILATION: linkage.hpp) ----
#include <algorithm>  // std::min
#include <cstdlib>    // std::getenv
#include <stdexcept>  // std::invalid_argument

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

MPX_DECL std::vector<Fault> parse_faults(const std::string& spec)
{
  std::vector<Fault> out;
  std::size_t i = 0;
  while (i < spec.size()) {
    const std::size_t end = std::min(spec.find(',', i), spec.size());
    const std::string item = spec.substr(i, end - i);
    i = end + 1;
    std::vector<std::string> part;
    for (std::size_t b = 0;;) {
      const std::size_t c = item.find(':', b);
      part.push_back(item.substr(b, c == std::string::npos ? std::string::npos : c - b));
      if (c == std::string::npos) break;
      b = c + 1;
    }
    const auto& k = part[0];
    const bool known = k == "sigkill" || k == "sigstop" || k == "sigsegv" || k == "abort" || k == "exception" ||
                       (k.size() > 4 && k.rfind("save", 0) == 0 && k.find_first_not_of("0123456789", 4) == std::string::npos);
    auto number = [&](const std::string& x) {
      if (x.empty() || x.find_first_not_of("0123456789") != std::string::npos) throw std::invalid_argument(x);
      return std::stol(x);
    };
    try {
      if (!known || part.size() < 3 || part.size() > 4) throw std::invalid_argument(item);
      out.push_back({k, int(number(part[1])), number(part[2]), part.size() == 4 ? int(number(part[3])) : 0});
    } catch (const std::exception&) {
      throw config_error("mpx: MPX_FAULT entry '" + item + "' is not kind:rank:step[:attempt] with kind one of sigkill, sigstop, sigsegv, "
                         "abort, exception, save<k> (e.g. MPX_FAULT=sigkill:1:3)");
    }
  }
  return out;
}

MPX_DECL void read_place(Env& e)
{
  if (getenv_str("RANK") || getenv_str("WORLD_SIZE")) {
    e.source = "torchrun";
    e.rank = getenv_int("RANK", 0);
    e.world_size = getenv_int("WORLD_SIZE", 1);
    e.local_rank = getenv_int("LOCAL_RANK", e.rank);
    e.local_world_size = getenv_int("LOCAL_WORLD_SIZE", e.world_size);
    e.agent_store = truthy(getenv_str("TORCHELASTIC_USE_AGENT_STORE"));
  } else if (getenv_str("SLURM_PROCID") && getenv_str("SLURM_NTASKS")) {
    e.source = "slurm";
    e.rank = getenv_int("SLURM_PROCID", 0);
    e.world_size = getenv_int("SLURM_NTASKS", 1);
    e.local_rank = getenv_int("SLURM_LOCALID", 0);
    if (getenv_str("SLURM_NTASKS_PER_NODE")) {
      e.local_world_size = getenv_int("SLURM_NTASKS_PER_NODE", 1);
    } else if (auto t = getenv_str("SLURM_TASKS_PER_NODE")) {
      const auto per_node = tasks_per_node(*t);
      const int node = getenv_int("SLURM_NODEID", 0);
      if (node < 0 || node >= int(per_node.size()))
        throw config_error("mpx: SLURM_NODEID (" + std::to_string(node) + ") has no entry in SLURM_TASKS_PER_NODE=\"" + *t + "\"");
      e.local_world_size = per_node[std::size_t(node)];
    } else {
      e.local_world_size = e.world_size;
    }
    if (!getenv_str("MASTER_ADDR"))
      if (auto list = getenv_str("SLURM_JOB_NODELIST") ? getenv_str("SLURM_JOB_NODELIST") : getenv_str("SLURM_NODELIST"))
        e.master_addr = first_host(*list);
  } else if (getenv_str("OMPI_COMM_WORLD_RANK")) {
    e.source = "openmpi";
    e.rank = getenv_int("OMPI_COMM_WORLD_RANK", 0);
    e.world_size = getenv_int("OMPI_COMM_WORLD_SIZE", 1);
    e.local_rank = getenv_int("OMPI_COMM_WORLD_LOCAL_RANK", 0);
    e.local_world_size = getenv_int("OMPI_COMM_WORLD_LOCAL_SIZE", e.world_size);
  }
  e.restart_count = getenv_int("TORCHELASTIC_RESTART_COUNT", 0);  // torchrun's, or mpxrun's (launch.hpp)
  e.master_addr = getenv_str("MASTER_ADDR").value_or(e.master_addr);
  e.master_port_set = getenv_str("MASTER_PORT").has_value();
  e.master_port = getenv_int("MASTER_PORT", 29500);
  if (e.world_size < 1) throw config_error("mpx: WORLD_SIZE (" + std::to_string(e.world_size) + ") must be at least 1");
  if (e.rank < 0 || e.rank >= e.world_size)
    throw config_error("mpx: RANK (" + std::to_string(e.rank) + ") must be in [0, WORLD_SIZE = " + std::to_string(e.world_size) + ")");
  if (e.master_port < 1 || e.master_port > 65535)
    throw config_error("mpx: MASTER_PORT (" + std::to_string(e.master_port) + ") must be a TCP port in [1, 65535]");
}

MPX_DECL void read_settings(Env& e)
{
  auto zero_or_one = [](const char* name, const char* meaning_of_0) {
    const auto v = getenv_str(name);
    if (!v || *v == "1") return true;
    if (*v == "0") return false;
    throw config_error(std::string("mpx: ") + name + "=\"" + *v + "\": set it to 1 (the default) or 0 (" + meaning_of_0 + ")");
  };
  e.store_secret = getenv_str("MPX_STORE_SECRET").value_or("");
  const std::string ifname = getenv_str("GLOO_SOCKET_IFNAME").value_or("");
  e.gloo_socket_ifname = ifname.substr(0, ifname.find(','));
  e.shm.on = zero_or_one("MPX_SHM", "pipeline messages between ranks of one host over Gloo instead of shared memory");
  e.shm.ring_kb = getenv_int("MPX_SHM_RING_KB", e.shm.ring_kb);
  const int kb = e.shm.ring_kb;
  if (kb < 4 || kb > (1 << 22) || (kb & (kb - 1)) != 0)
    throw config_error("mpx: MPX_SHM_RING_KB=" + std::to_string(kb) +
                       " must be a power of two from 4 to 4194304 (KiB per ring; tiny rings send most messages over Gloo)");
  if (getenv_str("MPX_SHM_SPIN_US")) {
    e.shm.spin_us = getenv_int("MPX_SHM_SPIN_US", 0);
    if (*e.shm.spin_us < 0 || *e.shm.spin_us > 1'000'000)
      throw config_error("mpx: MPX_SHM_SPIN_US=" + std::to_string(*e.shm.spin_us) + " must be from 0 to 1000000 (µs)");
  }
  e.keep_host_memory = zero_or_one("MPX_KEEP_HOST_MEMORY", "LibTorch's own CPU allocator, e.g. to preload jemalloc");
  e.faults = parse_faults(getenv_str("MPX_FAULT").value_or(""));
  const std::string rules = getenv_str("MPX_NCCL_RULES").value_or("0");
  if (rules != "0" && rules != "1") throw config_error("mpx: MPX_NCCL_RULES=\"" + rules + "\": set it to 0 (the default) or 1 (NCCL's rules on CPU)");
  e.nccl_rules = rules == "1";
}

}  // namespace mpx::detail

namespace mpx
{
MPX_DECL Env read_env()
{
  Env e;
  detail::read_place(e);
  detail::read_settings(e);
  return e;
}

}  // namespace mpx
#endif  // MPX_DEFINITIONS
