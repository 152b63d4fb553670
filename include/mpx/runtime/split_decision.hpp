// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file runtime/split_decision.hpp
/// `SplitDecision`: whether a schedule with a split backward (ZB-H1) runs its I/W passes split, or runs
/// the whole backward in I and nothing in W. The split fills the pipeline's bubble with deferred weight
/// gradients, but it costs extra backward calls (one per marked block and pass); on small layers those
/// cost more than the bubble it fills. Under `SplitBackward::measure` the trainer asks `split_at(k)`
/// before the walk of its k-th step in this process: step 0 (allocations, the channels' capacities) splits and is
/// not counted, steps 1 … 2·trials alternate split (odd) and whole (even), and `record` keeps each walk's
/// seconds. After the last trial `decide` — a collective over the world, so that every rank, every
/// data-parallel replica among them, makes the same choice at the same step (their buckets' order depends
/// on it) — takes the slowest rank's walk per trial step and compares each split step with the whole one
/// right after it (neighbours share the machine's state, so drift cancels). The split stays only if the
/// median of those ratios is below 1 − `split_margin` (2 %): where the two are within noise the whole
/// backward wins, since it is 1F1B's order, holds fewer deferred tensors and makes fewer calls. Rank 0
/// says which and why. Both ways compute the same gradients.

#include <mpx/errors.hpp>   // mpx::peer_error
#include <mpx/runtime/options.hpp>  // mpx::SplitBackward
#include <mpx/runtime/world/world.hpp>    // mpx::World
#include <mpx/linkage.hpp>  // MPX_DECL, MPX_DEFINITIONS

#include <torch/torch.h>  // torch::zeros

#include <algorithm>  // std::sort
#include <cstdio>     // std::snprintf
#include <ostream>    // std::ostream
#include <string>     // std::string
#include <vector>     // std::vector

namespace mpx
{

/// How much faster the split's trials must be (median ratio to the whole backward's) for it to stay.
inline constexpr double split_margin = 0.02;

class SplitDecision
{
 public:
  /// `splits`: the schedule has W actions (ZB-H1); `mode` and `trials` from TrainOptions.
  SplitDecision(bool splits, SplitBackward mode, int trials);

  /// Whether the walk of step k (counted from this trainer's first step in this process) splits.
  bool split_at(long k) const;
  /// Whether step k is one of the measured trials.
  bool trial(long k) const { return measuring() && k >= 1 && k <= 2L * trials_; }
  bool measuring() const { return splits_ && mode_ == SplitBackward::measure && !decided_; }

  /// Keeps step k's walk time when it is a trial; true once step k was the last trial (`decide` is due).
  bool record(long k, double walk_seconds);

  /// Decides from every rank's trials (a collective over the world). `used_here`: some stage of this rank
  /// did split in the trials (its module marks blocks). `log` hears the choice on rank 0.
  void decide(World& w, bool used_here, std::ostream& log);

  /// The choice from the slowest rank's walk per trial step (split, whole, split, ...); `used`: some
  /// rank's stage splits at all (else nothing to choose: whole).
  void choose(bool used, const std::vector<double>& slowest);

  bool decided() const { return decided_; }
  /// Once decided: whether the walks split from now on.
  bool split() const { return split_; }
  double split_seconds() const { return split_seconds_; }  ///< median of the split trials (the slowest rank's walk)
  double whole_seconds() const { return whole_seconds_; }  ///< median of the whole-backward trials
  double ratio() const { return ratio_; }                  ///< median of split / whole over neighbouring trials

  /// "mpx: ZB-H1, measured over steps 1-6 ...: keeps the split" (or runs the whole backward).
  std::string message() const;

 private:
  static double median(std::vector<double> v);

  bool splits_;
  SplitBackward mode_;
  int trials_;
  std::vector<double> times_;
  bool decided_ = false, split_ = false, used_ = false;
  double split_seconds_ = 0, whole_seconds_ = 0, ratio_ = 1;
};

}  // namespace mpx

#if MPX_DEFINITIONS
// ---- definitions (compiled once under MPX_SEPARATE_COMPILATION: linkage.hpp) ----

namespace mpx
{

MPX_DECL SplitDecision::SplitDecision(bool splits, SplitBackward mode, int trials)
    : splits_(splits), mode_(mode), trials_(trials < 1 ? 1 : trials)
{
  if (trials < 1 && splits && mode == SplitBackward::measure)
    throw config_error("mpx: TrainOptions::split_trials is " + std::to_string(trials) +
                       "; measuring ZB-H1's split needs at least 1 trial of each way (or set split_backward to always or never)");
}

MPX_DECL bool SplitDecision::split_at(long k) const
{
  if (!splits_ || mode_ == SplitBackward::never) return false;
  if (mode_ == SplitBackward::always) return true;
  if (decided_) return split_;
  return k == 0 || k % 2 == 1;  // step 0 warms up, then split, whole, split, ...
}

MPX_DECL bool SplitDecision::record(long k, double walk_seconds)
{
  if (!trial(k)) return false;
  times_.push_back(walk_seconds);
  return k == 2L * trials_;
}

MPX_DECL void SplitDecision::decide(World& w, bool used_here, std::ostream& log)
{
  auto v = torch::zeros({1 + long(times_.size())}, torch::kDouble);
  auto* p = v.data_ptr<double>();
  p[0] = used_here ? 1.0 : 0.0;
  for (std::size_t i = 0; i < times_.size(); ++i) p[1 + i] = times_[i];
  std::vector<at::Tensor> t{v};
  try {
    w.world->allreduce(t, {c10d::ReduceOp::MAX})->wait(w.timeout);
  } catch (const std::exception& e) {
    throw peer_error("mpx: rank " + std::to_string(w.env.rank) + ", the all-reduce that settles ZB-H1's split (after " +
                     std::to_string(times_.size()) + " trial steps): a peer did not arrive: " + e.what());
  }
  choose(p[0] > 0, std::vector<double>(p + 1, p + 1 + times_.size()));
  if (w.env.rank == 0 && used_) log << message() << std::flush;
}

MPX_DECL void SplitDecision::choose(bool used, const std::vector<double>& slowest)
{
  std::vector<double> split, whole, ratio;
  for (std::size_t i = 0; i < slowest.size(); ++i) (i % 2 == 0 ? split : whole).push_back(slowest[i]);
  for (std::size_t i = 0; i + 1 < slowest.size(); i += 2)
    if (slowest[i + 1] > 0) ratio.push_back(slowest[i] / slowest[i + 1]);
  used_ = used;
  split_seconds_ = median(split);
  whole_seconds_ = median(whole);
  ratio_ = ratio.empty() ? 1.0 : median(ratio);
  split_ = used && ratio_ < 1 - split_margin;
  decided_ = true;
}

MPX_DECL std::string SplitDecision::message() const
{
  char buf[400];
  std::snprintf(buf, sizeof buf,
                "mpx: ZB-H1's backward, measured over this run's steps 1-%d (the slowest rank's schedule walk, median of %d each): "
                "split into I and W %.2f ms, whole in I %.2f ms, split / whole %.3f (the split stays below %.2f): %s\n",
                2 * trials_, trials_, split_seconds_ * 1e3, whole_seconds_ * 1e3, ratio_, 1 - split_margin,
                split_ ? "keeps the split" : "runs the whole backward in I from now on (W does nothing; TrainOptions::split_backward = always forces the split)");
  return buf;
}

MPX_DECL double SplitDecision::median(std::vector<double> v)
{
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace mpx
#endif  // MPX_DEFINITIONS
