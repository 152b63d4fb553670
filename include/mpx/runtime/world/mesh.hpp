// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file runtime/world/mesh.hpp
/// How `make_world` (world.hpp) builds a rank's World, as its phases: `place_on_mesh` — the checks a rank
/// can make alone (WORLD_SIZE a multiple of the ranks of one pipeline, devices present) and its place on
/// the mesh (replica, slot, tensor-parallel rank, device); then the rendezvous (rendezvous.hpp); then the
/// world group and `check_same_pipeline` — the pipeline fingerprints compared in one collective before any
/// other group is built (ranks of different pipelines would wait for each other's groups); then
/// `make_mesh_groups` — this rank's lanes, channels, tensor-parallel and data-parallel groups; then the run
/// settings (run_settings.hpp).

#include <mpx/linkage.hpp>                   // MPX_DECL, MPX_DEFINITIONS
#include <mpx/runtime/world/rendezvous.hpp>  // mpx::detail::GlooEndpoint
#include <mpx/runtime/world/world.hpp>       // mpx::World, mpx::WorldOptions, mpx::detail::WorldShape

#include <chrono>  // std::chrono::milliseconds
#include <string>  // std::string

namespace mpx::detail
{

/// A Gloo group of `size` members named by the store prefix `prefix`, listening on `at`.
MPX_DECL ProcessGroupPtr make_gloo(const c10::intrusive_ptr<c10d::Store>& store, const std::string& prefix, int rank, int size,
                                   std::chrono::milliseconds timeout, const GlooEndpoint& at, int global_rank);

/// A group of this rank's: Gloo, or NCCL when `nccl` (all its members compute on CUDA) and LibTorch has it.
MPX_DECL ProcessGroupPtr make_group(World& w, bool nccl, const std::string& prefix, int rank, int size, const GlooEndpoint& host,
                                    std::chrono::milliseconds timeout);

/// Where pipeline messages travel as on NCCL (`World::ordered`: the lanes on NCCL when `nccl`, or
/// MPX_NCCL_RULES on CPU), a group per (lane, channel) of which this rank is an end: member 0 the sender,
/// member 1 the receiver; under the stand-in each one an `NcclRulesGroup` over Gloo.
MPX_DECL void make_channel_groups(World& w, const WorldShape& shape, const GlooEndpoint& host, std::chrono::milliseconds timeout, bool nccl);

/// Builds this rank's groups of the mesh (world.hpp), every rank in the same global order: lanes in
/// increasing j, then the channels' groups (make_channel_groups) by lane, then channel, then tensor-parallel,
/// then data-parallel — a rank waits in a group's making only for members that make no group before it,
/// so the making cannot deadlock. NCCL carries a group only when all its members compute on CUDA: the lanes
/// (and channels) when every stage is a GPU stage, the others when this slot's are; otherwise Gloo (tensors
/// staged through CPU).
MPX_DECL void make_mesh_groups(World& w, const WorldShape& shape, const GlooEndpoint& host, std::chrono::milliseconds timeout);

/// The CUDA device a rank of a GPU slot computes on, of the `visible` ones: its LOCAL_RANK when the node's
/// ranks share the node's devices, device 0 when the rank sees one (one GPU per task: CUDA_VISIBLE_DEVICES
/// per rank, SLURM's --gpus-per-task=1); fewer is a `config_error` naming both fixes.
MPX_DECL int cuda_device_index(int visible, int local_rank, int local_world_size);

/// A World with this rank's place on the mesh of `shape`, after the checks it can make alone.
MPX_DECL World place_on_mesh(const Env& env, const WorldOptions& opt, const WorldShape& shape);

/// Compares the pipeline fingerprint over the world group (a collective); a difference is a
/// `config_error` naming the ranks that differ.
MPX_DECL void check_same_pipeline(World& w, std::int64_t fingerprint, std::chrono::milliseconds timeout);

}  // namespace mpx::detail

#if MPX_DEFINITIONS
// ---- definitions (compiled once under MPX_SEPARATE_COMPILATION: linkage.hpp) ----
#include <mpx/torch/host_memory.hpp>  // mpx::keep_host_memory
#include <mpx/torch/nccl_rules.hpp>   // mpx::NcclRulesGroup

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>       // c10d::PrefixStore
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>  // c10d::ProcessGroupGloo
#include <torch/cuda.h>                                       // torch::cuda::device_count
#if defined(USE_C10D_NCCL)
#include <c10/cuda/CUDAFunctions.h>                          // c10::cuda::set_device
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>  // c10d::ProcessGroupNCCL
#endif

#include <sstream>  // std::ostringstream

namespace mpx::detail
{
MPX_DECL ProcessGroupPtr make_gloo(const c10::intrusive_ptr<c10d::Store>& store, const std::string& prefix, int rank, int size,
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
MPX_DECL ProcessGroupPtr make_nccl(const c10::intrusive_ptr<c10d::Store>& store, const std::string& prefix, int rank, int size,
                                 std::chrono::milliseconds timeout)
{
  auto opts = c10d::ProcessGroupNCCL::Options::create();
  opts->timeout = timeout;
  auto ps = c10::make_intrusive<c10d::PrefixStore>(prefix, store);
  return c10::make_intrusive<c10d::ProcessGroupNCCL>(ps, rank, size, opts);
}
#endif

MPX_DECL ProcessGroupPtr make_group(World& w, bool nccl, const std::string& prefix, int rank, int size, const GlooEndpoint& host,
                                    std::chrono::milliseconds timeout)
{
#if defined(USE_C10D_NCCL)
  if (nccl) return make_nccl(w.store, prefix, rank, size, timeout);
#else
  (void)nccl;
#endif
  return make_gloo(w.store, prefix, rank, size, timeout, host, w.env.rank);
}

MPX_DECL void make_channel_groups(World& w, const WorldShape& shape, const GlooEndpoint& host, std::chrono::milliseconds timeout, bool nccl)
{
  w.nccl_rules = w.env.nccl_rules && !nccl;
  if (!w.ordered()) return;
  const std::string rep = std::to_string(w.replica);
  const int stages = int(shape.stage_slot.size());
  for (int j = 0; j < shape.lanes; ++j) {
    if (!w.in_lane(j)) continue;
    for (int ch = 0; ch < 2 * (stages - 1); ++ch) {  // 2b: activations from stage b to b+1; 2b+1: their gradients back
      const int b = ch / 2, from = shape.stage_slot[std::size_t(ch % 2 ? b + 1 : b)], to = shape.stage_slot[std::size_t(ch % 2 ? b : b + 1)];
      if (from == to || (w.slot != from && w.slot != to)) continue;
      const std::string prefix = "mpx/ch/" + rep + "/" + std::to_string(j) + "/" + std::to_string(ch) + "/";
      ProcessGroupPtr g = make_group(w, nccl, prefix, w.slot == from ? 0 : 1, 2, host, timeout);
      if (w.nccl_rules) g = c10::make_intrusive<NcclRulesGroup>(g, timeout, "channel " + std::to_string(ch) + " of lane " + std::to_string(j));
      w.channels[{j, ch}] = g;
    }
  }
}

MPX_DECL void make_mesh_groups(World& w, const WorldShape& shape, const GlooEndpoint& host, std::chrono::milliseconds timeout)
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
  make_channel_groups(w, shape, host, timeout, cuda && all_gpu);
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

MPX_DECL int cuda_device_index(int visible, int local_rank, int local_world_size)
{
  if (visible == 1) return 0;
  if (visible >= local_world_size) return local_rank;
  throw config_error("mpx: this node runs " + std::to_string(local_world_size) + " ranks but each sees " + std::to_string(visible) +
                     " CUDA devices; one rank needs one device: launch at most " + std::to_string(visible) +
                     " ranks per node, or give each rank a device of its own (CUDA_VISIBLE_DEVICES per rank, SLURM --gpus-per-task=1)");
}

MPX_DECL World place_on_mesh(const Env& env, const WorldOptions& opt, const WorldShape& shape)
{
  World w;
  w.env = env;
  w.timeout = opt.timeout;
  w.slots = shape.slots;
  w.ranks_per_replica = shape.ranks_per_replica;
  w.degree = shape.degree;
  w.first_rank = shape.first_rank;
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
    w.device = n > 0 ? torch::Device(torch::kCUDA, cuda_device_index(n, env.local_rank, env.local_world_size)) : torch::Device(torch::kCPU);
  }
  return w;
}

MPX_DECL void check_same_pipeline(World& w, std::int64_t mine, std::chrono::milliseconds timeout)
{
  const int world = w.env.world_size;
  std::vector<at::Tensor> in{torch::full({1}, mine, torch::kLong)};
  std::vector<std::vector<at::Tensor>> out(1);
  for (int r = 0; r < world; ++r) out[0].push_back(torch::zeros({1}, torch::kLong));
  w.world->allgather(out, in)->wait(timeout);
  std::ostringstream ranks;  // (a stream: GCC 12 warns falsely on " " + std::to_string(r) here)
  for (int r = 0; r < world; ++r)
    if (out[0][std::size_t(r)].item<std::int64_t>() != mine) ranks << ' ' << r;
  const std::string differ = ranks.str();
  if (!differ.empty())
    throw config_error("mpx: ranks" + differ + " run a different pipeline than rank " + std::to_string(w.env.rank) +
                       " (the pipeline fingerprints differ: another binary, pipeline type, tensor-parallel degree or micro-batch "
                       "count); start every rank from the same build with the same configuration");
}

MPX_DECL World make_world(const Env& env, const WorldOptions& opt, const WorldShape& shape)
{
  if (opt.keep_host_memory && env.keep_host_memory) keep_host_memory();
  World w = place_on_mesh(env, opt, shape);
  w.store = opt.store ? opt.store : make_store(env, opt.timeout);
  const GlooEndpoint host = gloo_endpoint(env);
  check_reachable(*w.store, host, env, opt.timeout);
  w.world = make_gloo(w.store, "mpx/world/", env.rank, env.world_size, opt.timeout, host, env.rank);
  check_same_pipeline(w, shape.fingerprint, opt.timeout);
  make_mesh_groups(w, shape, host, opt.timeout);
  check_run_settings(*w.store, opt.settings, env.rank, env.world_size, opt.timeout);
  return w;
}

}  // namespace mpx::detail
#endif  // MPX_DEFINITIONS
