// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file runtime/world.hpp
/// `mpx::World`: the process groups of one run. Rendezvous through a c10d TCPStore at MASTER_ADDR:PORT,
/// then a world group and this rank's groups on the run's 3-D mesh. One pipeline (a replica) has
/// `P::ranks_per_replica` ranks: slot s occupies `P::tp_degree[s]` adjacent ones, its tensor-parallel
/// ranks, so global rank = replica * ranks_per_replica + P::first_rank[slot] + tp_rank. Groups:
/// - `tp`: the ranks of this rank's slot in its replica (tensor parallelism; the group of one at degree 1);
/// - `lanes`: pipeline lanes j < P::num_lanes, each with one member per slot — slot s's rank j mod
///   degree(s) — so that every pipeline message has one sender and one receiver in some lane
///   (boundary_links.hpp); a rank is in the lanes j with j mod its degree = its tp_rank, and `pp` is lane
///   tp_rank, the one it receives on. At degree 1 everywhere there is one lane: the slots of the replica;
/// - `dp`: the same (slot, tp_rank) in every replica (data parallelism).
/// Gloo on CPU; NCCL for CUDA stages when LibTorch has it (USE_C10D_NCCL). Before anything else every rank
/// checks what it can alone (WORLD_SIZE a multiple of the ranks of one pipeline, devices present), then
/// all ranks compare the pipeline fingerprint in one collective: any mismatch stops every rank with a message naming the fix. Gloo listens on the interface
/// `GLOO_SOCKET_IFNAME` names, else on this host's address of the route to MASTER_ADDR (never on what the
/// host name resolves to, which is loopback on a default Debian); a group whose peers cannot reach each
/// other stops within the timeout with a `peer_error` naming the address and the fix.

#include <mpx/fingerprint.hpp>     // mpx::fingerprint_v
#include <mpx/pipeline.hpp>        // mpx::PipelineType
#include <mpx/runtime/env.hpp>     // mpx::Env
#include <mpx/runtime/errors.hpp>  // mpx::config_error
#include <mpx/runtime/process_group.hpp>  // mpx::ProcessGroupPtr
#include <mpx/runtime/run_settings.hpp>  // mpx::RunSettings, mpx::check_run_settings
#include <mpx/runtime/rendezvous.hpp>  // mpx::make_store, mpx::check_reachable, mpx::detail::gloo_endpoint
#include <mpx/torch/host_memory.hpp>  // mpx::keep_host_memory
#include <mpx/torch/version.hpp>    // MPX_TORCH_AT_LEAST
#include <mpx/tp/group.hpp>          // mpx::tp::Group

#include <mpx/runtime/linkage.hpp>  // MPX_DECL, MPX_DEFINITIONS

#include <torch/torch.h>  // torch::Device, torch::full

#include <chrono>    // std::chrono::milliseconds
#include <cstdlib>   // std::getenv
#include <iostream>  // std::cerr
#include <string>    // std::string
#include <vector>    // std::vector

namespace mpx
{

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
  int slots = 1;     ///< pipeline slots per replica
  int replicas = 1;  ///< data-parallel copies
  int slot = 0;      ///< this rank's pipeline position
  int replica = 0;   ///< this rank's replica
  int tp_rank = 0;   ///< this rank's place among its slot's tensor-parallel ranks
  int tp_size = 1;   ///< its slot's tensor-parallel degree
  int ranks_per_replica = 1;
  std::vector<int> degree, first_rank;     ///< per slot: its tensor-parallel degree, its first rank in a replica
  torch::Device device{torch::kCPU};       ///< where this rank's stages compute
  torch::Device comm_device{torch::kCPU};  ///< where pipeline messages live: CPU for Gloo, the GPU for NCCL
  std::chrono::milliseconds timeout{60000};
  c10::intrusive_ptr<c10d::Store> store;
  ProcessGroupPtr world, pp, dp;
  std::vector<ProcessGroupPtr> lanes;  ///< per lane, its group (null where this rank is not a member); pp = lanes[tp_rank]
  tp::GroupPtr tp = c10::make_intrusive<tp::Group>();  ///< this slot's tensor-parallel group

  /// Global rank of (replica, slot, tensor-parallel rank).
  int global_rank(int rep, int s, int t = 0) const { return rep * ranks_per_replica + first_rank[std::size_t(s)] + t; }
  /// The slot a global rank belongs to.
  int slot_of(int rank) const
  {
    const int r = rank % ranks_per_replica;
    int s = 0;
    while (s + 1 < slots && first_rank[std::size_t(s + 1)] <= r) ++s;
    return s;
  }
  /// Whether this rank takes part in lane j.
  bool in_lane(int j) const { return j % tp_size == tp_rank; }
};

/// Waits until every rank of the world has arrived (with the run's timeout); `what` names the place in the
/// error a missing peer causes.
MPX_DECL void barrier(World& w, const std::string& what);

namespace detail
{
/// What `make_world` needs of the pipeline type, as values (the rest of it is compiled once).
struct WorldShape
{
  int slots = 1, ranks_per_replica = 1, lanes = 1;
  std::vector<int> degree, first_rank;  ///< per slot
  std::vector<int> stage_slot;          ///< per stage: its slot
  std::vector<bool> stage_cuda;         ///< per stage: declared on a GPU
  std::int64_t fingerprint = 0;         ///< fingerprint_v<P>
};

/// `make_world` of a pipeline described by `shape` (see the file comment).
MPX_DECL World make_world(const Env& env, const WorldOptions& opt, const WorldShape& shape);
}  // namespace detail

/// Checks the job against pipeline P and builds its groups (see the file comment).
template <PipelineType P>
World make_world(const Env& env, const WorldOptions& opt = {})
{
  detail::WorldShape shape;
  shape.slots = P::num_slots;
  shape.ranks_per_replica = P::ranks_per_replica;
  shape.lanes = P::num_lanes;
  shape.degree.assign(P::tp_degree.begin(), P::tp_degree.end());
  shape.first_rank.assign(P::first_rank.begin(), P::first_rank.end());
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    ((shape.stage_slot.push_back(P::slots[I]), shape.stage_cuda.push_back(P::template stage<int(I)>::kind == DeviceKind::cuda)), ...);
  }(std::make_index_sequence<std::size_t(P::num_stages)>{});
  shape.fingerprint = static_cast<std::int64_t>(fingerprint_v<P>);
  return detail::make_world(env, opt, shape);
}

}  // namespace mpx

#if MPX_DEFINITIONS
// ---- definitions (compiled once under MPX_SEPARATE_COMPILATION: runtime/linkage.hpp) ----
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>       // c10d::PrefixStore
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>  // c10d::ProcessGroupGloo
#include <torch/cuda.h>                                       // torch::cuda::device_count
#if defined(USE_C10D_NCCL)
#include <c10/cuda/CUDAFunctions.h>                          // c10::cuda::set_device
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>  // c10d::ProcessGroupNCCL
#endif

#include <sstream>  // std::ostringstream

namespace mpx
{

MPX_DECL void barrier(World& w, const std::string& what)
{
  if (!w.world && w.env.world_size == 1) return;  // a world of one without groups (state_io's one-process checkpoints)
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

/// A group of this rank's: Gloo, or NCCL when `nccl` (all its members compute on CUDA).
inline ProcessGroupPtr make_group(World& w, bool nccl, const std::string& prefix, int rank, int size, const GlooEndpoint& host,
                                  std::chrono::milliseconds timeout)
{
#if defined(USE_C10D_NCCL)
  if (nccl) return make_nccl(w.store, prefix, rank, size, timeout);
#else
  (void)nccl;
#endif
  return make_gloo(w.store, prefix, rank, size, timeout, host, w.env.rank);
}

/// Builds this rank's groups of the mesh (see the file comment), every rank in the same global order:
/// lanes in increasing j, then tensor-parallel, then data-parallel. NCCL carries a group only when all its
/// members compute on CUDA: the lanes when every stage is a GPU stage, the others when this slot's are;
/// otherwise Gloo (tensors staged through CPU).
inline void make_mesh_groups(World& w, const WorldShape& shape, const GlooEndpoint& host, std::chrono::milliseconds timeout)
{
  bool all_gpu = true;
  for (bool c : shape.stage_cuda) all_gpu = all_gpu && c;
  const bool cuda = w.device.is_cuda();
#if defined(USE_C10D_NCCL)
  if (cuda) c10::cuda::set_device(w.device.index());
#endif
  const std::string rep = std::to_string(w.replica), slot = std::to_string(w.slot);
  w.lanes.assign(std::size_t(shape.lanes), ProcessGroupPtr());
  for (int j = 0; j < shape.lanes; ++j)
    if (w.in_lane(j))
      w.lanes[std::size_t(j)] = make_group(w, cuda && all_gpu, "mpx/pp/" + rep + "/" + std::to_string(j) + "/", w.slot, w.slots, host, timeout);
  w.pp = w.lanes[std::size_t(w.tp_rank)];
#if defined(USE_C10D_NCCL)
  if (cuda && all_gpu) w.comm_device = w.device;  // the lanes are NCCL groups: messages stay on the device
#endif
  if (w.tp_size > 1) {
    w.tp->pg = make_group(w, cuda, "mpx/tp/" + rep + "/" + slot + "/", w.tp_rank, w.tp_size, host, timeout);
    w.tp->rank = w.tp_rank;
    w.tp->size = w.tp_size;
    w.tp->timeout = timeout;
    const int first = w.global_rank(w.replica, w.slot);
    w.tp->name = "tensor-parallel group of slot " + slot + ", replica " + rep + " (ranks " + std::to_string(first) + ".." +
                 std::to_string(first + w.tp_size - 1) + ")";
  }
  w.dp = make_group(w, cuda, "mpx/dp/" + slot + "/" + std::to_string(w.tp_rank) + "/", w.replica, w.replicas, host, timeout);
}

MPX_DECL World make_world(const Env& env, const WorldOptions& opt, const WorldShape& shape)
{
  if (opt.keep_host_memory) keep_host_memory();
  World w;
  w.env = env;
  w.timeout = opt.timeout;
  w.slots = shape.slots;
  w.ranks_per_replica = shape.ranks_per_replica;
  w.degree = shape.degree;
  w.first_rank = shape.first_rank;
  // ---- checks each rank can make alone, before any communication
  if (env.world_size % shape.ranks_per_replica != 0) {
    std::ostringstream m;
    m << "mpx: WORLD_SIZE (" << env.world_size << ") is not a multiple of the ranks of one pipeline (" << shape.ranks_per_replica;
    if (shape.lanes > 1) {
      m << " =";
      for (int s = 0; s < shape.slots; ++s) m << (s ? " +" : "") << " slot " << s << ": " << shape.degree[std::size_t(s)];
    } else {
      m << ", its slots";
    }
    m << "): WORLD_SIZE = replicas x " << shape.ranks_per_replica << "; launch " << shape.ranks_per_replica << " x k ranks (e.g. --nproc-per-node "
      << shape.ranks_per_replica << ")";
    throw config_error(m.str());
  }
  w.replicas = env.world_size / shape.ranks_per_replica;
  w.replica = env.rank / shape.ranks_per_replica;
  w.slot = w.slot_of(env.rank);
  w.tp_rank = env.rank % shape.ranks_per_replica - w.first_rank[std::size_t(w.slot)];
  w.tp_size = w.degree[std::size_t(w.slot)];
  bool gpu = false;
  for (std::size_t i = 0; i < shape.stage_slot.size(); ++i) gpu = gpu || (shape.stage_cuda[i] && shape.stage_slot[i] == w.slot);
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
  const GlooEndpoint host = gloo_endpoint(env);
  check_reachable(*w.store, host, env, opt.timeout);
  // the world group first, and on it the one question every rank must agree on before building the mesh's
  // groups (ranks of different pipelines would wait for each other's groups): the same pipeline?
  w.world = make_gloo(w.store, "mpx/world/", env.rank, env.world_size, opt.timeout, host, env.rank);
  const std::int64_t mine = shape.fingerprint;
  std::vector<at::Tensor> in{torch::full({1}, mine, torch::kLong)};
  std::vector<std::vector<at::Tensor>> out(1);
  for (int r = 0; r < env.world_size; ++r) out[0].push_back(torch::zeros({1}, torch::kLong));
  w.world->allgather(out, in)->wait(opt.timeout);
  std::ostringstream ranks;  // (a stream: GCC 12 warns falsely on " " + std::to_string(r) here)
  for (int r = 0; r < env.world_size; ++r)
    if (out[0][std::size_t(r)].item<std::int64_t>() != mine) ranks << ' ' << r;
  const std::string differ = ranks.str();
  if (!differ.empty())
    throw config_error("mpx: ranks" + differ + " run a different pipeline than rank " + std::to_string(env.rank) +
                       " (the pipeline fingerprints differ: another binary, pipeline type, tensor-parallel degree or micro-batch "
                       "count); start every rank from the same build with the same configuration");
  make_mesh_groups(w, shape, host, opt.timeout);
  check_run_settings(*w.store, opt.settings, env.rank, env.world_size, opt.timeout);
  return w;
}

}  // namespace detail
}  // namespace mpx
#endif  // MPX_DEFINITIONS
