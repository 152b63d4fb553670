// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file runtime/zero_state.hpp
/// A ZeRO shard's optimizer state as a checkpoint holds it: whole, by parameter. `gather_state` (a
/// collective over the shard's replicas) fills an unsharded optimizer of the same kind with every
/// parameter's moments; `scatter_state` takes this replica's pieces back from one (after a load). The
/// shards: zero_shard.hpp; the moments by field name: optim/moments.hpp.

#include <mpx/linkage.hpp>               // MPX_DECL, MPX_DEFINITIONS
#include <mpx/optim/moments.hpp>         // mpx::detail::Moments, moments_of, set_moments, moment_names
#include <mpx/runtime/zero_shard.hpp>    // mpx::ZeroShard

#include <torch/torch.h>  // torch::optim::Optimizer

namespace mpx
{

/// Collective: `whole` (an optimizer of the same kind over the stage's parameters) gets the whole state of
/// `shard` (the optimizer over `z`'s pieces) — each parameter's step the largest any replica holds.
MPX_DECL void gather_state(const ZeroShard& z, torch::optim::Optimizer& shard, torch::optim::Optimizer& whole);
/// This replica's pieces of `whole`'s state into `shard` (after a checkpoint loaded into `whole`).
MPX_DECL void scatter_state(const ZeroShard& z, torch::optim::Optimizer& whole, torch::optim::Optimizer& shard);

}  // namespace mpx

#if MPX_DEFINITIONS
// ---- definitions (compiled once under MPX_SEPARATE_COMPILATION: linkage.hpp) ----
#include <mpx/errors.hpp>  // mpx::peer_error

#include <map>     // std::map
#include <string>  // std::string

namespace mpx
{
namespace detail
{
/// The replicas' shards of one flat field, end to end (d x S elements).
inline at::Tensor gather_field(const ZeroShard& z, const at::Tensor& flat_shard, const std::string& what)
{
  const auto& g = z.group();
  if (g.replicas == 1) return flat_shard;
  auto whole = torch::empty({z.shard_size() * g.replicas}, flat_shard.options());
  std::vector<std::vector<at::Tensor>> out(1);
  for (int r = 0; r < g.replicas; ++r) out[0].push_back(whole.narrow(0, r * z.shard_size(), z.shard_size()));
  std::vector<at::Tensor> in{flat_shard};
  try {
    wait_bounded(g.dp->allgather(out, in), flat_shard.device(), g.timeout);
  } catch (const std::exception& e) {
    throw peer_error("mpx: rank " + std::to_string(g.rank) + ", the all-gather of the sharded optimizer state (" + what +
                     ") for a checkpoint: a data-parallel peer did not arrive: " + e.what());
  }
  return whole;
}
}  // namespace detail

MPX_DECL void gather_state(const ZeroShard& z, torch::optim::Optimizer& shard, torch::optim::Optimizer& whole)
{
  const auto& params = z.params();
  const auto& places = z.places();
  const auto& g = z.group();
  // the steps: each parameter's from the replica(s) holding its pieces, the largest (0: no state anywhere)
  auto steps = torch::zeros({std::int64_t(params.size())}, torch::kDouble);
  std::map<std::string, at::Tensor> flats;
  for (const auto& n : detail::moment_names(shard)) flats[n] = torch::zeros({z.shard_size()}, torch::kFloat);
  for (std::size_t i = 0, k = 0; i < params.size(); ++i) {
    const auto& pl = places[i];
    if (pl.hi <= pl.lo) continue;
    const auto m = detail::moments_of(shard, z.pieces()[k++]);
    steps[std::int64_t(i)] = double(m.step);
    for (auto& [n, t] : m.fields) flats.at(n).narrow(0, pl.at, pl.hi - pl.lo).copy_(t.reshape(-1));
  }
  if (g.replicas > 1) {
    std::vector<at::Tensor> v{steps};
    c10d::AllreduceOptions max;
    max.reduceOp = c10d::ReduceOp::MAX;
    try {
      detail::wait_bounded(g.dp->allreduce(v, max), steps.device(), g.timeout);
    } catch (const std::exception& e) {
      throw peer_error("mpx: rank " + std::to_string(g.rank) + ", the sharded optimizer state's steps for a checkpoint: a data-parallel peer did not arrive: " +
                       e.what());
    }
  }
  for (auto& [n, f] : flats) f = detail::gather_field(z, f, n);
  for (std::size_t i = 0; i < params.size(); ++i) {
    detail::Moments m;
    m.step = std::int64_t(steps[std::int64_t(i)].item<double>());
    if (m.step == 0) continue;
    const auto& pl = places[i];
    for (auto& [n, f] : flats) m.fields[n] = f.narrow(0, pl.offset, pl.numel).view(pl.sizes).to(params[i].device()).clone();
    detail::set_moments(whole, params[i], m);
  }
}

MPX_DECL void scatter_state(const ZeroShard& z, torch::optim::Optimizer& whole, torch::optim::Optimizer& shard)
{
  for (std::size_t i = 0, k = 0; i < z.params().size(); ++i) {
    const auto& pl = z.places()[i];
    if (pl.hi <= pl.lo) continue;
    const auto& piece = z.pieces()[k++];
    auto m = detail::moments_of(whole, z.params()[i]);
    if (m.step == 0) continue;
    for (auto& [n, t] : m.fields) t = t.reshape(-1).narrow(0, pl.lo, pl.hi - pl.lo).to(piece.device()).clone();
    detail::set_moments(shard, piece, m);
  }
}

}  // namespace mpx
#endif  // MPX_DEFINITIONS
