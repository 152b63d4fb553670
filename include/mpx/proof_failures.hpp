// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file proof_failures.hpp
/// The compile-time messages of a failed schedule proof: `Pipeline` instantiates these with the proof's
/// verdict and place as template arguments, so that the compiler's error names the rank, step and action
/// (the Gloo-order proof, proof.hpp) or the two ranks' waits that hold each other (NCCL's order). Internal.

#include <mpx/action.hpp>  // mpx::Op
#include <mpx/proof.hpp>   // mpx::Verdict

namespace mpx::detail
{

/// Raised with the failing rank, step and action as template arguments when a schedule's proof fails.
template <Verdict V, int Rank, int StepIndex, Op Action, int StageIndex, int Microbatch>
struct schedule_proof_failed
{
  static_assert(V != Verdict::bad_shape,
                "mpx::Pipeline: the schedule table does not fit the pipeline (rank count, stages per rank, or receive "
                "tokens out of compute order); see the rank and step in mpx::detail::schedule_proof_failed above");
  static_assert(V != Verdict::foreign_action,
                "mpx::Pipeline: the schedule table runs a stage on a rank that does not hold it, or a micro-batch >= "
                "Microbatches; see the rank, step and action in mpx::detail::schedule_proof_failed above");
  static_assert(V != Verdict::duplicate_action,
                "mpx::Pipeline: the schedule table runs an action twice; see mpx::detail::schedule_proof_failed above");
  static_assert(V != Verdict::unfinished_microbatch,
                "mpx::Pipeline: the schedule table leaves a micro-batch unfinished (a stage lacks its forward or "
                "backward for it); the missing action is in mpx::detail::schedule_proof_failed above");
  static_assert(V != Verdict::out_of_order,
                "mpx::Pipeline: the schedule table runs an action before what it needs (a backward before its "
                "forward, W before I, or a compute whose receive is not posted yet); see "
                "mpx::detail::schedule_proof_failed above");
  static_assert(V != Verdict::unmatched_messages,
                "mpx::Pipeline: in the schedule table, sends and receives between two stages do not match in order; "
                "see mpx::detail::schedule_proof_failed above");
  static_assert(V != Verdict::deadlock,
                "mpx::Pipeline: the schedule table deadlocks under blocking sends (a send completes only when the peer "
                "has posted its receive); the first blocked rank, its step and what it waits for are in "
                "mpx::detail::schedule_proof_failed above. Post receives earlier (RF/RB tokens) or reorder");
  static_assert(V != Verdict::forward_only_backward,
                "mpx::Pipeline: the schedule table gives a backward (B, I or W) to a forward-only stage: a Frozen stage "
                "with no trainable stage before it runs forwards only and gets no gradient; remove those actions from "
                "the table (see mpx::detail::schedule_proof_failed above)");
  static constexpr bool ok = true;
};

/// Raised with the two ranks that wait for each other when a table deadlocks under NCCL's order with a
/// group per channel (`Sends::never_wait`): the blocked rank's wait (the message its compute needs) and
/// where the rank that should send it waits itself. Implied by the Gloo-order proof, so a table that
/// passes that one never raises this (docs/03).
template <Verdict V, int Rank, Op Waits, int Stage, int Microbatch, int Peer, Op PeerWaits, int PeerStage, int PeerMicrobatch>
struct nccl_order_failed
{
  static_assert(V == Verdict::ok,
                "mpx::Pipeline: the schedule table deadlocks under NCCL's order (a group per channel: a compute waits "
                "for a message its peer never sends): rank Rank waits on Waits of stage Stage, micro-batch Microbatch, "
                "while rank Peer waits on PeerWaits of stage PeerStage, micro-batch PeerMicrobatch (the template "
                "arguments of mpx::detail::nccl_order_failed above); reorder the table");
  static constexpr bool ok = true;
};

}  // namespace mpx::detail
