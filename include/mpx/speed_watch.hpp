// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file speed_watch.hpp
/// The devices' speeds as a run measures them, against those its plan assumed. Each step every slot reports
/// its compute seconds (forward and backward, less the waits for its inputs); the plan predicted each slot's
/// compute (the proof's busy time under the assumed speeds, balance.hpp). On devices as fast as assumed the
/// seconds per predicted unit are the same on every slot. A slot whose seconds per unit exceed the
/// fastest slot's by more than `tolerance`, `patience` steps in a row, is a straggler; each slot's measured
/// speed is its assumed one × (the fastest slot's seconds per unit / its own), summed over those steps:
///
/// ```
/// mpx::SpeedWatch watch(predicted_busy, assumed_speeds);
/// for (...) {
///   const auto st = trainer.step(mbs);
///   if (watch.observe(mpx::slot_seconds(world, st.compute_seconds)))   // runtime/world/speeds.hpp
///     std::cout << watch.describe() << "\n";   // "slot 0 computes at 0.52x the speed the plan assumed ..."
/// }
/// ```
///
/// The same seconds on every rank give the same verdict on every rank: no further agreement is needed.

#include <algorithm>  // std::max, std::min
#include <cmath>      // std::isfinite
#include <cstdio>     // std::snprintf
#include <stdexcept>  // std::invalid_argument
#include <string>     // std::string
#include <vector>     // std::vector

namespace mpx
{

struct SpeedWatchOptions
{
  double tolerance = 0.25;  ///< a slot this much slower per unit than the fastest is behind (0.25: 25 % more seconds)
  int patience = 3;         ///< steps in a row behind before it is a straggler
  int warmup = 1;           ///< first steps not judged (allocations, caches)
};

class SpeedWatch
{
 public:
  /// `predicted[k]`: slot k's compute per step in the plan, in any unit (positive); `assumed[k]`: the speeds the
  /// plan assumed (empty: all equal).
  SpeedWatch(std::vector<double> predicted, std::vector<double> assumed = {}, SpeedWatchOptions o = {})
      : predicted_(std::move(predicted)), assumed_(std::move(assumed)), o_(o)
  {
    if (predicted_.empty()) throw std::invalid_argument("mpx::SpeedWatch: no slots to watch");
    if (assumed_.empty()) assumed_.assign(predicted_.size(), 1.0);
    if (assumed_.size() != predicted_.size())
      throw std::invalid_argument("mpx::SpeedWatch: " + std::to_string(assumed_.size()) + " assumed speeds for " + std::to_string(predicted_.size()) +
                                  " slots; give one per slot");
    for (std::size_t k = 0; k < predicted_.size(); ++k)
      if (!(predicted_[k] > 0 && std::isfinite(predicted_[k]) && assumed_[k] > 0 && std::isfinite(assumed_[k])))
        throw std::invalid_argument("mpx::SpeedWatch: slot " + std::to_string(k) + "'s predicted compute and assumed speed must be positive");
    sums_.assign(predicted_.size(), 0.0);
  }

  /// One step's compute seconds per slot. True on the step a straggler is confirmed (`patience` steps behind
  /// in a row); it stays confirmed while it stays behind.
  bool observe(const std::vector<double>& seconds)
  {
    if (seconds.size() != predicted_.size())
      throw std::invalid_argument("mpx::SpeedWatch: " + std::to_string(seconds.size()) + " slots' seconds for " + std::to_string(predicted_.size()) + " slots");
    if (steps_++ < o_.warmup) return false;
    const std::vector<double> per_unit = per_unit_of(seconds);
    const double fastest = *std::min_element(per_unit.begin(), per_unit.end());
    int behind = -1;
    double worst = 1 + o_.tolerance;
    for (std::size_t k = 0; k < per_unit.size(); ++k)
      if (fastest > 0 && per_unit[k] / fastest > worst) worst = per_unit[k] / fastest, behind = int(k);
    if (behind < 0 || (streak_ > 0 && behind != candidate_)) streak_ = 0, std::fill(sums_.begin(), sums_.end(), 0.0);
    candidate_ = behind;
    if (behind < 0) return false;
    for (std::size_t k = 0; k < sums_.size(); ++k) sums_[k] += seconds[k];
    return ++streak_ == o_.patience;
  }

  /// The straggler confirmed on the last step (-1: none).
  int straggler() const { return streak_ >= o_.patience ? candidate_ : -1; }
  /// Each slot's speed as measured over the straggler's steps (the fastest 1; the assumed speeds while none).
  std::vector<double> measured() const
  {
    if (straggler() < 0) return normalised(assumed_);
    const std::vector<double> per_unit = per_unit_of(sums_);
    const double fastest = *std::min_element(per_unit.begin(), per_unit.end());
    std::vector<double> v(assumed_.size());
    for (std::size_t k = 0; k < v.size(); ++k) v[k] = assumed_[k] * fastest / per_unit[k];
    return normalised(v);
  }
  /// "slot 0 computes at 0.52x the speed the plan assumed for it (3 steps: 5.71 s of compute where the plan's
  /// proportions give 2.97 s); measured speeds 0.52, 1"
  std::string describe() const
  {
    const int s = straggler();
    if (s < 0) return "no slot behind the plan";
    const std::vector<double> m = measured();
    const std::vector<double> per_unit = per_unit_of(sums_);
    const double fastest = *std::min_element(per_unit.begin(), per_unit.end());
    char buf[256];
    std::snprintf(buf, sizeof buf, "slot %d computes at %.2fx the speed the plan assumed for it (%d steps: %.3g s of compute where the plan's proportions give %.3g s); measured speeds ",
                  s, fastest / per_unit[std::size_t(s)], streak_, sums_[std::size_t(s)], fastest * predicted_[std::size_t(s)]);
    std::string out = buf;
    for (std::size_t k = 0; k < m.size(); ++k) {
      std::snprintf(buf, sizeof buf, "%s%.2g", k == 0 ? "" : ", ", m[k]);
      out += buf;
    }
    return out;
  }

  /// `v` over its largest: the fastest 1.
  static std::vector<double> normalised(std::vector<double> v)
  {
    double top = 0;
    for (double x : v) top = std::max(top, x);
    if (top > 0)
      for (double& x : v) x /= top;
    return v;
  }

 private:
  std::vector<double> per_unit_of(const std::vector<double>& seconds) const
  {
    std::vector<double> v(seconds.size());
    for (std::size_t k = 0; k < v.size(); ++k) v[k] = seconds[k] / predicted_[k];
    return v;
  }

  std::vector<double> predicted_, assumed_, sums_;
  SpeedWatchOptions o_;
  long steps_ = 0;
  int streak_ = 0, candidate_ = -1;
};

}  // namespace mpx
