// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file runtime/trace.hpp
/// `TraceRecorder`: the actions of a rank's last step, each with its start, duration and the part of it
/// spent waiting for received data, and `write`, which gathers every rank's record through the store into
/// one Chrome trace (open it in Perfetto) and prints the measured bubble next to the expected one. A
/// forward or backward that waited shows the wait as its own slice (`wait F3`, category `wait`) just before
/// its work. It takes step statistics (`StepStats`), not the trainer.

#include <mpx/action.hpp>           // mpx::Action, mpx::op_name, mpx::is_compute
#include <mpx/runtime/options.hpp>  // mpx::StepStats
#include <mpx/runtime/world/world.hpp>    // mpx::World

#include <mpx/linkage.hpp>  // MPX_DECL, MPX_DEFINITIONS

#include <nlohmann/json_fwd.hpp>  // nlohmann::json

#include <chrono>    // std::chrono::steady_clock
#include <ostream>   // std::ostream
#include <string>    // std::string
#include <vector>    // std::vector

namespace mpx
{

namespace detail
{
/// A steady-clock span in seconds, and in whole microseconds (the trace's unit).
inline double seconds_of(std::chrono::steady_clock::duration d) { return std::chrono::duration<double>(d).count(); }
inline long micros_of(std::chrono::steady_clock::duration d) { return long(std::chrono::duration_cast<std::chrono::microseconds>(d).count()); }
}  // namespace detail

/// What the printed line says about the schedule.
struct TraceLabel
{
  std::string schedule;  ///< "1F1B"
  int slots = 1;
  int microbatches = 1;
  double expected_bubble = 0;
};

class TraceRecorder
{
 public:
  struct Event { Action a; long ts, dur, wait; };  ///< microseconds from the step's start

  /// Something outside the schedule's actions (data parallelism's all-reduce): an instant when dur is 0.
  struct Mark { std::string name; long ts, dur; };

  void clear() { events_.clear(), marks_.clear(); }
  void record(Action a, long ts, long dur, long wait) { events_.push_back({a, ts, dur, wait}); }
  void mark(std::string name, long ts, long dur) { marks_.push_back({std::move(name), ts, dur}); }
  const std::vector<Event>& events() const { return events_; }
  const std::vector<Mark>& marks() const { return marks_; }

  /// This rank's events as Chrome trace events.
  nlohmann::json to_json(int rank, int replica) const;

  /// A collective over the world: every rank publishes its events of step `step` (0-based) and measured
  /// bubble (from `last`); rank 0 writes them all to `path`, prints the mean measured bubble against the
  /// expected one and returns it (other ranks: their own).
  double write(World& w, const std::string& path, long step, const StepStats& last, const TraceLabel& label, std::ostream& log) const;

 private:
  std::vector<Event> events_;
  std::vector<Mark> marks_;
};

}  // namespace mpx

#if MPX_DEFINITIONS
// ---- definitions (compiled once under MPX_SEPARATE_COMPILATION: linkage.hpp) ----
#include <nlohmann/json.hpp>  // nlohmann::json

#include <fstream>  // std::ofstream

namespace mpx
{

MPX_DECL nlohmann::json TraceRecorder::to_json(int rank, int replica) const
{
  nlohmann::json mine = nlohmann::json::array();
  for (auto& e : events_) {
    const std::string name = std::string(op_name(e.a.op)) + std::to_string(e.a.mb);
    auto event = [&](std::string n, const char* cat, long ts, long dur) {
      mine.push_back({{"name", std::move(n)}, {"cat", cat}, {"ph", "X"}, {"ts", ts}, {"dur", dur}, {"pid", replica},
                      {"tid", rank}, {"args", {{"stage", e.a.stage}, {"mb", e.a.mb}}}});
    };
    if (e.wait > 0) event("wait " + name, "wait", e.ts, e.wait);  // the action's wait for its data, then its work
    event(name, is_compute(e.a.op) ? "compute" : "comm", e.ts + e.wait, e.dur - e.wait);
  }
  for (auto& k : marks_) {
    nlohmann::json ev = {{"name", k.name}, {"cat", "reduce"}, {"ts", k.ts}, {"pid", replica}, {"tid", rank}};
    if (k.dur > 0) ev["ph"] = "X", ev["dur"] = k.dur;
    else ev["ph"] = "i", ev["s"] = "t";
    mine.push_back(std::move(ev));
  }
  return mine;
}

MPX_DECL double TraceRecorder::write(World& w, const std::string& path, long step, const StepStats& last, const TraceLabel& label, std::ostream& log) const
{
  const std::string key = "mpx/trace/" + std::to_string(step) + "/" + std::to_string(w.env.rank);
  const std::string text = nlohmann::json{{"events", to_json(w.env.rank, w.replica)}, {"bubble", last.bubble()}}.dump();
  w.store->set(key, std::vector<uint8_t>(text.begin(), text.end()));
  if (w.env.rank != 0) return last.bubble();
  nlohmann::json all = {{"traceEvents", nlohmann::json::array()}, {"displayTimeUnit", "ms"}};
  double bubble = 0;
  for (int r = 0; r < w.env.world_size; ++r) {
    const std::string k = "mpx/trace/" + std::to_string(step) + "/" + std::to_string(r);
    w.store->wait({k}, w.timeout);
    auto bytes = w.store->get(k);
    auto got = nlohmann::json::parse(std::string(bytes.begin(), bytes.end()));
    bubble += got["bubble"].template get<double>() / w.env.world_size;
    for (auto& ev : got["events"]) all["traceEvents"].push_back(ev);
    all["traceEvents"].push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", r / w.ranks_per_replica}, {"tid", r},
                                  {"args", {{"name", "rank " + std::to_string(r) + " (slot " + std::to_string(w.slot_of(r)) + ")"}}}});
  }
  std::ofstream(path) << all.dump(1);
  log << "mpx: bubble of step " << step << ": measured " << int(bubble * 1000 + 0.5) / 10.0 << "% (mean over ranks), "
      << "expected " << int(label.expected_bubble * 1000 + 0.5) / 10.0 << "% (" << label.schedule << ", p = " << label.slots
      << ", m = " << label.microbatches << "); trace: " << path << "\n";
  return bubble;
}

}  // namespace mpx
#endif  // MPX_DEFINITIONS
