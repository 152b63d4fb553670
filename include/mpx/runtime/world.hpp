// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file runtime/world.hpp
/// `mpx::World`: the process groups of one run. Rendezvous through a c10d TCPStore at MASTER_ADDR:PORT,
/// a world group, this rank's pipeline group (the slots of its replica) and its data-parallel group (its
/// slot in every replica). Global rank = replica * slots + slot. Gloo on CPU; NCCL for CUDA stages when
/// LibTorch has it (USE_C10D_NCCL). Before anything else every rank checks what it can alone (WORLD_SIZE a
/// multiple of the slots, devices present), then all ranks compare the pipeline fingerprint in one
/// collective: any mismatch stops every rank with a message naming the fix. Gloo listens on the interface
/// `GLOO_SOCKET_IFNAME` names, else on this host's address of the route to MASTER_ADDR (never on what the
/// host name resolves to, which is loopback on a default Debian); a group whose peers cannot reach each
/// other stops within the timeout with a `peer_error` naming the address and the fix.

#include <mpx/fingerprint.hpp>     // mpx::fingerprint_v
#include <mpx/pipeline.hpp>        // mpx::PipelineType
#include <mpx/runtime/env.hpp>     // mpx::Env
#include <mpx/runtime/errors.hpp>  // mpx::config_error
#include <mpx/runtime/run_settings.hpp>  // mpx::RunSettings, mpx::check_run_settings
#include <mpx/runtime/rendezvous.hpp>  // mpx::make_store, mpx::check_reachable, mpx::detail::gloo_endpoint
#include <mpx/torch/host_memory.hpp>  // mpx::keep_host_memory
#include <mpx/torch/version.hpp>    // MPX_TORCH_AT_LEAST

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>       // c10d::PrefixStore
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>  // c10d::ProcessGroupGloo
#include <torch/cuda.h>                                       // torch::cuda::device_count
#include <torch/torch.h>                                      // torch::Device, torch::full
#if defined(USE_C10D_NCCL)
#include <c10/cuda/CUDAFunctions.h>                          // c10::cuda::set_device
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>  // c10d::ProcessGroupNCCL
#endif

#include <chrono>    // std::chrono::milliseconds
#include <cstdlib>   // std::getenv
#include <iostream>  // std::cerr
#include <sstream>   // std::ostringstream
#include <string>    // std::string


namespace mpx
{

#if MPX_TORCH_AT_LEAST(2, 0)
using ProcessGroupPtr = c10::intrusive_ptr<c10d::Backend>;  // Gloo and NCCL derive from Backend in 2.x
#else
using ProcessGroupPtr = c10::intrusive_ptr<c10d::ProcessGroup>;
#endif

/// How a run starts.
struct WorldOptions
{
  std::chrono::milliseconds timeout{60000};  ///< every wait: rendezvous, messages, collectives
  bool allow_cpu = false;  ///< run GPU<i> stages on CPU when there is no CUDA (the examples opt in)
  RunSettings settings;  ///< the program's run settings (config, seed, data...): every rank must start with the same (run_settings.hpp)
  bool keep_host_memory = true;  ///< mpx::keep_host_memory(): large CPU tensors from a cache, no page faults each step (torch/host_memory.hpp)
};

/// The groups of one run (see the file comment).
struct World
{
  Env env;
  int slots = 1;     ///< pipeline ranks per replica
  int replicas = 1;  ///< data-parallel copies
  int slot = 0;      ///< this rank's pipeline position
  int replica = 0;   ///< this rank's replica
  torch::Device device{torch::kCPU};       ///< where this rank's stages compute
  torch::Device comm_device{torch::kCPU};  ///< where pipeline messages live: CPU for Gloo, the GPU for NCCL
  std::chrono::milliseconds timeout{60000};
  c10::intrusive_ptr<c10d::Store> store;
  ProcessGroupPtr world, pp, dp;

  /// Global rank of (replica, slot).
  int global_rank(int rep, int s) const { return rep * slots + s; }
};

/// Waits until every rank of the world has arrived (with the run's timeout); `what` names the place in the
/// error a missing peer causes.
inline void barrier(World& w, const std::string& what)
{
  std::vector<at::Tensor> v{torch::zeros({1})};
  try {
    w.world->allreduce(v)->wait(w.timeout);
  } catch (const std::exception& e) {
    throw peer_error("mpx: rank " + std::to_string(w.env.rank) + ", " + what + ": a peer did not arrive: " + e.what());
  }
}

namespace detail
{
inline ProcessGroupPtr make_gloo(const c10::intrusive_ptr<c10d::Store>& store, const std::string& prefix, int rank, int size,
                                 std::chrono::milliseconds timeout, const GlooEndpoint& at, int global_rank)
{
  auto opts = c10d::ProcessGroupGloo::Options::create(timeout);
  try {
    opts->devices.push_back(at.interface.empty() ? c10d::ProcessGroupGloo::createDeviceForHostname(at.address)
                                                 : c10d::ProcessGroupGloo::createDeviceForInterface(at.interface));
  } catch (const std::exception& e) {
    throw config_error("mpx: rank " + std::to_string(global_rank) + " (group " + prefix + "): cannot open a Gloo device on " + at.describe() +
                       " (" + e.what() + "); name an interface of this host with GLOO_SOCKET_IFNAME");
  }
  auto ps = c10::make_intrusive<c10d::PrefixStore>(prefix, store);
  try {
    return c10::make_intrusive<c10d::ProcessGroupGloo>(ps, rank, size, opts);
  } catch (const std::exception& e) {
    throw peer_error("mpx: rank " + std::to_string(global_rank) + " (member " + std::to_string(rank) + " of " + std::to_string(size) + " of group " + prefix + ", on " + at.describe() + ")" +
                     ": could not connect to its peers within " + std::to_string(timeout.count()) + " ms (" + e.what() +
                     "); every node must reach every other's address: set GLOO_SOCKET_IFNAME to the interface that does, on each node");
  }
}

#if defined(USE_C10D_NCCL)
inline ProcessGroupPtr make_nccl(const c10::intrusive_ptr<c10d::Store>& store, const std::string& prefix, int rank, int size,
                                 std::chrono::milliseconds timeout)
{
  auto opts = c10d::ProcessGroupNCCL::Options::create();
  opts->timeout = timeout;
  auto ps = c10::make_intrusive<c10d::PrefixStore>(prefix, store);
  return c10::make_intrusive<c10d::ProcessGroupNCCL>(ps, rank, size, opts);
}
#endif

}  // namespace detail

/// Checks the job against pipeline P and builds its groups (see the file comment).
template <PipelineType P>
World make_world(const Env& env, const WorldOptions& opt = {})
{
  if (opt.keep_host_memory) keep_host_memory();
  World w;
  w.env = env;
  w.timeout = opt.timeout;
  w.slots = P::num_slots;
  // ---- checks each rank can make alone, before any communication
  if (env.world_size % P::num_slots != 0) {
    std::ostringstream m;
    m << "mpx: WORLD_SIZE (" << env.world_size << ") is not a multiple of the pipeline's slots (" << P::num_slots
      << "): WORLD_SIZE = replicas x slots; launch " << P::num_slots << " x k ranks (e.g. --nproc-per-node "
      << P::num_slots << ")";
    throw config_error(m.str());
  }
  w.replicas = env.world_size / P::num_slots;
  w.slot = env.rank % P::num_slots;
  w.replica = env.rank / P::num_slots;
  bool gpu = false;
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    ((gpu = gpu || (P::template stage<int(I)>::kind == DeviceKind::cuda && P::slots[I] == w.slot)), ...);
  }(std::make_index_sequence<std::size_t(P::num_stages)>{});
  if (gpu) {
    const auto n = static_cast<int>(torch::cuda::device_count());
    if (n == 0 && !opt.allow_cpu)
      throw config_error("mpx: slot " + std::to_string(w.slot) + " has GPU stages but this machine has no CUDA device "
                         "(or LibTorch was built without CUDA); run on a GPU machine, or declare the stages on mpx::CPU<i> "
                         "(or set WorldOptions::allow_cpu to run GPU stages on CPU)");
    if (n > 0 && n < env.local_world_size)
      throw config_error("mpx: this node runs " + std::to_string(env.local_world_size) + " ranks but has only " +
                         std::to_string(n) + " CUDA devices; one rank needs one device: launch at most " +
                         std::to_string(n) + " ranks per node");
    w.device = n > 0 ? torch::Device(torch::kCUDA, env.local_rank) : torch::Device(torch::kCPU);
  }
  // ---- rendezvous: the store, then can every rank reach every other?
  w.store = make_store(env, opt.timeout);
  const detail::GlooEndpoint host = detail::gloo_endpoint(env);
  check_reachable(*w.store, host, env, opt.timeout);
  // every rank builds world, then its pipeline group, then its data-parallel group (same global order).
  // NCCL carries a group only when all its members compute on CUDA: the pipeline group when every stage is
  // a GPU stage, the data-parallel group when this slot's are; otherwise Gloo (tensors staged through CPU).
  w.world = detail::make_gloo(w.store, "mpx/world/", env.rank, env.world_size, opt.timeout, host, env.rank);
  const std::string pp_prefix = "mpx/pp/" + std::to_string(w.replica) + "/", dp_prefix = "mpx/dp/" + std::to_string(w.slot) + "/";
#if defined(USE_C10D_NCCL)
  bool all_gpu = true;
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    ((all_gpu = all_gpu && P::template stage<int(I)>::kind == DeviceKind::cuda), ...);
  }(std::make_index_sequence<std::size_t(P::num_stages)>{});
  const bool cuda = w.device.is_cuda();
  if (cuda) c10::cuda::set_device(w.device.index());
  w.pp = cuda && all_gpu ? detail::make_nccl(w.store, pp_prefix, w.slot, w.slots, opt.timeout)
                         : detail::make_gloo(w.store, pp_prefix, w.slot, w.slots, opt.timeout, host, env.rank);
  w.dp = cuda ? detail::make_nccl(w.store, dp_prefix, w.replica, w.replicas, opt.timeout)
              : detail::make_gloo(w.store, dp_prefix, w.replica, w.replicas, opt.timeout, host, env.rank);
  if (cuda && all_gpu) w.comm_device = w.device;
#else
  w.pp = detail::make_gloo(w.store, pp_prefix, w.slot, w.slots, opt.timeout, host, env.rank);
  w.dp = detail::make_gloo(w.store, dp_prefix, w.replica, w.replicas, opt.timeout, host, env.rank);
#endif
  // ---- all ranks run the same pipeline?
  const auto mine = static_cast<std::int64_t>(fingerprint_v<P>);
  std::vector<at::Tensor> in{torch::full({1}, mine, torch::kLong)};
  std::vector<std::vector<at::Tensor>> out(1);
  for (int r = 0; r < env.world_size; ++r) out[0].push_back(torch::zeros({1}, torch::kLong));
  w.world->allgather(out, in)->wait(opt.timeout);
  std::string differ;
  for (int r = 0; r < env.world_size; ++r)
    if (out[0][std::size_t(r)].item<std::int64_t>() != mine) differ += " " + std::to_string(r);
  if (!differ.empty())
    throw config_error("mpx: ranks" + differ + " run a different pipeline than rank " + std::to_string(env.rank) +
                       " (the pipeline fingerprints differ: another binary, pipeline type or micro-batch count); start "
                       "every rank from the same build with the same configuration");
  check_run_settings(*w.store, opt.settings, env.rank, env.world_size, opt.timeout);
  return w;
}

}  // namespace mpx
