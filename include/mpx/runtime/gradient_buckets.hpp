// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file runtime/gradient_buckets.hpp
/// Data parallelism's gradient averaging. When a stage's last backward of the step is done, `start` packs
/// its trainable parameters' gradients into buckets of about `bucket_bytes` and starts one asynchronous
/// all-reduce per bucket over the data-parallel group, so the reduction overlaps the rest of the schedule;
/// `finish` waits for every bucket (with the run's timeout), divides by the replica count and writes the
/// averages back into the gradients. With one replica both do nothing.

#include <mpx/runtime/errors.hpp>  // mpx::peer_error
#include <mpx/runtime/world.hpp>   // mpx::ProcessGroupPtr

#include <torch/torch.h>  // torch::cat, torch::zeros

#include <chrono>   // std::chrono::milliseconds
#include <cstddef>  // std::size_t
#include <string>   // std::string
#include <vector>   // std::vector

namespace mpx
{

class GradientBuckets
{
 public:
  GradientBuckets(ProcessGroupPtr dp, int replicas, std::size_t bucket_bytes, std::chrono::milliseconds timeout)
      : dp_(std::move(dp)), replicas_(replicas), bucket_bytes_(bucket_bytes), timeout_(timeout)
  {
  }

  /// Starts the all-reduce of `params`' gradients (those that train; a missing gradient counts as zero).
  void start(const std::vector<at::Tensor>& params)
  {
    if (replicas_ == 1) return;
    std::vector<at::Tensor> group;
    std::size_t bytes = 0;
    for (auto& p : params) {
      if (!p.requires_grad()) continue;
      group.push_back(p);
      bytes += std::size_t(p.numel()) * p.element_size();
      if (bytes >= bucket_bytes_) {
        launch(group);
        group.clear();
        bytes = 0;
      }
    }
    launch(group);
  }

  /// Waits for every started bucket and writes the replica average into each gradient.
  void finish()
  {
    for (auto& b : buckets_) {
      b.work->wait(timeout_);
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
  }

  /// Buckets started and not yet finished.
  std::size_t in_flight() const { return buckets_.size(); }

 private:
  struct Bucket
  {
    std::vector<at::Tensor> params;
    at::Tensor flat;
    c10::intrusive_ptr<c10d::Work> work;
  };

  void launch(const std::vector<at::Tensor>& group)
  {
    if (group.empty()) return;
    std::vector<at::Tensor> gs;
    for (auto& p : group) gs.push_back(p.grad().defined() ? p.grad().reshape(-1) : torch::zeros({p.numel()}, p.options()));
    Bucket b{group, torch::cat(gs), {}};
    std::vector<at::Tensor> v{b.flat};
    b.work = dp_->allreduce(v);
    buckets_.push_back(std::move(b));
  }

  ProcessGroupPtr dp_;
  int replicas_;
  std::size_t bucket_bytes_;
  std::chrono::milliseconds timeout_;
  std::vector<Bucket> buckets_;
};

}  // namespace mpx
