// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file runtime/checkpoint.hpp
/// Checkpoints (docs/08_checkpoints_and_restarts.md), one room each under runtime/checkpoint/:
///
/// | header | what |
/// |---|---|
/// | `format.hpp` | the files of a checkpoint, `CheckpointOptions`, `TrainingState`, `CheckpointStage`, durable writes |
/// | `manifest.hpp` | the manifest: sizes and XXH3-64 checksums, verification, finding the checkpoint a path names |
/// | `phases.hpp` | the save's phases, what a crash after each leaves, and their fault points |
/// | `save.hpp`, `load.hpp` | the save and load protocols (collectives) |
/// | `recut.hpp` | tensors found by name across layouts and tensor-parallel degrees |
/// | `optimizer_state.hpp` | optimizer state as named tensors |
/// | `local.hpp` | checkpoints of a model trained in one process |
/// | `export.hpp` | a checkpoint's whole weights as one file |
///
/// A pipeline's state goes through `runtime/training_state.hpp` (`Trainer::save` / `load`).

#include <mpx/runtime/checkpoint/export.hpp>           // mpx::consolidated_weights, export_checkpoint_weights
#include <mpx/runtime/checkpoint/format.hpp>           // mpx::CheckpointOptions, TrainingState, CheckpointStage
#include <mpx/runtime/checkpoint/load.hpp>             // mpx::detail::load_checkpoint
#include <mpx/runtime/checkpoint/local.hpp>            // mpx::LocalPart, save_local_checkpoint, load_local_checkpoint
#include <mpx/runtime/checkpoint/manifest.hpp>         // mpx::detail::Manifest, read_manifest, locate_checkpoint
#include <mpx/runtime/checkpoint/optimizer_state.hpp>  // mpx::named_optimizer_state, restore_optimizer_state
#include <mpx/runtime/checkpoint/phases.hpp>           // mpx::detail::SavePhase
#include <mpx/runtime/checkpoint/recut.hpp>            // mpx::detail::CheckpointReader, recut
#include <mpx/runtime/checkpoint/save.hpp>             // mpx::detail::save_checkpoint
#include <mpx/runtime/training_state.hpp>              // mpx::save_training_state, load_training_state
