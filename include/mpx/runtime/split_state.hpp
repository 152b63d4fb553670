// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file runtime/split_state.hpp
/// `SplitState`: the three facts that decide whether a walk's backward runs split into I (input gradients)
/// and W (weight gradients), as the executor (executor.hpp) keeps them:
/// - the schedule splits: its table has W actions (ZB-H1);
/// - the split is chosen: the trainer's `SplitDecision` (split_decision.hpp) says, before each walk,
///   whether this walk splits (chosen until it says otherwise);
/// - stage s's module marks its blocks (`mpx::checkpoint_block`): checked at the stage's first split I —
///   without marks the W pass would walk the activation-gradient chain again (backward.hpp), so such a
///   stage's I runs the whole backward and its W nothing.
/// A stage splits in the walks now when all three hold (`splitting`).

#include <mpx/linkage.hpp>  // MPX_DECL, MPX_DEFINITIONS

#include <ostream>      // std::ostream
#include <string_view>  // std::string_view
#include <vector>   // std::vector

namespace mpx
{

class SplitState
{
 public:
  /// `stages`: the pipeline's stage count; `schedule_splits`: its table has W actions.
  SplitState(int stages, bool schedule_splits);

  bool schedule_splits() const { return schedule_; }
  /// The trainer's choice for the following walks.
  void choose(bool on) { chosen_ = on; }
  bool chosen() const { return chosen_; }

  /// Whether stage s's module marks its blocks: true until its first split I found otherwise.
  bool marks_blocks(int s) const { return marks_[std::size_t(s)] != 0; }
  /// Whether stage s's marks were checked (at its first split I).
  bool checked(int s) const { return checked_[std::size_t(s)] != 0; }
  /// Whether stage s has run a split I (its module marks blocks).
  bool ran_split(int s) const { return checked(s) && marks_blocks(s); }
  /// Whether stage s splits in the walks now: the schedule splits, the split is chosen, its module marks blocks.
  bool splitting(int s) const { return schedule_ && chosen_ && marks_blocks(s); }

  /// At a split I of stage s: records, the first time, whether its module marked blocks (`found`) — and
  /// when it did not, says so on `log` (rank `rank`, the schedule's name) — and returns whether this I splits.
  bool check_marks(int s, bool found, int rank, std::string_view schedule, std::ostream& log);

 private:
  bool schedule_, chosen_ = true;
  std::vector<char> checked_, marks_;
};

}  // namespace mpx

#if MPX_DEFINITIONS
// ---- definitions (compiled once under MPX_SEPARATE_COMPILATION: linkage.hpp) ----

namespace mpx
{

MPX_DECL SplitState::SplitState(int stages, bool schedule_splits)
    : schedule_(schedule_splits), checked_(std::size_t(stages), 0), marks_(std::size_t(stages), 1)
{
}

MPX_DECL bool SplitState::check_marks(int s, bool found, int rank, std::string_view schedule, std::ostream& log)
{
  if (!checked(s)) {
    checked_[std::size_t(s)] = 1;
    marks_[std::size_t(s)] = found ? 1 : 0;
    if (!found)
      log << "mpx: rank " << rank << ", stage " << s << ": its module marks no mpx::checkpoint_block boundaries, so " << schedule
          << "'s weight pass would walk its graph again; its I passes run the whole backward and its W passes nothing\n";
  }
  return marks_blocks(s);
}

}  // namespace mpx
#endif  // MPX_DEFINITIONS
