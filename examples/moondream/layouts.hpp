// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file examples/moondream/layouts.hpp
/// The pipelines `moondream_train` offers, one type each: where every part of moondream runs.
/// The recipe's optimizer (8-bit AdamW) is a stage policy; the decoder's depth comes from the JSON config,
/// so its text stages get their layer ranges at run time (equal ranges, or balanced by costs.hpp) rather than
/// with compile-time `mpx::Layers<b, e>`.

#include "model.hpp"  // moondream::Vision, Text, Batch

#include <mpx/mpx.hpp>

#ifndef MOONDREAM_MICROBATCHES
#define MOONDREAM_MICROBATCHES 4
#endif

namespace moondream
{

/// The vision stage's policy: trained with the recipe's optimizer, or `Frozen` — then, being the first stage,
/// it runs forward only (no backward, no gradient message from the text stage, no activations kept).
template <bool FrozenVision>
using VisionTraining = std::conditional_t<FrozenVision, mpx::Frozen, mpx::Optimizer<mpx::AdamW8bit>>;

/// vision | text — the seed's split: the encoder on one device, the decoder on the next; with TextTP > 1
/// the decoder is split over that many adjacent ranks (tensor parallelism: heads, MLP columns, vocabulary),
/// with VisionTP > 1 the encoder (heads, MLP columns) and its projection.
template <class Schedule, int TextTP = 1, int VisionTP = 1, bool FrozenVision = false>
using TwoStage = mpx::Pipeline<mpx::Stage<Vision, mpx::GPU<0>, VisionTraining<FrozenVision>, mpx::TensorParallel<VisionTP>>,
                               mpx::Stage<Text, mpx::GPU<1>, mpx::Optimizer<mpx::AdamW8bit>, mpx::Reads<"tokens">, mpx::TensorParallel<TextTP>>,
                               mpx::Batch<Batch>, mpx::Schedule<Schedule>, mpx::Microbatches<MOONDREAM_MICROBATCHES>>;

/// vision | text [0, n/3) | text [n/3, 2n/3) | text [2n/3, n) — the decoder over three devices.
template <class Schedule, bool FrozenVision = false>
using FourStage = mpx::Pipeline<mpx::Stage<Vision, mpx::GPU<0>, VisionTraining<FrozenVision>>,
                                mpx::Stage<Text, mpx::GPU<1>, mpx::Optimizer<mpx::AdamW8bit>, mpx::Reads<"tokens">>,
                                mpx::Stage<Text, mpx::GPU<2>, mpx::Optimizer<mpx::AdamW8bit>>,
                                mpx::Stage<Text, mpx::GPU<3>, mpx::Optimizer<mpx::AdamW8bit>>,
                                mpx::Batch<Batch>, mpx::Schedule<Schedule>, mpx::Microbatches<MOONDREAM_MICROBATCHES>>;

/// A balanced layout's stage on device K (costs.hpp): a `VisionText` range of pieces; the first
/// `FrozenSlots` stages hold only frozen encoder blocks and are `Frozen` (forward only).
template <int K, int FrozenSlots>
using BalancedStage = mpx::Stage<VisionText, mpx::GPU<K>, VisionTraining<(K < FrozenSlots)>, mpx::Reads<"tokens">>;

/// Layout 2b: two devices, the pieces partitioned where the costs say (ranges are run-time: the config decides them).
template <class Schedule, int FrozenSlots>
using TwoStageBalanced = mpx::Pipeline<BalancedStage<0, FrozenSlots>, BalancedStage<1, FrozenSlots>, mpx::Batch<Batch>,
                                       mpx::Schedule<Schedule>, mpx::Microbatches<MOONDREAM_MICROBATCHES>>;

/// Layout 4b: four devices, the pieces partitioned where the costs say.
template <class Schedule, int FrozenSlots>
using FourStageBalanced = mpx::Pipeline<BalancedStage<0, FrozenSlots>, BalancedStage<1, FrozenSlots>, BalancedStage<2, FrozenSlots>,
                                        BalancedStage<3, FrozenSlots>, mpx::Batch<Batch>, mpx::Schedule<Schedule>,
                                        mpx::Microbatches<MOONDREAM_MICROBATCHES>>;

struct Options;
int train_two_stage(const Options& o);   // train_two_stage.cpp
int train_two_stage_tp(const Options& o);  // train_two_stage_tp.cpp: the text stage over --tp ranks
int train_two_stage_vision_tp(const Options& o);  // train_two_stage_vision_tp.cpp: the vision stage over --vision-tp ranks too
int train_four_stage(const Options& o);  // train_four_stage.cpp
int train_frozen_vision(const Options& o);  // train_frozen_vision.cpp: layouts 2, 2x2 and 4 with the vision stage Frozen
int train_balanced(const Options& o);  // train_balanced.cpp: layouts 2b and 4b (ranges from costs.hpp)
int print_plans(const Options& o);     // train_balanced.cpp: --plan

}  // namespace moondream
