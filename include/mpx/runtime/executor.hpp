// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file runtime/executor.hpp
/// `Executor<P, Batch>`: walks this rank's compile-time action list for one step. Receives are posted as
/// far ahead as the table says, sends leave right after the compute that produced them, and a compute
/// waits only for the data it needs (the wait is its idle time). Channels and peers come from
/// channels.hpp, the same functions the proof uses. It knows nothing of optimizers or loss scaling: the
/// caller gives the loss's gradient seed, hears through `last_backward(s)` that stage s's last backward
/// of the step that computes parameter gradients (B; W, or I when it does not split) is about to run and
/// through `stage_done(s)` that it is done (data parallelism's buckets start in between, as the gradients
/// become final). Under ZB-H1 the trainer chooses before each walk whether its I/W passes split
/// (`choose_split`: split_decision.hpp; the facts behind a split: split_state.hpp); without the split each
/// I runs the whole backward and each W nothing. A forward-only stage (`Layout::forward_only`) runs its
/// forwards with autograd off and drops its inputs and outputs once sent: it keeps nothing between steps'
/// actions. A failure is reported where it happened (action_context.hpp): a `peer_error` for what came from
/// the wire, a `stage_error` for the stage's own code, both naming rank, step, action and, for a peer
/// error, the peer.

#include <mpx/action.hpp>                  // mpx::Action, mpx::expand, mpx::op_name
#include <mpx/channels.hpp>                // mpx::channel_of, mpx::peer_stage, mpx::message_stage
#include <mpx/pipeline.hpp>                // mpx::PipelineType
#include <mpx/runtime/action_context.hpp>  // mpx::action_context, mpx::report_failure
#include <mpx/runtime/activation_checkpoint.hpp>  // mpx::BlockBoundaries
#include <mpx/runtime/backward.hpp>        // mpx::full_backward, input_backward, weight_backward
#include <mpx/runtime/boundary_links.hpp>  // mpx::BoundaryLinks
#include <mpx/runtime/launch/faults.hpp>          // mpx::inject_fault
#include <mpx/runtime/split_state.hpp>     // mpx::SplitState
#include <mpx/runtime/stage_set.hpp>       // mpx::StageSet
#include <mpx/runtime/trace.hpp>           // mpx::TraceRecorder
#include <mpx/runtime/world/world.hpp>           // mpx::World
#include <mpx/table_view.hpp>              // mpx::table_view, mpx::actions_of

#include <algorithm>   // std::fill, std::any_of
#include <chrono>      // std::chrono::steady_clock
#include <functional>  // std::function
#include <iostream>    // std::clog
#include <memory>      // std::unique_ptr
#include <string>      // std::string
#include <vector>      // std::vector

namespace mpx
{

template <PipelineType P, class Batch>
class Executor
{
  static constexpr int N = P::num_stages;
  static constexpr int M = P::num_microbatches;
  using clock = std::chrono::steady_clock;

 public:
  using Input = typename P::template input_of<0>;
  using Output = typename P::template output_of<N - 1>;
  using InputFn = std::function<Input(const Batch&)>;
  using LossFn = std::function<at::Tensor(const Output&, const Batch&)>;

  /// What one walk measured.
  struct Walk
  {
    at::Tensor loss_sum;  ///< this replica's summed loss / m, in double, on the device (last stage only)
    double compute_seconds = 0, wait_seconds = 0;
  };

  Executor(World& w, StageSet<P>& stages, InputFn input, LossFn loss)
      : w_(w), stages_(stages), input_(std::move(input)), loss_(std::move(loss)), actions_(actions_of(table_view<P>(), w.slot)),
        state_(std::size_t(N) * M), links_(w), split_(N, std::any_of(actions_.begin(), actions_.end(), [](Action a) { return a.op == Op::W; }))
  {}

  /// Runs step `step`'s actions on `mbs` (on the device). The last stage seeds its backward with
  /// `loss_seed` (the loss scale); `last_backward(s)` runs before stage s's last backward, `stage_done(s)`
  /// after it.
  template <class StageDone>
  Walk walk(const std::vector<Batch>& mbs, double loss_seed, long step, TraceRecorder* trace, StageDone&& stage_done)
  {
    return walk(mbs, loss_seed, step, trace, [](int) {}, stage_done);
  }
  template <class LastBackward, class StageDone>
  Walk walk(const std::vector<Batch>& mbs, double loss_seed, long step, TraceRecorder* trace, LastBackward&& last_backward,
            StageDone&& stage_done)
  {
    Walk out;
    tp::Scope scope(w_.tp);  // the slot's tensor-parallel group for the stages, the loss and the backward
    step_ = step;
    seed_ = loss_seed;
    std::fill(backward_left_.begin(), backward_left_.end(), M);
    std::fill(weights_left_.begin(), weights_left_.end(), M);
    links_.next_step();  // a step's messages pack into the capacity its channels had before it
    if (trace) trace->clear();
    const auto t0 = clock::now();
    for (std::size_t k = 0; k < actions_.size(); ++k) {
      const Action a = actions_[k];
      const auto a0 = clock::now();
      wait_ = {};
      if (computes_weights(a) && weights_left_[a.stage] == 1) last_backward(int(a.stage));
      run_reporting(a, k, mbs, out.loss_sum, stage_done);
      const auto a1 = clock::now();
      if (is_compute(a.op)) out.compute_seconds += seconds(a1 - a0 - wait_), out.wait_seconds += seconds(wait_);
      if (trace) trace->record(a, us(a0 - t0), us(a1 - a0), us(wait_));
    }
    links_.finish_sends();
    return out;
  }

  /// The split's facts (split_state.hpp): whether the schedule splits, the trainer's choice, each stage's marks.
  const SplitState& split() const { return split_; }
  /// Whether the following walks split their backward into I and W (the trainer's `SplitDecision`);
  /// off: every I runs the whole backward and every W nothing. On by default.
  void choose_split(bool on) { split_.choose(on); }
  const std::vector<Action>& actions() const { return actions_; }

 private:
  /// What one (stage, micro-batch) holds between its forward and its backward.
  struct MicroState
  {
    std::vector<at::Tensor> inputs, outputs, grads, input_grads;
    std::vector<at::Tensor> bounds, bound_grads;  // block boundaries and their gradients (split backward only)
    at::Tensor loss;
    std::unique_ptr<PendingRecv> recv_f, recv_b;  // not movable: the receiver thread points at them
  };

  static double seconds(clock::duration d) { return std::chrono::duration<double>(d).count(); }
  static long us(clock::duration d) { return long(std::chrono::duration_cast<std::chrono::microseconds>(d).count()); }

  template <class StageDone>
  void run_reporting(Action a, std::size_t k, const std::vector<Batch>& mbs, at::Tensor& loss_sum, StageDone& stage_done)
  {
    try {
      run(a, k, mbs[a.mb], loss_sum, stage_done);
    } catch (...) {
      report_failure(std::current_exception(), context(a, k, true), context(a, k, false), a.stage);
    }
  }

  template <class StageDone>
  void run(Action a, std::size_t k, const Batch& b, at::Tensor& loss_sum, StageDone& stage_done)
  {
    const int s = a.stage;
    MicroState& st = state_[std::size_t(s) * M + a.mb];
    switch (a.op) {
      case Op::RecvF: st.recv_f = post(a, k); break;
      case Op::RecvB: st.recv_b = post(a, k); break;
      case Op::F: forward(a, st, b, loss_sum); break;
      case Op::SendF:
        send(a, k, st.outputs);
        if (!P::layout.trains(s)) st.outputs.clear();  // forward only: nothing waits for a backward
        break;
      case Op::B:
        whole_backward(st, a);
        done(s, stage_done);
        break;
      case Op::I:
        if (split_.chosen() && split_.check_marks(s, !st.bounds.empty(), w_.env.rank, P::schedule::name, std::clog)) input_backward(st, a);
        else whole_backward(st, a);  // the W that follows has nothing left to do
        break;
      case Op::W:
        if (split_.splitting(s)) {
          weight_backward(st.outputs, st.grads, st.bounds, st.bound_grads, stages_.trainable(s));
          --weights_left_[std::size_t(s)];
        }
        st.outputs.clear();
        st.grads.clear();
        st.bounds.clear();
        st.bound_grads.clear();
        st.loss = at::Tensor();
        done(s, stage_done);
        break;
      case Op::SendB:
        send(a, k, st.input_grads);
        st.inputs.clear();
        st.input_grads.clear();
        break;
    }
    if ((a.op == Op::B || a.op == Op::W) && !P::layout.sends_backward(Op::B, s)) st.inputs.clear(), st.input_grads.clear();  // no SendB
  }

  void forward(Action a, MicroState& st, const Batch& b, at::Tensor& loss_sum)
  {
    const int s = a.stage;
    if (s == 0) {
      st.inputs = detail::flatten(input_(b));
      for (auto& x : st.inputs) x = x.to(w_.device);
    } else {
      st.inputs = links_.take(st.recv_f, wait_);
      for (auto& x : st.inputs)
        if (x.defined()) {
          const bool g = x.requires_grad();
          x = x.to(w_.device).detach().requires_grad_(g);
        }
    }
    const bool trains = P::layout.trains(s);  // else forward only: no graph, nothing kept for a backward
    torch::AutoGradMode enable(trains);
    std::vector<at::Tensor> bounds;  // under a split backward: the blocks' boundaries, for the W pass
    {
      BlockBoundaries capture(split_.splitting(s) && trains ? &bounds : nullptr);
      inject_fault(w_.env, FaultPoint::forward, step_);  // MPX_FAULT=exception:<rank>:<step> (tests)
      st.outputs = stages_.forward(s, st.inputs, b);
    }
    st.bounds = detail::usable_boundaries(bounds, st.outputs);
    if (!trains) st.inputs.clear();
    if (s == N - 1) {
      st.loss = loss_(detail::unflatten<Output>(st.outputs), b) / double(M);
      // in double, as the host sum was: the same loss on every device and in every test
      loss_sum = loss_sum.defined() ? loss_sum + st.loss.detach().to(at::kDouble) : st.loss.detach().to(at::kDouble);
      if (!trains) st.outputs.clear(), st.loss = at::Tensor();  // every stage frozen: an evaluation
    }
  }

  /// The outputs a backward starts from and their gradients: the loss and the seed on the last stage, else
  /// the outputs that carry a gradient and the gradients received for them.
  std::pair<std::vector<at::Tensor>, std::vector<at::Tensor>> backward_seeds(MicroState& st, Action a)
  {
    if (a.stage == N - 1) return {{st.loss}, {torch::full_like(st.loss, seed_)}};  // d(seed * loss)
    std::pair<std::vector<at::Tensor>, std::vector<at::Tensor>> out;
    auto g = links_.take(st.recv_b, wait_, st.outputs);
    for (std::size_t i = 0; i < st.outputs.size() && i < g.size(); ++i)
      if (g[i].defined() && st.outputs[i].requires_grad()) {
        out.first.push_back(st.outputs[i]);
        out.second.push_back(g[i].to(w_.device).to(st.outputs[i].scalar_type()));
      }
    return out;
  }

  /// B (or an I that does not split): the inputs' gradients and the parameters' at once.
  void whole_backward(MicroState& st, Action a)
  {
    auto [outs, grads] = backward_seeds(st, a);
    st.input_grads = mpx::full_backward(outs, grads, st.inputs);
    --weights_left_[std::size_t(a.stage)];
    st.outputs.clear();
    st.loss = at::Tensor();
  }

  void input_backward(MicroState& st, Action a)
  {
    auto [outs, grads] = backward_seeds(st, a);
    auto g = mpx::input_backward(outs, grads, st.inputs, st.bounds);
    st.input_grads = std::move(g.inputs);
    st.bound_grads = std::move(g.bounds);
    st.outputs = std::move(outs);
    st.grads = std::move(grads);
  }

  /// Whether action a computes its stage's parameter gradients (B; W when split, I when not).
  bool computes_weights(Action a) const
  {
    return a.op == Op::B || (a.op == Op::W && split_.splitting(a.stage)) ||
           (a.op == Op::I && (!split_.chosen() || split_.checked(a.stage)) && !split_.splitting(a.stage));
  }

  template <class StageDone>
  void done(int s, StageDone& stage_done)
  {
    if (--backward_left_[std::size_t(s)] == 0) stage_done(s);
  }

  std::unique_ptr<PendingRecv> post(Action a, std::size_t k)
  {
    const int ch = channel_of(a.op, a.stage), from = P::slots[peer_stage(a.op, a.stage, N)], ms = message_stage(ch);
    const bool grad = is_gradient_channel(ch);
    const auto& in = stages_.input_boundary(ms);
    Expect e{ms, int(a.mb), grad, in.names, (grad ? "gradients of " : "") + in.type, in.dims};
    return links_.post(from, ch, std::move(e), context(a, k, true));
  }

  void send(Action a, std::size_t k, const std::vector<at::Tensor>& ts)
  {
    const int ch = channel_of(a.op, a.stage), to = P::slots[peer_stage(a.op, a.stage, N)];
    links_.send(to, ch, message_stage(ch), int(a.mb), is_gradient_channel(ch), ts, StageSet<P>::wire_dtype(ch / 2), context(a, k, true));
  }

  /// The global rank of slot s's member of this rank's lane (the peer it receives from, and first sends to).
  int peer_rank(int s) const { return w_.global_rank(w_.replica, s, w_.tp_rank % w_.degree[std::size_t(s)]); }

  /// "mpx: rank 1 (slot 1, replica 0), step 2, action 7 F3 of stage 1, peer rank 0" (action_context.hpp).
  std::string context(Action a, std::size_t k, bool with_peer) const
  {
    const int peer = peer_stage(a.op, a.stage, N);
    return action_context(w_, step_, k, a, with_peer && peer >= 0 ? peer_rank(P::slots[peer]) : -1);
  }

  World& w_;
  StageSet<P>& stages_;
  InputFn input_;
  LossFn loss_;
  std::vector<Action> actions_;
  std::vector<MicroState> state_;
  BoundaryLinks links_;  // after state_: its receiver thread stops before the receives it points at are gone
  SplitState split_;
  std::vector<int> backward_left_ = std::vector<int>(N, M);
  std::vector<int> weights_left_ = std::vector<int>(N, M);  // this step's actions left that compute parameter gradients
  clock::duration wait_{};  // the running action's wait for received data
  double seed_ = 1;
  long step_ = 0;
};

}  // namespace mpx
