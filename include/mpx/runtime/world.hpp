// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file runtime/world.hpp
/// `mpx::World`: the process groups of one run. Rendezvous through a c10d TCPStore at MASTER_ADDR:PORT,
/// a world group, this rank's pipeline group (the slots of its replica) and its data-parallel group (its
/// slot in every replica). Global rank = replica * slots + slot. Gloo on CPU; NCCL for CUDA stages when
/// LibTorch has it (USE_C10D_NCCL). Before anything else every rank checks what it can alone (WORLD_SIZE a
/// multiple of the slots, devices present), then all ranks compare the pipeline fingerprint in one
/// collective: any mismatch stops every rank with a message naming the fix.

#include <mpx/fingerprint.hpp>     // mpx::fingerprint_v
#include <mpx/pipeline.hpp>        // mpx::PipelineType
#include <mpx/runtime/env.hpp>     // mpx::Env
#include <mpx/runtime/errors.hpp>  // mpx::config_error
#include <mpx/torch/host_memory.hpp>  // mpx::keep_host_memory
#include <mpx/torch/version.hpp>    // MPX_TORCH_AT_LEAST

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>       // c10d::PrefixStore
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>  // c10d::ProcessGroupGloo
#include <torch/csrc/distributed/c10d/TCPStore.hpp>          // c10d::TCPStore
#include <torch/cuda.h>                                       // torch::cuda::device_count
#include <torch/torch.h>                                      // torch::Device, torch::full
#if defined(USE_C10D_NCCL)
#include <c10/cuda/CUDAFunctions.h>                          // c10::cuda::set_device
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>  // c10d::ProcessGroupNCCL
#endif

#include <chrono>    // std::chrono::milliseconds
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
                                 std::chrono::milliseconds timeout, const std::string& host)
{
  auto opts = c10d::ProcessGroupGloo::Options::create(timeout);
  opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(host));
  auto ps = c10::make_intrusive<c10d::PrefixStore>(prefix, store);
  return c10::make_intrusive<c10d::ProcessGroupGloo>(ps, rank, size, opts);
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

/// This host's address for Gloo: loopback when the master is local, else the machine's host name.
inline std::string gloo_host(const Env& e)
{
  if (e.master_addr == "127.0.0.1" || e.master_addr == "localhost") return "127.0.0.1";
  char name[256] = {};
  ::gethostname(name, sizeof name - 1);
  return name;
}
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
  // ---- rendezvous
  c10d::TCPStoreOptions so;
  so.port = static_cast<std::uint16_t>(env.master_port);
  so.isServer = env.rank == 0;
  so.numWorkers = static_cast<std::size_t>(env.world_size);
  so.waitWorkers = true;
  so.timeout = opt.timeout;
  try {
    w.store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, so);
  } catch (const std::exception& e) {
    throw config_error("mpx: rank " + std::to_string(env.rank) + " could not join the rendezvous at " + env.master_addr + ":" +
                       std::to_string(env.master_port) + " within " + std::to_string(opt.timeout.count()) +
                       " ms (are all WORLD_SIZE=" + std::to_string(env.world_size) + " ranks started, with the same "
                       "MASTER_ADDR/MASTER_PORT?): " + e.what());
  }
  const std::string host = detail::gloo_host(env);
  // every rank builds world, then its pipeline group, then its data-parallel group (same global order).
  // NCCL carries a group only when all its members compute on CUDA: the pipeline group when every stage is
  // a GPU stage, the data-parallel group when this slot's are; otherwise Gloo (tensors staged through CPU).
  w.world = detail::make_gloo(w.store, "mpx/world/", env.rank, env.world_size, opt.timeout, host);
  const std::string pp_prefix = "mpx/pp/" + std::to_string(w.replica) + "/", dp_prefix = "mpx/dp/" + std::to_string(w.slot) + "/";
#if defined(USE_C10D_NCCL)
  bool all_gpu = true;
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    ((all_gpu = all_gpu && P::template stage<int(I)>::kind == DeviceKind::cuda), ...);
  }(std::make_index_sequence<std::size_t(P::num_stages)>{});
  const bool cuda = w.device.is_cuda();
  if (cuda) c10::cuda::set_device(w.device.index());
  w.pp = cuda && all_gpu ? detail::make_nccl(w.store, pp_prefix, w.slot, w.slots, opt.timeout)
                         : detail::make_gloo(w.store, pp_prefix, w.slot, w.slots, opt.timeout, host);
  w.dp = cuda ? detail::make_nccl(w.store, dp_prefix, w.replica, w.replicas, opt.timeout)
              : detail::make_gloo(w.store, dp_prefix, w.replica, w.replicas, opt.timeout, host);
  if (cuda && all_gpu) w.comm_device = w.device;
#else
  w.pp = detail::make_gloo(w.store, pp_prefix, w.slot, w.slots, opt.timeout, host);
  w.dp = detail::make_gloo(w.store, dp_prefix, w.replica, w.replicas, opt.timeout, host);
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
  return w;
}

}  // namespace mpx
