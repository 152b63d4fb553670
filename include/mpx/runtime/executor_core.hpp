// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file runtime/executor_core.hpp
/// `detail::ExecutorCore`: the body of `Executor<P, Batch>` (executor.hpp: what a walk does) that needs
/// neither type, compiled once under `mpx::compiled` (linkage.hpp). It reads the pipeline through
/// `ScheduleFacts` and `StageSetBase`, and reaches the typed code — stage 0's input, a stage's forward,
/// the loss — through `Calls`, by micro-batch index.

#include <mpx/action.hpp>                  // mpx::Action, mpx::Layout, mpx::Op
#include <mpx/channels.hpp>                // mpx::channel_of, mpx::peer_stage, mpx::message_stage
#include <mpx/linkage.hpp>                 // MPX_DECL, MPX_DEFINITIONS
#include <mpx/runtime/boundary_links.hpp>  // mpx::BoundaryLinks, mpx::PendingRecv
#include <mpx/runtime/split_state.hpp>     // mpx::SplitState
#include <mpx/runtime/stage_set_base.hpp>  // mpx::StageSetBase
#include <mpx/runtime/trace.hpp>           // mpx::TraceRecorder
#include <mpx/runtime/world/world.hpp>     // mpx::World

#include <chrono>      // std::chrono::steady_clock
#include <functional>  // std::function
#include <memory>      // std::unique_ptr
#include <string>      // std::string
#include <utility>     // std::pair
#include <vector>      // std::vector

namespace mpx
{
/// What a walk reads of the pipeline's type: its layout, the schedule's name, this rank's actions in order.
struct ScheduleFacts
{
  Layout layout;
  std::string schedule;
  std::vector<Action> actions;
};

namespace detail
{
class ExecutorCore
{
  using clock = std::chrono::steady_clock;

 public:
  /// The typed code a walk calls, by micro-batch index: stage 0's input (flattened), stage s's forward on
  /// its flattened inputs, the loss of the last stage's flattened outputs.
  struct Calls
  {
    std::function<std::vector<at::Tensor>(int mb)> input;
    std::function<std::vector<at::Tensor>(int s, const std::vector<at::Tensor>& in, int mb)> forward;
    std::function<at::Tensor(const std::vector<at::Tensor>& outputs, int mb)> loss;
  };
  /// What one walk measured.
  struct Walk
  {
    at::Tensor loss_sum;  ///< this replica's summed loss / m, in double, on the device (last stage only)
    double compute_seconds = 0, wait_seconds = 0;
  };
  using StageCall = std::function<void(int stage)>;

  MPX_DECL ExecutorCore(World& w, StageSetBase& stages, ScheduleFacts facts, Calls calls);
  MPX_DECL ~ExecutorCore();
  ExecutorCore(const ExecutorCore&) = delete;  // the calls point at the typed executor that holds it
  ExecutorCore& operator=(const ExecutorCore&) = delete;
  /// Calls around each compute action, by its place in `actions()` (before: true, after: false): ZeRO-3's gathers.
  using AroundCall = std::function<void(std::size_t k, bool before)>;
  /// Runs step `step`'s actions. The last stage seeds its backward with `loss_seed` (the loss scale);
  /// `last_backward(s)` runs before stage s's last backward, `stage_done(s)` after it, `around` (if set)
  /// around every compute.
  MPX_DECL Walk walk(double loss_seed, long step, TraceRecorder* trace, const StageCall& last_backward, const StageCall& stage_done,
                     const AroundCall& around = {});

  /// The split's facts (split_state.hpp): whether the schedule splits, the trainer's choice, each stage's marks.
  const SplitState& split() const { return split_; }
  /// Whether the next walks split I and W (the trainer's `SplitDecision`; off: I runs the whole backward).
  void choose_split(bool on) { split_.choose(on); }
  const std::vector<Action>& actions() const { return facts_.actions; }

 private:
  /// What one (stage, micro-batch) holds between its forward and its backward.
  struct MicroState
  {
    std::vector<at::Tensor> inputs, outputs, grads, input_grads;
    std::vector<at::Tensor> bounds, bound_grads;  // block boundaries and their gradients (split backward only)
    at::Tensor loss;
    std::unique_ptr<PendingRecv> recv_f, recv_b;  // not movable: the receiver thread points at them
  };
  MPX_DECL void run(Action a, std::size_t k, at::Tensor& loss_sum, const StageCall& stage_done);
  MPX_DECL void forward(Action a, MicroState& st, at::Tensor& loss_sum);
  /// A backward's outputs and their gradients: the loss and the seed (last stage), else the received ones.
  MPX_DECL std::pair<std::vector<at::Tensor>, std::vector<at::Tensor>> backward_seeds(MicroState& st, Action a);
  /// B (or an I that does not split): the inputs' gradients and the parameters' at once.
  MPX_DECL void whole_backward(MicroState& st, Action a);
  MPX_DECL void input_backward(MicroState& st, Action a);
  /// Whether action a computes its stage's parameter gradients (B; W when split, I when not).
  MPX_DECL bool computes_weights(Action a) const;
  MPX_DECL std::unique_ptr<PendingRecv> post(Action a, std::size_t k);
  MPX_DECL void send(Action a, std::size_t k, const std::vector<at::Tensor>& ts);
  /// The slot of the stage action a exchanges a message with.
  int peer_slot(Action a) const { return facts_.layout.rank_of[std::size_t(peer_stage(a.op, a.stage, num_stages()))]; }
  /// "mpx: rank 1 (slot 1, replica 0), step 2, action 7 F3 of stage 1, peer rank 0" (action_context.hpp).
  MPX_DECL std::string context(Action a, std::size_t k, bool with_peer) const;

  int num_stages() const { return facts_.layout.stages; }
  int num_microbatches() const { return facts_.layout.microbatches; }
  World& w_;
  StageSetBase& stages_;
  ScheduleFacts facts_;
  Calls calls_;
  std::vector<MicroState> state_;
  BoundaryLinks links_;  // after state_: its receiver thread stops before the receives it points at are gone
  SplitState split_;
  std::vector<int> backward_left_, weights_left_;  // per stage, this step's: backwards left; actions left computing weight gradients
  clock::duration wait_{};         // the running action's wait for received data
  double seed_ = 1;
  long step_ = 0;
};
}  // namespace detail
}  // namespace mpx

#if MPX_DEFINITIONS
// ---- definitions (compiled once under MPX_SEPARATE_COMPILATION: linkage.hpp) ----
#include <mpx/runtime/action_context.hpp>         // mpx::action_context, mpx::report_failure
#include <mpx/runtime/activation_checkpoint.hpp>  // mpx::BlockBoundaries
#include <mpx/runtime/backward.hpp>               // mpx::full_backward, input_backward, weight_backward
#include <mpx/runtime/launch/faults.hpp>          // mpx::inject_fault
#include <mpx/tp/group.hpp>                       // mpx::tp::Scope

#include <algorithm>  // std::fill, std::any_of
#include <iostream>   // std::clog
namespace mpx::detail
{

MPX_DECL ExecutorCore::ExecutorCore(World& w, StageSetBase& stages, ScheduleFacts facts, Calls calls)
    : w_(w), stages_(stages), facts_(std::move(facts)), calls_(std::move(calls)),
      state_(std::size_t(num_stages()) * std::size_t(num_microbatches())), links_(w),
      split_(num_stages(), std::any_of(facts_.actions.begin(), facts_.actions.end(), [](Action a) { return a.op == Op::W; })),
      backward_left_(std::size_t(num_stages()), num_microbatches()), weights_left_(std::size_t(num_stages()), num_microbatches())
{}
MPX_DECL ExecutorCore::~ExecutorCore() = default;

MPX_DECL ExecutorCore::Walk ExecutorCore::walk(double loss_seed, long step, TraceRecorder* trace, const StageCall& last_backward,
                                               const StageCall& stage_done, const AroundCall& around)
{
  Walk out;
  tp::Scope scope(w_.tp);  // the slot's tensor-parallel group for the stages, the loss and the backward
  step_ = step;
  seed_ = loss_seed;
  std::fill(backward_left_.begin(), backward_left_.end(), num_microbatches());
  std::fill(weights_left_.begin(), weights_left_.end(), num_microbatches());
  links_.next_step();  // a step's messages pack into the capacity its channels had before it
  if (trace) trace->clear();
  const auto t0 = clock::now();
  const auto& actions = facts_.actions;
  for (std::size_t k = 0; k < actions.size(); ++k) {
    const Action a = actions[k];
    const auto a0 = clock::now();
    wait_ = {};
    const bool around_it = around && is_compute(a.op);
    try {
      if (around_it) around(k, true);
      if (computes_weights(a) && weights_left_[a.stage] == 1) last_backward(int(a.stage));
      run(a, k, out.loss_sum, stage_done);
      if (around_it) around(k, false);
    } catch (...) {
      report_failure(std::current_exception(), context(a, k, true), context(a, k, false), a.stage);
    }
    const auto a1 = clock::now();
    if (is_compute(a.op)) out.compute_seconds += seconds_of(a1 - a0 - wait_), out.wait_seconds += seconds_of(wait_);
    if (trace) trace->record(a, micros_of(a0 - t0), micros_of(a1 - a0), micros_of(wait_));
  }
  links_.finish_sends();
  return out;
}

MPX_DECL void ExecutorCore::run(Action a, std::size_t k, at::Tensor& loss_sum, const StageCall& stage_done)
{
  const int s = a.stage;
  const Layout& layout = facts_.layout;
  MicroState& st = state_[std::size_t(s) * std::size_t(num_microbatches()) + a.mb];
  auto done = [&] { if (--backward_left_[std::size_t(s)] == 0) stage_done(s); };
  switch (a.op) {
    case Op::RecvF: st.recv_f = post(a, k); break;
    case Op::RecvB: st.recv_b = post(a, k); break;
    case Op::F: forward(a, st, loss_sum); break;
    case Op::SendF:
      send(a, k, st.outputs);
      if (!layout.trains(s)) st.outputs.clear();  // forward only: nothing waits for a backward
      break;
    case Op::B:
      whole_backward(st, a);
      done();
      break;
    case Op::I:
      if (split_.chosen() && split_.check_marks(s, !st.bounds.empty(), w_.env.rank, facts_.schedule, std::clog)) input_backward(st, a);
      else whole_backward(st, a);  // the W that follows has nothing left to do
      break;
    case Op::W:
      if (split_.splitting(s)) {
        weight_backward(st.outputs, st.grads, st.bounds, st.bound_grads, stages_.trainable(s));
        --weights_left_[std::size_t(s)];
      }
      st.outputs.clear(), st.grads.clear(), st.bounds.clear(), st.bound_grads.clear(), st.loss = at::Tensor();
      done();
      break;
    case Op::SendB:
      send(a, k, st.input_grads);
      st.inputs.clear(), st.input_grads.clear();
      break;
  }
  if ((a.op == Op::B || a.op == Op::W) && !layout.sends_backward(Op::B, s)) st.inputs.clear(), st.input_grads.clear();  // no SendB
}

MPX_DECL void ExecutorCore::forward(Action a, MicroState& st, at::Tensor& loss_sum)
{
  const int s = a.stage;
  if (s == 0) {
    st.inputs = calls_.input(int(a.mb));
    for (auto& x : st.inputs) x = x.to(w_.device);
  } else {
    st.inputs = links_.take(st.recv_f, wait_);
    for (auto& x : st.inputs)
      if (x.defined()) x = x.to(w_.device).detach().requires_grad_(x.requires_grad());
  }
  const bool trains = facts_.layout.trains(s);  // else forward only: no graph, nothing kept for a backward
  torch::AutoGradMode enable(trains);
  std::vector<at::Tensor> bounds;  // under a split backward: the blocks' boundaries, for the W pass
  {
    BlockBoundaries capture(split_.splitting(s) && trains ? &bounds : nullptr);
    inject_fault(w_.env, FaultPoint::forward, step_);  // MPX_FAULT=exception:<rank>:<step> (tests)
    st.outputs = calls_.forward(s, st.inputs, int(a.mb));
  }
  st.bounds = detail::usable_boundaries(bounds, st.outputs);
  if (!trains) st.inputs.clear();
  if (s == num_stages() - 1) {
    st.loss = calls_.loss(st.outputs, int(a.mb)) / double(num_microbatches());
    // in double, as the host sum was: the same loss on every device and in every test
    loss_sum = loss_sum.defined() ? loss_sum + st.loss.detach().to(at::kDouble) : st.loss.detach().to(at::kDouble);
    if (!trains) st.outputs.clear(), st.loss = at::Tensor();  // every stage frozen: an evaluation
  }
}

MPX_DECL std::pair<std::vector<at::Tensor>, std::vector<at::Tensor>> ExecutorCore::backward_seeds(MicroState& st, Action a)
{
  if (a.stage == num_stages() - 1) return {{st.loss}, {torch::full_like(st.loss, seed_)}};  // d(seed * loss)
  std::pair<std::vector<at::Tensor>, std::vector<at::Tensor>> out;
  auto g = links_.take(st.recv_b, wait_, st.outputs);
  for (std::size_t i = 0; i < st.outputs.size() && i < g.size(); ++i)
    if (g[i].defined() && st.outputs[i].requires_grad()) {
      out.first.push_back(st.outputs[i]);
      out.second.push_back(g[i].to(w_.device).to(st.outputs[i].scalar_type()));
    }
  return out;
}

MPX_DECL void ExecutorCore::whole_backward(MicroState& st, Action a)
{
  auto [outs, grads] = backward_seeds(st, a);
  st.input_grads = mpx::full_backward(outs, grads, st.inputs);
  --weights_left_[std::size_t(a.stage)];
  st.outputs.clear();
  st.loss = at::Tensor();
}

MPX_DECL void ExecutorCore::input_backward(MicroState& st, Action a)
{
  auto [outs, grads] = backward_seeds(st, a);
  auto g = mpx::input_backward(outs, grads, st.inputs, st.bounds);
  st.input_grads = std::move(g.inputs), st.bound_grads = std::move(g.bounds);
  st.outputs = std::move(outs), st.grads = std::move(grads);
}

MPX_DECL bool ExecutorCore::computes_weights(Action a) const
{
  return a.op == Op::B || (a.op == Op::W && split_.splitting(a.stage)) ||
         (a.op == Op::I && (!split_.chosen() || split_.checked(a.stage)) && !split_.splitting(a.stage));
}

MPX_DECL std::unique_ptr<PendingRecv> ExecutorCore::post(Action a, std::size_t k)
{
  const int ch = channel_of(a.op, a.stage), from = peer_slot(a), ms = message_stage(ch);
  const bool grad = is_gradient_channel(ch);
  const auto& in = stages_.input_boundary(ms);
  Expect e{ms, int(a.mb), grad, in.names, (grad ? "gradients of " : "") + in.type, in.dims};
  return links_.post(from, ch, std::move(e), context(a, k, true));
}

MPX_DECL void ExecutorCore::send(Action a, std::size_t k, const std::vector<at::Tensor>& ts)
{
  const int ch = channel_of(a.op, a.stage);
  links_.send(peer_slot(a), ch, message_stage(ch), int(a.mb), is_gradient_channel(ch), ts, stages_.wire_dtype(ch / 2), context(a, k, true));
}

MPX_DECL std::string ExecutorCore::context(Action a, std::size_t k, bool with_peer) const
{
  if (!with_peer || peer_stage(a.op, a.stage, num_stages()) < 0) return action_context(w_, step_, k, a, -1);
  // the global rank of the peer slot's member of this rank's lane (the peer it receives from, and first sends to)
  const int slot = peer_slot(a);
  return action_context(w_, step_, k, a, w_.global_rank(w_.replica, slot, w_.tp_rank % w_.degree[std::size_t(slot)]));
}

}  // namespace mpx::detail
#endif  // MPX_DEFINITIONS
