// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file runtime/gradient_buckets.hpp
/// Data parallelism's gradient averaging, in buckets of about `bucket_bytes` over the data-parallel group.
/// `arm(params)`, called just before a stage's last backward of the step, lays the stage's trainable
/// parameters out in buckets in reverse order (the order their gradients become final) and hooks each
/// parameter's gradient accumulator: a bucket starts its asynchronous all-reduce as soon as its last
/// gradient is final and every bucket before it has started — inside that backward, so the reduction
/// overlaps the rest of it and of the schedule. Buckets start in index order, so every replica issues the
/// same collectives in the same order whatever order its hooks fire in. `start(params)`, after the
/// backward, removes the hooks and starts what is left (gradients that never came: zeros); without an
/// `arm` it lays out and starts every bucket at once. `finish` waits for every bucket (with the run's
/// timeout), divides by the replica count and writes the averages back into the gradients. With one
/// replica all of it does nothing. A ZeRO-sharded stage's buckets (`arm` / `start` given its `ZeroShard`)
/// are reduce-scattered instead: one all-to-all per bucket sends each replica the parts of the bucket's
/// gradients in that replica's ZeRO shard (Gloo in LibTorch 1.13 has no reduce-scatter; the bytes sent are
/// the same), and `finish` writes the average of what came into the owned parts of the gradients, leaving
/// the rest as this replica's backward made it: half an all-reduce's traffic, the other half being the
/// parameters' all-gather after the step.

#include <mpx/errors.hpp>  // mpx::config_error
#include <mpx/runtime/world/world.hpp>   // mpx::World
#include <mpx/runtime/zero_shard.hpp>    // mpx::ZeroShard
#include <mpx/torch/process_group.hpp>  // mpx::ProcessGroupPtr, mpx::detail::wait_bounded
#include <mpx/linkage.hpp>  // MPX_DECL, MPX_DEFINITIONS

#include <torch/csrc/autograd/function_hook.h>  // torch::autograd::FunctionPostHook
#include <torch/torch.h>                        // torch::cat, torch::zeros

#include <chrono>   // std::chrono::milliseconds, std::chrono::steady_clock
#include <cstddef>  // std::size_t
#include <cstdint>  // std::uintptr_t
#include <memory>   // std::shared_ptr, std::unique_ptr
#include <string>   // std::string
#include <utility>  // std::exchange
#include <vector>   // std::vector

namespace mpx
{

class GradientBuckets
{
 public:
  using clock = std::chrono::steady_clock;

  GradientBuckets(ProcessGroupPtr dp, int replicas, std::size_t bucket_bytes, std::chrono::milliseconds timeout);
  GradientBuckets(const GradientBuckets&) = delete;  // the hooks point at it
  GradientBuckets& operator=(const GradientBuckets&) = delete;
  ~GradientBuckets() { disarm(); }

  /// Before a stage's last backward: buckets of `params` (those that train) start as their gradients
  /// become final (see the file comment); reduce-scattered over `shard`'s ZeRO shards when it is given.
  void arm(const std::vector<at::Tensor>& params, const ZeroShard* shard = nullptr);

  /// After a stage's last backward: starts every bucket of `params` not started yet (all of them
  /// without an `arm`) and removes the hooks.
  void start(const std::vector<at::Tensor>& params, const ZeroShard* shard = nullptr);

  /// Waits for every started bucket and writes the replica average into each gradient.
  void finish();

  /// Buckets started and not yet finished.
  std::size_t in_flight() const { return buckets_.size(); }
  /// When each of them started (in the order they did).
  const std::vector<clock::time_point>& launched_at() const { return launched_at_; }
  /// How many of them started while a backward ran (from a gradient hook).
  std::size_t started_in_backward() const { return in_backward_; }

 private:
  struct Bucket
  {
    std::vector<at::Tensor> params;
    at::Tensor flat;  // all-reduced: the gradients end to end; reduce-scattered: what each replica sent this one
    c10::intrusive_ptr<c10d::Work> work;
    const ZeroShard* shard = nullptr;
    at::Tensor sent;  // reduce-scattered: kept until the collective is done
  };
  /// One stage's parameters between `arm` and `start`: bucket b holds params [first[b], first[b+1]).
  struct Armed
  {
    std::vector<at::Tensor> params;  // reversed: the order gradients become final
    std::vector<std::size_t> first, bucket_of, left;  // first: one more than buckets, ending at params.size()
    std::vector<bool> ready;
    std::size_t next = 0;  // the next bucket to start
    const ZeroShard* shard = nullptr;
    std::vector<std::pair<std::shared_ptr<torch::autograd::Node>, std::uintptr_t>> hooks;
  };
  /// Fires after a parameter's gradient accumulator ran: its gradient of this backward is in.
  struct Ready : torch::autograd::FunctionPostHook
  {
    Ready(GradientBuckets* o, std::size_t i) : owner(o), index(i) {}
    torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs, const torch::autograd::variable_list&) override
    {
      owner->ready(index);
      return outputs;
    }
    GradientBuckets* owner;
    std::size_t index;
  };

  void lay_out(const std::vector<at::Tensor>& params, const ZeroShard* shard);
  /// Bucket `bk`'s gradients `gs` sent to the replicas whose ZeRO shards hold them (an all-to-all).
  void scatter(Bucket& bk, const std::vector<at::Tensor>& gs);
  /// A reduce-scattered bucket's average written into the owned parts of its gradients.
  void write_owned(Bucket& bk);

  void ready(std::size_t i);

  void launch(std::size_t b);

  void remove_hooks();
  void disarm();

  ProcessGroupPtr dp_;
  int replicas_;
  std::size_t bucket_bytes_;
  std::chrono::milliseconds timeout_;
  Armed armed_;
  std::vector<Bucket> buckets_;
  std::vector<clock::time_point> launched_at_;
  std::size_t in_backward_ = 0;
  bool twice_ = false;
};

}  // namespace mpx

#if MPX_DEFINITIONS
// ---- definitions (compiled once under MPX_SEPARATE_COMPILATION: linkage.hpp) ----

namespace mpx
{

MPX_DECL GradientBuckets::GradientBuckets(ProcessGroupPtr dp, int replicas, std::size_t bucket_bytes, std::chrono::milliseconds timeout)
    : dp_(std::move(dp)), replicas_(replicas), bucket_bytes_(bucket_bytes), timeout_(timeout)
{
}

MPX_DECL void GradientBuckets::arm(const std::vector<at::Tensor>& params, const ZeroShard* shard)
{
  if (replicas_ == 1) return;
  disarm();
  lay_out(params, shard);
  for (std::size_t i = 0; i < armed_.params.size(); ++i) {
    auto acc = torch::autograd::impl::grad_accumulator(armed_.params[i]);
    if (!acc) continue;  // not a leaf that accumulates: start() sends what it holds
    const auto key = acc->add_post_hook(std::make_unique<Ready>(this, i));
    armed_.hooks.push_back({std::move(acc), key});
  }
}

MPX_DECL void GradientBuckets::start(const std::vector<at::Tensor>& params, const ZeroShard* shard)
{
  if (replicas_ == 1) return;
  if (armed_.hooks.empty() && armed_.params.empty()) lay_out(params, shard);
  remove_hooks();
  for (std::size_t b = armed_.next; b < armed_.left.size(); ++b) launch(b);  // every replica issues the same collectives
  armed_ = {};
  if (std::exchange(twice_, false))
    throw config_error("mpx: a parameter's gradient was accumulated twice in one backward, after its all-reduce bucket had started; "
                       "set TrainOptions::overlap_reduction = false for this model");
}

MPX_DECL void GradientBuckets::finish()
{
  for (auto& b : buckets_) {
    detail::wait_bounded(b.work, b.flat.device(), timeout_);
    if (b.shard) {
      write_owned(b);
      continue;
    }
    b.flat.div_(double(replicas_));
    std::int64_t off = 0;
    for (auto& p : b.params) {
      auto g = b.flat.narrow(0, off, p.numel()).view_as(p);
      if (p.grad().defined()) p.mutable_grad().copy_(g);
      else p.mutable_grad() = g.clone();
      off += p.numel();
    }
  }
  buckets_.clear();
  launched_at_.clear();
}

MPX_DECL void GradientBuckets::lay_out(const std::vector<at::Tensor>& params, const ZeroShard* shard)
{
  armed_ = {};
  armed_.shard = shard;
  std::size_t bytes = 0;
  for (auto it = params.rbegin(); it != params.rend(); ++it) {
    if (!it->requires_grad()) continue;
    if (armed_.first.empty() || bytes >= bucket_bytes_) armed_.first.push_back(armed_.params.size()), armed_.left.push_back(0), bytes = 0;
    armed_.params.push_back(*it);
    armed_.bucket_of.push_back(armed_.first.size() - 1);
    ++armed_.left.back();
    bytes += std::size_t(it->numel()) * it->element_size();
  }
  armed_.first.push_back(armed_.params.size());
  armed_.ready.assign(armed_.params.size(), false);
}

MPX_DECL void GradientBuckets::ready(std::size_t i)
{
  if (armed_.ready[i]) {  // a second accumulation in one backward: its bucket may have left without it
    twice_ = true;
    return;
  }
  armed_.ready[i] = true;
  --armed_.left[armed_.bucket_of[i]];
  while (armed_.next < armed_.left.size() && armed_.left[armed_.next] == 0) {
    launch(armed_.next++);
    ++in_backward_;
  }
}

MPX_DECL void GradientBuckets::launch(std::size_t b)
{
  std::vector<at::Tensor> group(armed_.params.begin() + std::ptrdiff_t(armed_.first[b]), armed_.params.begin() + std::ptrdiff_t(armed_.first[b + 1]));
  std::vector<at::Tensor> gs;
  for (auto& p : group) gs.push_back(p.grad().defined() ? p.grad().reshape(-1) : torch::zeros({p.numel()}, p.options()));
  Bucket bk{std::move(group), {}, {}, armed_.shard, {}};
  if (bk.shard) scatter(bk, gs);
  else {
    bk.flat = torch::cat(gs);
    std::vector<at::Tensor> v{bk.flat};
    bk.work = dp_->allreduce(v);
  }
  buckets_.push_back(std::move(bk));
  launched_at_.push_back(clock::now());
}

MPX_DECL void GradientBuckets::scatter(Bucket& bk, const std::vector<at::Tensor>& gs)
{
  const ZeroShard& z = *bk.shard;
  std::vector<at::Tensor> parts;
  std::vector<std::int64_t> sent(std::size_t(replicas_), 0);
  for (int r = 0; r < replicas_; ++r)  // replica r's share: of each parameter in the bucket's order, its part in r's shard
    for (std::size_t i = 0; i < bk.params.size(); ++i) {
      const auto [lo, hi] = z.range_in(bk.params[i], r);
      if (hi > lo) parts.push_back(gs[i].narrow(0, lo, hi - lo)), sent[std::size_t(r)] += hi - lo;
    }
  const std::int64_t mine = sent[std::size_t(z.index())];
  std::vector<std::int64_t> received(std::size_t(replicas_), mine);
  bk.sent = parts.empty() ? torch::zeros({0}, gs.front().options()) : torch::cat(parts);
  bk.flat = torch::empty({mine * replicas_}, bk.sent.options());
  bk.work = dp_->alltoall_base(bk.flat, bk.sent, received, sent);
}

MPX_DECL void GradientBuckets::write_owned(Bucket& bk)
{
  const ZeroShard& z = *bk.shard;
  const auto average = bk.flat.view({replicas_, bk.flat.numel() / replicas_}).sum(0).div_(double(replicas_));
  std::int64_t off = 0;
  for (auto& p : bk.params) {
    const auto [lo, hi] = z.range_in(p, z.index());
    if (hi <= lo) continue;
    if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
    else if (!p.grad().is_contiguous()) p.mutable_grad() = p.grad().contiguous();
    p.mutable_grad().view(-1).narrow(0, lo, hi - lo).copy_(average.narrow(0, off, hi - lo));
    off += hi - lo;
  }
  bk.sent = at::Tensor();
}

MPX_DECL void GradientBuckets::remove_hooks()
{
  for (auto& [node, key] : armed_.hooks) node->del_post_hook(key);
  armed_.hooks.clear();
}

MPX_DECL void GradientBuckets::disarm()
{
  remove_hooks();
  armed_ = {};
}

}  // namespace mpx
#endif  // MPX_DEFINITIONS
