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

#include <mpx/pipeline.hpp>                // mpx::PipelineType
#include <mpx/runtime/executor_core.hpp>  // mpx::detail::ExecutorCore, mpx::ScheduleFacts
#include <mpx/runtime/stage_set.hpp>      // mpx::StageSet
#include <mpx/runtime/wire/boundary_value.hpp>  // mpx::detail::flatten, unflatten
#include <mpx/table_view.hpp>             // mpx::table_view, mpx::actions_of

#include <functional>  // std::function
#include <string>      // std::string
#include <vector>      // std::vector

namespace mpx
{

/// What a walk reads of pipeline P, for a rank of slot `slot`.
template <PipelineType P>
ScheduleFacts schedule_facts(int slot)
{
  return {P::layout, std::string(P::schedule::name), actions_of(table_view<P>(), slot)};
}

/// The typed front of the walk: P's stages and the user's input and loss functions, over the compiled body
/// (`detail::ExecutorCore`, executor_core.hpp).
template <PipelineType P, class Batch>
class Executor : public detail::ExecutorCore
{
  static constexpr int N = P::num_stages;

 public:
  using Input = typename P::template input_of<0>;
  using Output = typename P::template output_of<N - 1>;
  using InputFn = std::function<Input(const Batch&)>;
  using LossFn = std::function<at::Tensor(const Output&, const Batch&)>;

  Executor(World& w, StageSet<P>& stages, InputFn input, LossFn loss)
      : ExecutorCore(w, stages, schedule_facts<P>(w.slot), calls(this, stages)), input_(std::move(input)), loss_(std::move(loss))
  {}

  /// Makes `mbs` (on the device) the micro-batches of the following walks: `walk(mbs, ...)` does, and the
  /// trainer before its step's walk.
  void use(const std::vector<Batch>& mbs) { mbs_ = &mbs; }

  /// Runs step `step`'s actions on `mbs` (ExecutorCore::walk).
  template <class StageDone>
  Walk walk(const std::vector<Batch>& mbs, double loss_seed, long step, TraceRecorder* trace, StageDone&& stage_done)
  {
    use(mbs);
    return ExecutorCore::walk(loss_seed, step, trace, [](int) {}, stage_done);
  }
  template <class LastBackward, class StageDone>
  Walk walk(const std::vector<Batch>& mbs, double loss_seed, long step, TraceRecorder* trace, LastBackward&& last_backward,
            StageDone&& stage_done)
  {
    use(mbs);
    return ExecutorCore::walk(loss_seed, step, trace, last_backward, stage_done);
  }

 private:
  /// The calls into `self`, made before it is built (static: no member is used until a walk).
  static Calls calls(Executor* self, StageSet<P>& stages)
  {
    return {[self](int mb) { return detail::flatten(self->input_(self->batch(mb))); },
            [self, &stages](int s, const std::vector<at::Tensor>& in, int mb) { return stages.forward(s, in, self->batch(mb)); },
            [self](const std::vector<at::Tensor>& out, int mb) { return self->loss_(detail::unflatten<Output>(out), self->batch(mb)); }};
  }
  const Batch& batch(int mb) const { return (*mbs_)[std::size_t(mb)]; }

  InputFn input_;
  LossFn loss_;
  const std::vector<Batch>* mbs_ = nullptr;
};

}  // namespace mpx
