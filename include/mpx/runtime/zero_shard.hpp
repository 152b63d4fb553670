// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file runtime/zero_shard.hpp
/// `ZeroShard`: one stage's share of sharded data parallelism (ZeRO, `Sharded<L>`) on this replica. The
/// stage's trainable parameters, end to end in their order, form a flat vector of N elements cut into d
/// shards of S = ceil(N / d): replica r owns [r·S, min(N, (r+1)·S)). With several replicas the parameters
/// move into one buffer of d·S elements, which they then view (tied parameters are refused), so that the
/// all-gather writes them in place. The owned part of each parameter is a `piece`, a 1-D view of the
/// shard; the stage's optimizer steps the pieces only (1/d of the state; 8-bit AdamW's blocks cut at the
/// pieces' starts). A step: the gradients' owned parts are averaged (GradientBuckets reduce-scatters them
/// into `range_in`), `gradients_in` gives them to the pieces (level 1 as views, levels 2 and 3 copied into
/// a buffer of S elements and the whole gradients dropped), the optimizer steps, `start_gather` /
/// `finish_gather` all-gather the shard into the d·S buffer.
///
/// Level 3 keeps only the shard (S elements, the pieces view it) between gathers: `release` gives the d·S
/// buffer's memory back (the parameters keep their shapes and their place in it, so that what a forward
/// saved for its backward sees the next gather's values), `release(true)` also empties the parameters
/// (0 elements: a read between steps fails by its shape, not on freed memory), and the next
/// `start_gather` / `finish_gather` brings them back whole. The checkpoint's state: zero_state.hpp.

#include <mpx/errors.hpp>               // mpx::config_error, mpx::peer_error
#include <mpx/linkage.hpp>              // MPX_DECL, MPX_DEFINITIONS
#include <mpx/torch/process_group.hpp>  // mpx::ProcessGroupPtr, mpx::detail::wait_bounded
#include <mpx/torch/storage.hpp>        // mpx::detail::free_storage, refill_storage

#include <torch/torch.h>  // at::Tensor

#include <chrono>   // std::chrono::milliseconds
#include <cstdint>  // std::int64_t
#include <map>      // std::map
#include <string>   // std::string
#include <utility>  // std::pair
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
  /// Where parameter i lies: its start and size in the flat vector, its shape, its owned part [lo, hi) of
  /// its elements and that part's start `at` in this replica's shard.
  struct Place
  {
    std::int64_t offset = 0, numel = 0, lo = 0, hi = 0, at = 0;
    std::vector<std::int64_t> sizes;
  };

  /// Lays out `params` (one dtype, one device) over `g` for ZeRO level `level` (1, 2 or 3; level 3 then
  /// releases the whole parameters: `start_gather` brings them back).
  MPX_DECL ZeroShard(std::vector<at::Tensor> params, int level, ShardGroup g);

  int level() const { return level_; }
  /// This replica's pieces, in parameter order: what the stage's optimizer steps.
  const std::vector<at::Tensor>& pieces() const { return pieces_; }
  const std::vector<at::Tensor>& params() const { return params_; }
  const std::vector<Place>& places() const { return places_; }
  const ShardGroup& group() const { return g_; }
  /// Elements this replica owns, and the whole stage's; S; this replica's place in the group.
  std::int64_t owned() const { return end_ - begin_; }
  std::int64_t total() const { return total_; }
  std::int64_t shard_size() const { return size_; }
  int index() const { return g_.index; }
  /// The elements [lo, hi) of parameter `p` (one of the stage's; else a `config_error`) in replica r's shard.
  MPX_DECL std::pair<std::int64_t, std::int64_t> range_in(const at::Tensor& p, int r) const;

  /// The owned parts of the parameters' gradients into the pieces' (levels 2 and 3 then drop the
  /// parameters' gradients); a parameter whose memory was replaced since the layout is a `config_error`.
  MPX_DECL void gradients_in();
  /// Scales the gradients held in the shard by `c` (clipping at levels 2, 3; level 1's pieces view the whole ones).
  MPX_DECL void scale_gradients(double c);
  /// Sum of the squares of the owned parts of `counted`'s gradients (some of the stage's parameters, before
  /// `gradients_in`): this replica's share of their squared norm.
  MPX_DECL double owned_gradient_sq(const std::vector<at::Tensor>& counted) const;
  /// Drops the pieces' gradients.
  MPX_DECL void zero();

  /// The all-gather of the shards into the whole parameters, started and waited for (`step` names errors);
  /// level 3: the parameters' memory taken back first, nothing to do while they are whole.
  MPX_DECL void start_gather(long step);
  MPX_DECL void finish_gather();
  /// Level 3: the whole parameters' memory given back; `rest`: the parameters emptied too (see the file comment).
  MPX_DECL void release(bool rest);
  /// Level 3: whether the parameters are whole (gathered since the last `release`).
  bool whole() const { return whole_; }
  /// Level 3, while whole: this replica's part of the parameters into the shard (after a load wrote them).
  MPX_DECL void keep_owned();

 private:
  MPX_DECL void lay_out();
  MPX_DECL void attach(bool to_flat);
  std::string when() const { return step_ >= 0 ? ", step " + std::to_string(step_) : ", for a checkpoint"; }
  std::vector<at::Tensor> params_, pieces_;
  std::vector<Place> places_;
  std::map<const void*, std::size_t> index_;  // each parameter's place, by its TensorImpl
  int level_;
  ShardGroup g_;
  std::int64_t total_ = 0, size_ = 0, begin_ = 0, end_ = 0;  // N, S, the owned range
  std::vector<const void*> storage_;  // per parameter: where its memory was when the pieces were made (levels 1, 2)
  torch::TensorOptions options_;
  // flat_: several replicas (or level 3): every parameter, end to end, padded to d x S (the parameters view it);
  // own_: this replica's S elements, a view of flat_ (levels 1, 2) or its own (level 3; the pieces view it);
  // flat_grad_: levels 2, 3, the pieces' gradients
  at::Tensor flat_, own_, flat_grad_;
  c10::intrusive_ptr<c10d::Work> work_;
  long step_ = 0;
  bool whole_ = true, attached_ = true;  // level 3: flat_ holds the gathered values; the parameters view it
};
}  // namespace mpx

#if MPX_DEFINITIONS
// ---- definitions (compiled once under MPX_SEPARATE_COMPILATION: linkage.hpp) ----
#include <algorithm>  // std::min, std::max, std::clamp
namespace mpx
{
MPX_DECL ZeroShard::ZeroShard(std::vector<at::Tensor> params, int level, ShardGroup g) : params_(std::move(params)), level_(level), g_(std::move(g))
{
  if (level_ < 1 || level_ > 3) throw config_error("mpx: ZeRO level " + std::to_string(level_) + ": mpx::Sharded<L> takes 1, 2 or 3");
  for (auto& p : params_) {
    if (p.scalar_type() != params_.front().scalar_type() || p.device() != params_.front().device())
      throw config_error("mpx: a Sharded<L> stage's parameters must share one dtype and one device (they are laid end to end)");
    if (!p.is_contiguous())
      throw config_error("mpx: a Sharded<L> stage's parameters must be contiguous (its pieces are views of them); parameter " +
                         std::to_string(places_.size()) + " is not");
    index_[p.unsafeGetTensorImpl()] = places_.size();
    places_.push_back({total_, p.numel(), 0, 0, 0, p.sizes().vec()});
    total_ += p.numel();
  }
  size_ = (total_ + g_.replicas - 1) / g_.replicas;
  begin_ = std::min(total_, g_.index * size_), end_ = std::min(total_, begin_ + size_);
  options_ = (params_.empty() ? torch::TensorOptions(torch::kFloat) : params_.front().options()).requires_grad(false);
  lay_out();
  if (level_ == 3) release(true);
}

/// The parameters into one buffer of d x S elements (several replicas, or level 3), then the pieces.
MPX_DECL void ZeroShard::lay_out()
{
  torch::NoGradGuard ng;
  if (g_.replicas > 1 || level_ == 3) {
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
    for (std::size_t i = 0; i < params_.size(); ++i) flat_.narrow(0, places_[i].offset, places_[i].numel).copy_(params_[i].detach().reshape(-1));
    attach(true);
    own_ = flat_.narrow(0, g_.index * size_, size_);
    if (level_ == 3) own_ = own_.clone();  // kept while the whole parameters are released
  }
  for (std::size_t i = 0; i < params_.size(); ++i) {
    auto& pl = places_[i];
    pl.lo = std::clamp(begin_ - pl.offset, std::int64_t(0), pl.numel), pl.hi = std::clamp(end_ - pl.offset, std::int64_t(0), pl.numel);
    pl.at = pl.offset + pl.lo - begin_;
    storage_.push_back(params_[i].data_ptr());
    if (pl.hi <= pl.lo) continue;
    pieces_.push_back(own_.defined() ? own_.narrow(0, pl.at, pl.hi - pl.lo) : params_[i].detach().view(-1).narrow(0, pl.lo, pl.hi - pl.lo));
  }
}

/// The parameters onto their places in flat_ (`to_flat`), or emptied.
MPX_DECL void ZeroShard::attach(bool to_flat)
{
  torch::NoGradGuard ng;
  for (std::size_t i = 0; i < params_.size(); ++i)
    params_[i].set_data(to_flat ? flat_.narrow(0, places_[i].offset, places_[i].numel).view(places_[i].sizes) : torch::empty({0}, options_));
  attached_ = to_flat;
}

MPX_DECL void ZeroShard::gradients_in()
{
  torch::NoGradGuard ng;
  for (std::size_t i = 0; i < params_.size() && level_ < 3; ++i)  // level 3's pieces view the shard, not the parameters
    if (params_[i].data_ptr() != storage_[i])
      throw config_error("mpx: parameter " + std::to_string(i) + " of a sharded stage was replaced after the trainer was built (its pieces view "
                         "the old memory); write new values into it (copy_), or build the trainer after the weights");
  if (level_ >= 2) flat_grad_ = torch::zeros({size_}, options_);
  std::size_t k = 0;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const auto& pl = places_[i];
    if (pl.hi <= pl.lo) continue;
    auto& piece = pieces_[k++];
    const at::Tensor g = params_[i].grad();
    if (!g.defined()) {
      piece.mutable_grad().reset();
      continue;
    }
    const auto owned = g.reshape(-1).narrow(0, pl.lo, pl.hi - pl.lo);
    if (level_ == 1) {  // the whole gradients stay: the piece's is a view of its part
      piece.mutable_grad() = owned;
      continue;
    }
    auto mine = flat_grad_.narrow(0, pl.at, pl.hi - pl.lo);
    mine.copy_(owned);
    piece.mutable_grad() = mine;
  }
  if (level_ >= 2)
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
  const auto& pl = places_[it->second];
  return {std::clamp(r * size_ - pl.offset, std::int64_t(0), pl.numel), std::clamp((r + 1) * size_ - pl.offset, std::int64_t(0), pl.numel)};
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
  if (level_ == 3) {
    if (whole_ || work_) return;  // whole, or on its way
    detail::refill_storage(flat_, std::size_t(flat_.numel()) * flat_.element_size());
  }
  if (g_.replicas == 1) {  // level 3 in one process (tests): the shard is everything
    if (level_ == 3) flat_.copy_(own_);
    return;
  }
  std::vector<std::vector<at::Tensor>> out(1);
  for (int r = 0; r < g_.replicas; ++r) out[0].push_back(flat_.narrow(0, r * size_, size_));
  std::vector<at::Tensor> in{own_};
  try {
    work_ = g_.dp->allgather(out, in);
  } catch (const std::exception& e) {
    throw peer_error("mpx: rank " + std::to_string(g_.rank) + when() + ", the all-gather of the sharded parameters (ZeRO) did not start: " + e.what());
  }
}

MPX_DECL void ZeroShard::finish_gather()
{
  if (work_) {
    try {
      detail::wait_bounded(work_, options_.device(), g_.timeout);
    } catch (const std::exception& e) {
      work_.reset();
      throw peer_error("mpx: rank " + std::to_string(g_.rank) + when() + ", the all-gather of the sharded parameters (ZeRO): a data-parallel peer did not arrive: " +
                       e.what());
    }
    work_.reset();
  }
  if (level_ == 3 && !attached_) attach(true);
  whole_ = true;
}

MPX_DECL void ZeroShard::release(bool rest)
{
  if (level_ != 3) return;
  if (rest && attached_) attach(false);
  if (whole_) detail::free_storage(flat_);
  whole_ = false;
}

MPX_DECL void ZeroShard::keep_owned()
{
  if (level_ == 3 && whole_) own_.copy_(flat_.narrow(0, g_.index * size_, size_));
}

}  // namespace mpx
#endif  // MPX_DEFINITIONS
