// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file runtime/world/world.hpp
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

#include <mpx/errors.hpp>                     // mpx::config_error, mpx::peer_error
#include <mpx/fingerprint.hpp>                // mpx::fingerprint_v
#include <mpx/linkage.hpp>                    // MPX_DECL, MPX_DEFINITIONS
#include <mpx/pipeline.hpp>                   // mpx::PipelineType
#include <mpx/runtime/launch/env.hpp>         // mpx::Env
#include <mpx/runtime/world/run_settings.hpp>  // mpx::RunSettings
#include <mpx/torch/process_group.hpp>        // mpx::ProcessGroupPtr
#include <mpx/tp/group.hpp>                   // mpx::tp::Group

#include <torch/torch.h>  // torch::Device

#include <chrono>   // std::chrono::milliseconds
#include <map>      // std::map
#include <string>   // std::string
#include <utility>  // std::pair
#include <vector>   // std::vector

namespace mpx
{

/// How a run starts.
struct WorldOptions
{
  std::chrono::milliseconds timeout{60000};  ///< every wait: rendezvous, messages, collectives
  bool allow_cpu = false;  ///< run GPU<i> stages on CPU when there is no CUDA (the examples opt in)
  RunSettings settings;  ///< the program's run settings (config, seed, data...): every rank must start with the same (run_settings.hpp)
  bool keep_host_memory = true;  ///< mpx::keep_host_memory(): large CPU tensors from a cache, no page faults each step (torch/host_memory.hpp)
  /// A store this rank already joined (`make_store`: e.g. to exchange measured speeds before choosing the pipeline
  /// type, speeds.hpp); null: the world makes its own.
  c10::intrusive_ptr<c10d::Store> store;
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
  /// Pipeline messages travel as on NCCL (`ordered()`): per (lane, channel) this rank is an end of, the
  /// group of the channel's two ranks — member 0 sends, member 1 receives (boundary_links.hpp).
  std::map<std::pair<int, int>, ProcessGroupPtr> channels;
  bool nccl_rules = false;  ///< MPX_NCCL_RULES=1: on CPU, the channels' groups are NCCL-rules stand-ins (torch/nccl_rules.hpp)
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
  /// Whether pipeline messages travel as on NCCL: a group per channel, header then payloads (the lanes are
  /// NCCL groups, or the NCCL-rules stand-in is on).
  bool ordered() const { return comm_device.is_cuda() || nccl_rules; }
  /// Whether this rank takes part in lane j.
  bool in_lane(int j) const { return j % tp_size == tp_rank; }

  /// A fresh prefix for the store keys of one collective use of `what` ("mpx/save/3/"): every rank of the
  /// world makes the same uses in the same order, so all agree on it, and no key is used twice.
  std::string next_key(const std::string& what) { return "mpx/" + what + "/" + std::to_string(key_uses[what]++) + "/"; }
  std::map<std::string, long> key_uses;  ///< per `what`, the uses of `next_key` so far

  World() = default;
  MPX_DECL World(World&&) noexcept;  // out of line: its groups' destructors are compiled once (linkage.hpp)
  MPX_DECL World& operator=(World&&) noexcept;
  MPX_DECL ~World();
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

/// `make_world` of a pipeline described by `shape` (see the file comment; mesh.hpp).
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
// ---- definitions (compiled once under MPX_SEPARATE_COMPILATION: linkage.hpp) ----
#include <mpx/runtime/world/mesh.hpp>  // mpx::detail::make_world's definition, as its phases

namespace mpx
{

MPX_DECL World::World(World&&) noexcept = default;
MPX_DECL World& World::operator=(World&&) noexcept = default;
MPX_DECL World::~World() = default;

MPX_DECL void barrier(World& w, const std::string& what)
{
  if (!w.world && w.env.world_size == 1) return;  // a world of one without groups (checkpoint/local.hpp's one-process checkpoints)
  std::vector<at::Tensor> v{torch::zeros({1})};
  try {
    w.world->allreduce(v)->wait(w.timeout);
  } catch (const std::exception& e) {
    throw peer_error("mpx: rank " + std::to_string(w.env.rank) + ", " + what + ": a peer did not arrive: " + e.what());
  }
}

}  // namespace mpx
#endif  // MPX_DEFINITIONS
