// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file runtime/zero_shard.hpp
/// `ZeroShard`: one stage's share of sharded data parallelism (ZeRO, `Sharded<L>`) on this replica. The
/// stage's trainable parameters, end to end in their order, form a flat vector of N elements cut into d
/// shards of S = ceil(N / d): replica r owns [r·S, min(N, (r+1)·S)). With several replicas the parameters
/// move into one buffer of d·S elements, which they then view (tied parameters are refused), so that the
/// all-gather writes them in place. The owned part of each parameter is a `piece`, a 1-D view of it; the
/// stage's optimizer steps the pieces only (1/d of the state; 8-bit AdamW's blocks cut at the pieces'
/// starts). A step: the gradients' owned parts are averaged (GradientBuckets reduce-scatters them into
/// `range_in`), `gradients_in` gives them to the pieces (level 1 as views, level 2 copied into a buffer of
/// S elements and the whole gradients dropped), the optimizer steps, `start_gather` / `finish_gather`
/// all-gather the buffer. Checkpoints hold the whole state by name: `gather_state` (a collective) fills an
/// unsharded optimizer with it, `scatter_state` takes this replica's pieces back from one.

#include <mpx/errors.hpp>               // mpx::config_error, mpx::peer_error
#include <mpx/linkage.hpp>              // MPX_DECL, MPX_DEFINITIONS
#include <mpx/optim/moments.hpp>        // mpx::detail::Moments, moments_of, set_moments
#include <mpx/torch/process_group.hpp>  // mpx::ProcessGroupPtr, mpx::detail::wait_bounded

#include <torch/torch.h>  // torch::optim::Optimizer

#include <chrono>   // std::chrono::milliseconds
#include <cstdint>  // std::int64_t
#include <map>      // std::map
#include <utility>  // std::pair
#include <string>   // std::string
#include <vector>   // std::vector

namespace mpx
{

/// The data-parallel group a stage is sharded over.
struct ShardGroup
{
  ProcessGroupPtr dp;  ///< null with one replica
  int index = 0;       ///< this replica's place in it
  int replicas = 1;
  std::chrono::milliseconds timeout{60000};
  int rank = 0;  ///< this rank in the world, for errors
};

class ZeroShard
{
 public:
  /// Lays out `params` (one dtype, one device) over `g` for ZeRO level `level` (1 or 2).
  MPX_DECL ZeroShard(std::vector<at::Tensor> params, int level, ShardGroup g);

  int level() const { return level_; }
  /// This replica's pieces, in parameter order: what the stage's optimizer steps.
  const std::vector<at::Tensor>& pieces() const { return pieces_; }
  /// Elements this replica owns, and the whole stage's; this replica's place in the group.
  std::int64_t owned() const { return end_ - begin_; }
  std::int64_t total() const { return total_; }
  int index() const { return g_.index; }
  /// The elements [lo, hi) of parameter `p` (one of the stage's; else a `config_error`) in replica r's shard.
  MPX_DECL std::pair<std::int64_t, std::int64_t> range_in(const at::Tensor& p, int r) const;

  /// The owned parts of the parameters' gradients into the pieces' (level 2 then drops the parameters'
  /// gradients); a parameter whose memory was replaced since the layout is a `config_error`.
  MPX_DECL void gradients_in();
  /// Scales the gradients held in the shard by `c` (clipping at level 2; level 1's pieces view the whole ones).
  MPX_DECL void scale_gradients(double c);
  /// Sum of the squares of the owned parts of `counted`'s gradients (some of the stage's parameters, before
  /// `gradients_in`): this replica's share of their squared norm.
  MPX_DECL double owned_gradient_sq(const std::vector<at::Tensor>& counted) const;
  /// Drops the pieces' gradients.
  MPX_DECL void zero();

  /// The all-gather of the updated shards into the parameters, started and waited for (`step` names errors).
  MPX_DECL void start_gather(long step);
  MPX_DECL void finish_gather();

  /// Collective: `whole` (an optimizer of the same kind over the stage's parameters) gets the whole state.
  MPX_DECL void gather_state(torch::optim::Optimizer& shard, torch::optim::Optimizer& whole);
  /// This replica's pieces of `whole`'s state into `shard` (after a checkpoint loaded into `whole`).
  MPX_DECL void scatter_state(torch::optim::Optimizer& whole, torch::optim::Optimizer& shard);

 private:
  MPX_DECL at::Tensor all_gather(const at::Tensor& flat_shard, const char* what);

  std::vector<at::Tensor> params_, pieces_;
  std::vector<std::int64_t> offset_, lo_, hi_, at_;  // per parameter: its start in the flat vector, its owned range [lo, hi), its piece's start in the shard
  std::map<const void*, std::size_t> index_;    // each parameter's place, by its TensorImpl
  int level_;
  ShardGroup g_;
  std::int64_t total_ = 0, size_ = 0, begin_ = 0, end_ = 0;  // N, S, the owned range
  std::vector<const void*> storage_;             // per parameter: where its memory was when the pieces were made
  torch::TensorOptions options_;
  at::Tensor flat_;       // several replicas: every parameter, end to end, padded to d x S (the parameters view it)
  at::Tensor flat_grad_;  // level 2: the pieces' gradients
  c10::intrusive_ptr<c10d::Work> work_;
  long step_ = 0;
};

}  // namespace mpx

#if MPX_DEFINITIONS
// ---- definitions (compiled once under MPX_SEPARATE_COMPILATION: linkage.hpp) ----

#include <algorithm>  // std::min, std::max

namespace mpx
{

MPX_DECL ZeroShard::ZeroShard(std::vector<at::Tensor> params, int level, ShardGroup g) : params_(std::move(params)), level_(level), g_(std::move(g))
{
  if (level_ != 1 && level_ != 2) throw config_error("mpx: ZeRO level " + std::to_string(level_) + ": mpx::Sharded<L> takes 1 or 2");
  for (auto& p : params_) {
    if (p.scalar_type() != params_.front().scalar_type() || p.device() != params_.front().device())
      throw config_error("mpx: a Sharded<L> stage's parameters must share one dtype and one device (they are laid end to end)");
    index_[p.unsafeGetTensorImpl()] = offset_.size();
    offset_.push_back(total_);
    total_ += p.numel();
  }
  size_ = (total_ + g_.replicas - 1) / g_.replicas;
  begin_ = std::min(total_, g_.index * size_), end_ = std::min(total_, begin_ + size_);
  options_ = (params_.empty() ? torch::TensorOptions(torch::kFloat) : params_.front().options()).requires_grad(false);
  torch::NoGradGuard ng;
  if (g_.replicas > 1) {  // the parameters move into one buffer of d x S elements: the all-gather writes them in place
    std::map<const char*, const char*> spans;  // each non-empty parameter's bytes [begin, end), by begin
    std::size_t non_empty = 0;
    for (auto& p : params_)
      if (p.numel() > 0) {
        const auto* b = static_cast<const char*>(p.data_ptr());
        spans[b] = std::max(spans[b], b + p.nbytes()), ++non_empty;
      }
    bool tied = spans.size() < non_empty;  // two begin at one place
    const char* reach = nullptr;
    for (auto [b, e] : spans) tied = tied || (reach && b < reach), reach = std::max(reach, e);
    if (tied)
      throw config_error("mpx: two parameters of a Sharded<L> stage share memory (tied weights); ZeRO lays each out once: untie "
                         "them, or leave the stage unsharded");
    flat_ = torch::zeros({size_ * g_.replicas}, options_);
    for (std::size_t i = 0; i < params_.size(); ++i) {
      auto in_flat = flat_.narrow(0, offset_[i], params_[i].numel()).view(params_[i].sizes());
      in_flat.copy_(params_[i].detach());
      params_[i].set_data(in_flat);
    }
  }
  for (std::size_t i = 0; i < params_.size(); ++i) {
    if (!params_[i].is_contiguous())
      throw config_error("mpx: a Sharded<L> stage's parameters must be contiguous (its pieces are views of them); parameter " +
                         std::to_string(i) + " is not");
    const std::int64_t lo = std::clamp(begin_ - offset_[i], std::int64_t(0), params_[i].numel());
    const std::int64_t hi = std::clamp(end_ - offset_[i], std::int64_t(0), params_[i].numel());
    lo_.push_back(lo), hi_.push_back(hi), at_.push_back(offset_[i] + lo - begin_), storage_.push_back(params_[i].data_ptr());
    if (hi > lo) pieces_.push_back(params_[i].detach().view(-1).narrow(0, lo, hi - lo));  // shares the parameter's memory
  }
}

MPX_DECL void ZeroShard::gradients_in()
{
  torch::NoGradGuard ng;
  for (std::size_t i = 0; i < params_.size(); ++i)
    if (params_[i].data_ptr() != storage_[i])
      throw config_error("mpx: parameter " + std::to_string(i) + " of a sharded stage was replaced after the trainer was built (its pieces view "
                         "the old memory); write new values into it (copy_), or build the trainer after the weights");
  if (level_ == 2) flat_grad_ = torch::zeros({size_}, options_);
  std::size_t k = 0;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    if (hi_[i] <= lo_[i]) continue;
    auto& piece = pieces_[k++];
    const at::Tensor g = params_[i].grad();
    if (!g.defined()) {
      piece.mutable_grad().reset();
      continue;
    }
    const auto owned = g.reshape(-1).narrow(0, lo_[i], hi_[i] - lo_[i]);
    if (level_ == 1) {  // the whole gradients stay: the piece's is a view of its part
      piece.mutable_grad() = owned;
      continue;
    }
    auto mine = flat_grad_.narrow(0, at_[i], hi_[i] - lo_[i]);
    mine.copy_(owned);
    piece.mutable_grad() = mine;
  }
  if (level_ == 2)
    for (auto& p : params_) p.mutable_grad().reset();
}

MPX_DECL void ZeroShard::scale_gradients(double c)
{
  if (flat_grad_.defined()) flat_grad_.mul_(c);
}

MPX_DECL std::pair<std::int64_t, std::int64_t> ZeroShard::range_in(const at::Tensor& p, int r) const
{
  const auto it = index_.find(p.unsafeGetTensorImpl());
  if (it == index_.end()) throw config_error("mpx: a parameter that is not one of the sharded stage's was given to its ZeRO shard");
  const std::int64_t off = offset_[it->second], n = p.numel();
  return {std::clamp(r * size_ - off, std::int64_t(0), n), std::clamp((r + 1) * size_ - off, std::int64_t(0), n)};
}

MPX_DECL double ZeroShard::owned_gradient_sq(const std::vector<at::Tensor>& counted) const
{
  std::vector<at::Tensor> norms;
  for (const auto& p : counted) {
    const auto [lo, hi] = range_in(p, g_.index);
    if (hi > lo && p.grad().defined()) norms.push_back(p.grad().reshape(-1).narrow(0, lo, hi - lo).norm());
  }
  return norms.empty() ? 0.0 : torch::stack(norms).to(at::kDouble).pow(2).sum().item<double>();
}

MPX_DECL void ZeroShard::zero()
{
  for (auto& p : pieces_) p.mutable_grad().reset();
  flat_grad_ = at::Tensor();
}

MPX_DECL void ZeroShard::start_gather(long step)
{
  step_ = step;
  if (g_.replicas == 1) return;
  std::vector<std::vector<at::Tensor>> out(1);
  for (int r = 0; r < g_.replicas; ++r) out[0].push_back(flat_.narrow(0, r * size_, size_));
  std::vector<at::Tensor> in{flat_.narrow(0, g_.index * size_, size_)};
  try {
    work_ = g_.dp->allgather(out, in);
  } catch (const std::exception& e) {
    throw peer_error("mpx: rank " + std::to_string(g_.rank) + ", step " + std::to_string(step) +
                     ", the all-gather of the sharded parameters (ZeRO) did not start: " + e.what());
  }
}

MPX_DECL void ZeroShard::finish_gather()
{
  if (g_.replicas == 1) return;  // the pieces are the parameters
  try {
    detail::wait_bounded(work_, options_.device(), g_.timeout);
  } catch (const std::exception& e) {
    throw peer_error("mpx: rank " + std::to_string(g_.rank) + ", step " + std::to_string(step_) +
                     ", the all-gather of the sharded parameters (ZeRO): a data-parallel peer did not arrive: " + e.what());
  }
  work_.reset();
}

MPX_DECL at::Tensor ZeroShard::all_gather(const at::Tensor& flat_shard, const char* what)
{
  if (g_.replicas == 1) return flat_shard;
  auto whole = torch::empty({size_ * g_.replicas}, flat_shard.options());
  std::vector<std::vector<at::Tensor>> out(1);
  for (int r = 0; r < g_.replicas; ++r) out[0].push_back(whole.narrow(0, r * size_, size_));
  std::vector<at::Tensor> in{flat_shard};
  try {
    detail::wait_bounded(g_.dp->allgather(out, in), flat_shard.device(), g_.timeout);
  } catch (const std::exception& e) {
    throw peer_error("mpx: rank " + std::to_string(g_.rank) + ", the all-gather of the sharded optimizer state (" + what +
                     ") for a checkpoint: a data-parallel peer did not arrive: " + e.what());
  }
  return whole;
}

MPX_DECL void ZeroShard::gather_state(torch::optim::Optimizer& shard, torch::optim::Optimizer& whole)
{
  // the steps: each parameter's from the replica(s) holding its pieces, the largest (0: no state anywhere)
  auto steps = torch::zeros({std::int64_t(params_.size())}, torch::kDouble);
  std::map<std::string, at::Tensor> flats;
  for (const auto& n : detail::moment_names(shard)) flats[n] = torch::zeros({size_}, torch::kFloat);
  for (std::size_t i = 0, k = 0; i < params_.size(); ++i) {
    if (hi_[i] <= lo_[i]) continue;
    const auto m = detail::moments_of(shard, pieces_[k++]);
    steps[std::int64_t(i)] = double(m.step);
    for (auto& [n, t] : m.fields) flats.at(n).narrow(0, at_[i], hi_[i] - lo_[i]).copy_(t.reshape(-1));
  }
  if (g_.replicas > 1) {
    std::vector<at::Tensor> v{steps};
    c10d::AllreduceOptions max;
    max.reduceOp = c10d::ReduceOp::MAX;
    try {
      detail::wait_bounded(g_.dp->allreduce(v, max), steps.device(), g_.timeout);
    } catch (const std::exception& e) {
      throw peer_error("mpx: rank " + std::to_string(g_.rank) + ", the sharded optimizer state's steps for a checkpoint: a data-parallel peer did not arrive: " +
                       e.what());
    }
  }
  for (auto& [n, f] : flats) f = all_gather(f, n.c_str());
  for (std::size_t i = 0; i < params_.size(); ++i) {
    detail::Moments m;
    m.step = std::int64_t(steps[std::int64_t(i)].item<double>());
    if (m.step == 0) continue;
    for (auto& [n, f] : flats) m.fields[n] = f.narrow(0, offset_[i], params_[i].numel()).view_as(params_[i]).to(params_[i].device()).clone();
    detail::set_moments(whole, params_[i], m);
  }
}

MPX_DECL void ZeroShard::scatter_state(torch::optim::Optimizer& whole, torch::optim::Optimizer& shard)
{
  for (std::size_t i = 0, k = 0; i < params_.size(); ++i) {
    if (hi_[i] <= lo_[i]) continue;
    const auto& piece = pieces_[k++];
    auto m = detail::moments_of(whole, params_[i]);
    if (m.step == 0) continue;
    for (auto& [n, t] : m.fields) t = t.reshape(-1).narrow(0, lo_[i], hi_[i] - lo_[i]).to(piece.device()).clone();
    detail::set_moments(shard, piece, m);
  }
}

}  // namespace mpx
#endif  // MPX_DEFINITIONS
