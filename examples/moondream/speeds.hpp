// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file examples/moondream/speeds.hpp
/// The devices' speeds behind the plan, and the watch on them while training.
///
/// | source | the plan's speeds |
/// |---|---|
/// | `--device-speeds 1,0.5`  | declared, one per device (slot) of the layout: the second half as fast |
/// | `--device-speeds probe`  | each rank times matrix products (`mpx::probe_speed`) before the plan; a slot is as fast as its slowest rank |
/// | `<save>/speeds.json`     | `--rebalance on`, resuming: what the watch measured when it asked for the re-plan (before any of the above) |
/// | none                     | all equal |
///
/// `--costs measured` also times an encoder block and a decoder layer on every rank (`measure_scale`): the
/// encoder's time per FLOP against the decoder's scales its pieces' costs, so that the speeds are the devices'
/// and not the FLOP count's error (on a CPU an encoder block of the medium config takes about 1.4x its FLOPs' share).
///
/// `--rebalance report` gathers every slot's compute seconds each step (`mpx::slot_seconds`) into an
/// `mpx::SpeedWatch` and names a device that computes slower than the plan assumed, three steps in a row.
/// `--rebalance on` (layouts 2b and 4b, whose cuts are computed at run time) also re-plans then: when the
/// cut for the measured speeds predicts a step at least 5 % shorter, every rank saves the checkpoint, rank 0
/// writes `<save>/speeds.json`, and every rank exits with `mpx::replan_exit_status`; the launcher
/// (`--max-restarts`) starts them again, they plan with the measured speeds and resume from the checkpoint,
/// re-cut to the new ranges by global name.

#include "costs.hpp"   // moondream::Plan, plan_of
#include "measured_costs.hpp"  // moondream::measure_scale
#include "recipe.hpp"  // moondream::Options

#include <mpx/mpx.hpp>  // mpx::probe_speed, mpx::exchange_speeds, mpx::SpeedWatch

#include <fmt/format.h>          // fmt::format
#include <nlohmann/json.hpp>     // nlohmann::json

#include <unistd.h>  // gethostname

#include <algorithm>   // std::min_element, std::max_element
#include <cmath>       // std::round
#include <filesystem>  // std::filesystem
#include <fstream>     // std::ifstream, std::ofstream
#include <iostream>    // std::cout, std::cerr
#include <optional>    // std::optional
#include <string>      // std::string
#include <vector>      // std::vector

namespace moondream
{

/// The speeds a plan is made for: one per slot (empty: all equal), and where they came from.
struct Speeds
{
  std::vector<double> per_slot;
  std::string source = "equal (none declared)";
  CostScale scale;           ///< the encoder's time per FLOP against the decoder's (--costs measured)
  std::string scale_source;  ///< empty: from the FLOPs alone
};

/// "1,0.5" as `slots` speeds, each positive; anything else is a named error.
inline std::vector<double> parse_speeds(const std::string& text, int slots, const std::string& layout)
{
  std::vector<double> v;
  std::size_t at = 0;
  while (at <= text.size()) {
    const std::size_t comma = std::min(text.find(',', at), text.size());
    const std::string item = text.substr(at, comma - at);
    std::size_t used = 0;
    double x = 0;
    try {
      x = std::stod(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != item.size() || item.empty() || !(x > 0 && std::isfinite(x)))
      throw mpx::config_error(fmt::format("moondream_train: --device-speeds '{}': '{}' is not a positive number; give one relative speed per device "
                                          "(e.g. 1,0.5: the second device half as fast), or 'probe'", text, item));
    v.push_back(x);
    at = comma + 1;
  }
  if (int(v.size()) != slots)
    throw mpx::config_error(fmt::format("moondream_train: --device-speeds gives {} speeds; layout {} has {} devices (pipeline slots): give {}", v.size(),
                                        layout, slots, slots));
  return v;
}

/// The flags' own consistency, before any rank starts (main).
inline void check_speeds(const Options& o)
{
  if (o.layout == "1" && (!o.device_speeds.empty() || o.rebalance != "off"))
    throw mpx::config_error("moondream_train: --device-speeds and --rebalance plan a pipeline's devices; layout 1 is one process: use --layout 2b or 4b");
  if (!o.device_speeds.empty() && o.device_speeds != "probe") parse_speeds(o.device_speeds, slots_of(o.layout), o.layout);
  if (o.rebalance == "off") return;
  if (o.tp > 1 || o.vision_tp > 1)
    throw mpx::config_error("moondream_train: --rebalance compares whole devices' compute; a tensor-parallel slot's ranks each compute a part: "
                            "use --tp 1 --vision-tp 1, or --rebalance off");
  if (o.rebalance != "on") return;
  if (!is_balanced(o.layout))
    throw mpx::config_error("moondream_train: --rebalance on re-cuts the layers, which layouts 2b and 4b compute at run time; layout " + o.layout +
                            " keeps vision alone on its device: use --layout 2b or 4b, or --rebalance report");
  if (o.save.empty()) throw mpx::config_error("moondream_train: --rebalance on resumes from the checkpoint it saves: give --save DIR");
  if (!mpx::read_env().launched() && o.max_restarts < 1)
    throw mpx::config_error("moondream_train: --rebalance on starts the ranks again on the new plan: give --max-restarts 1 or more");
}

/// `<save>/speeds.json`: what a re-plan measured (and the cost scale it planned with).
inline std::string speeds_file(const Options& o) { return o.save + "/speeds.json"; }

inline void write_speeds_file(const Options& o, const Speeds& s, long step, const std::string& why)
{
  const nlohmann::json j{{"speeds", s.per_slot}, {"vision_forward", s.scale.vision_forward}, {"vision_backward", s.scale.vision_backward},
                         {"step", step}, {"measured", why}};
  const std::string path = speeds_file(o), tmp = path + ".tmp";
  {
    std::ofstream f(tmp);
    f << j.dump(2) << "\n";
    if (!f) throw mpx::config_error("moondream_train: could not write " + tmp);
  }
  std::filesystem::rename(tmp, path);
}

/// The devices' speeds for the plan: every rank gets the same (a probe is exchanged through `store`; `slot_of[r]`:
/// rank r's slot).
inline Speeds device_speeds(const Options& o, const mpx::Env& env, c10d::Store& store, const std::vector<int>& slot_of, int slots, bool resuming)
{
  Speeds s;
  if (o.rebalance == "on" && resuming && std::filesystem::exists(speeds_file(o))) {
    nlohmann::json j;
    try {
      std::ifstream f(speeds_file(o));
      j = nlohmann::json::parse(f);
      s.per_slot = j.at("speeds").get<std::vector<double>>();
      s.scale = CostScale{j.at("vision_forward").get<double>(), j.at("vision_backward").get<double>()};
      s.source = fmt::format("measured by the run at step {} ({})", j.at("step").get<long>(), speeds_file(o));
    } catch (const std::exception& e) {
      throw mpx::config_error(fmt::format("moondream_train: {} is not a speeds file ({}); delete it to plan with --device-speeds", speeds_file(o), e.what()));
    }
    if (int(s.per_slot.size()) != slots || !mpx::valid_speeds(s.per_slot, slots) || !(s.scale.vision_forward > 0) || !(s.scale.vision_backward > 0))
      throw mpx::config_error(fmt::format("moondream_train: {} holds {} speeds for a layout of {} devices; delete it to plan with --device-speeds",
                                          speeds_file(o), s.per_slot.size(), slots));
    if (o.costs == "measured") s.scale_source = s.source;
    else s.scale = {};
    return s;
  }
  if (o.device_speeds.empty()) return s;
  if (o.device_speeds != "probe") {
    s.per_slot = parse_speeds(o.device_speeds, slots, o.layout);
    s.source = "declared (--device-speeds)";
    return s;
  }
  const torch::Device device = torch::cuda::is_available() ? torch::Device(torch::kCUDA, env.local_rank) : torch::Device(torch::kCPU);
  const double mine = mpx::probe_speed(device);
  const auto ranks = mpx::exchange_speeds(store, env.rank, env.world_size, mine, std::chrono::milliseconds(long(o.timeout_s) * 1000));
  s.per_slot.assign(std::size_t(slots), 0.0);
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    double& v = s.per_slot[std::size_t(slot_of[r])];
    v = v == 0 ? ranks[r] : std::min(v, ranks[r]);  // a slot is as fast as its slowest rank
  }
  s.per_slot = mpx::SpeedWatch::normalised(s.per_slot);
  for (double& v : s.per_slot) v = std::max(0.01, std::round(v * 100) / 100);  // two digits: the same cut for the same devices
  s.source = "probed:";
  for (std::size_t r = 0; r < ranks.size(); ++r) s.source += fmt::format(" rank {} {:.1f} GFLOP/s{}", r, ranks[r], r + 1 < ranks.size() ? "," : "");
  return s;
}

/// The plan's speeds on this rank: the devices' (device_speeds), and under `--costs measured` the encoder's time per
/// FLOP against the decoder's, timed on every rank on micro-batch `mb`; the fastest rank's ratio counts (the ratio
/// is the pieces', not the device's, and a device held to part of its time — a CPU quota, a shared GPU — slices
/// the two timings unevenly).
inline Speeds resolve_speeds(const Options& o, const mpx::Env& env, c10d::Store& store, const std::vector<int>& slot_of, int slots, bool resuming,
                             const Config& c, const Batch& mb)
{
  Speeds s = device_speeds(o, env, store, slot_of, slots, resuming);
  if (o.costs != "measured" || !s.scale_source.empty()) return s;
  double per_flop = 0;
  const CostScale mine = measure_scale(c, mb, o.train_vision(), 3, &per_flop);
  const auto timeout = std::chrono::milliseconds(long(o.timeout_s) * 1000);
  const auto forward = mpx::exchange_speeds(store, env.rank, env.world_size, mine.vision_forward, timeout, "vision-forward");
  const auto backward = mpx::exchange_speeds(store, env.rank, env.world_size, mine.vision_backward, timeout, "vision-backward");
  const auto pace = mpx::exchange_speeds(store, env.rank, env.world_size, per_flop * 1e12, timeout, "decoder-pace");
  const auto fastest = std::size_t(std::min_element(pace.begin(), pace.end()) - pace.begin());
  s.scale = CostScale{std::round(forward[fastest] * 100) / 100, std::round(backward[fastest] * 100) / 100};  // two digits: a stable cut
  s.scale_source = fmt::format("timed on every rank, rank {}'s (the fastest) kept; forward {:.2f} to {:.2f}", fastest,
                               *std::min_element(forward.begin(), forward.end()), *std::max_element(forward.begin(), forward.end()));
  return s;
}

/// "1, 0.5"
inline std::string speeds_text(const std::vector<double>& v)
{
  std::string out;
  for (std::size_t k = 0; k < v.size(); ++k) out += fmt::format("{}{:.3g}", k == 0 ? "" : ", ", v[k]);
  return out.empty() ? "equal" : out;
}

/// The plan of `--layout` (costs.hpp) for that shape, on devices of those speeds. `cut`: that partition, not the
/// one the layout computes (a re-plan's "now").
inline Plan plan_for(const Options& o, const Config& c, const Workload& w, const Speeds& speeds = {}, std::optional<mpx::Partition> cut = {})
{
  const bool forward_only = o.vision_forward_only == "on" && o.tp == 1 && o.vision_tp == 1;  // the layouts with a Frozen vision type
  return plan_of(o.layout == "2x2" ? "2" : o.layout, o.schedule, c, w, o.microbatches(), !o.train_vision(), forward_only, speeds.per_slot, cut,
                 speeds.scale);
}

/// Names a confirmed straggler: rank 0 the slot, its ranks and the measured speeds; each of the slot's ranks itself
/// and its host.
inline void report_straggler(const mpx::SpeedWatch& watch, const mpx::World& world, long step)
{
  const int s = watch.straggler();
  std::string ranks;
  for (int rep = 0; rep < world.replicas; ++rep)
    for (int t = 0; t < world.degree[std::size_t(s)]; ++t) ranks += fmt::format("{}{}", ranks.empty() ? "" : ", ", world.global_rank(rep, s, t));
  if (world.slot == s) {
    char host[256] = {};
    if (::gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
    std::cerr << fmt::format("[rank {} on {}] this rank's device is behind the plan\n", world.env.rank, host);
  }
  if (world.env.rank == 0)
    std::cout << fmt::format("moondream_train: step {}: the device of rank {} (slot {}) is behind the plan: {}\n", step, ranks, s, watch.describe());
}

/// A re-plan's decision: the cut for the measured speeds against the current cut at those speeds; `worth` when it
/// differs and its predicted step is at least 5 % shorter. `text`: what rank 0 says of it.
struct Replan
{
  Speeds measured;
  Plan next;
  double gain = 0;
  bool worth = false;
  std::string text;
};

inline Replan replan_of(const Options& o, const Config& c, const Plan& plan, const mpx::SpeedWatch& watch)
{
  Replan r;
  r.measured = Speeds{watch.measured(), "measured", plan.scale, ""};
  const Plan now = plan_for(o, c, plan.workload, r.measured, plan.part);
  r.next = plan_for(o, c, plan.workload, r.measured);
  r.gain = 1.0 - double(r.next.predicted.makespan) / double(now.predicted.makespan);
  r.worth = r.next.part != plan.part && r.gain >= 0.05;
  r.text = r.worth ? fmt::format("moondream_train: re-planning for speeds {} (a step {:.1f}% shorter predicted): {}\n"
                                 "moondream_train: every rank saves the checkpoint and exits with status {}; the launcher starts them again on the new cut\n",
                                 speeds_text(r.measured.per_slot), 100 * r.gain, describe(r.next), mpx::replan_exit_status)
                   : fmt::format("moondream_train: the cut for the measured speeds predicts a step {:.1f}% shorter: keeping this one\n", 100 * r.gain);
  return r;
}

/// The watch of a plan: each slot's predicted compute (the proof's busy time under the plan's speeds).
inline mpx::SpeedWatch watch_of(const Plan& p, const Speeds& s)
{
  std::vector<double> busy;
  for (int k = 0; k < p.slots; ++k) busy.push_back(double(p.predicted.busy[std::size_t(k)]));
  return mpx::SpeedWatch(busy, s.per_slot);
}

}  // namespace moondream
