// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file runtime.hpp
/// The distributed runtime (docs/05_running.md, "How one step flows"), in rooms: `runtime/wire/` (what
/// crosses between ranks), `runtime/launch/` (the environment, the launcher, injected faults),
/// `runtime/world/` (rendezvous and process groups), `runtime/checkpoint/` (saved training state), and at
/// `runtime/` the trainer and the phases of its step.

#include <mpx/errors.hpp>                         // mpx::config_error, mpx::peer_error, mpx::stage_error
#include <mpx/runtime/activation_checkpoint.hpp>  // mpx::checkpoint, mpx::checkpoint_block
#include <mpx/runtime/checkpoint.hpp>             // mpx::save_local_checkpoint, mpx::export_checkpoint_weights, ...
#include <mpx/runtime/launch/env.hpp>             // mpx::Env, mpx::read_env
#include <mpx/runtime/launch/launch.hpp>          // mpx::launch, mpx::relaunch_self
#include <mpx/runtime/lr.hpp>                     // mpx::WarmupCosine
#include <mpx/runtime/precision.hpp>              // mpx::AutocastGuard, mpx::LossScaler
#include <mpx/runtime/profile.hpp>                // mpx::measure_layer_costs, mpx::balance_report
#include <mpx/runtime/sampler.hpp>                // mpx::DistributedSampler
#include <mpx/runtime/trainer.hpp>                // mpx::Trainer (and every room it composes: options, stage set, executor, ...)
#include <mpx/runtime/wire.hpp>                   // mpx::send_tensors, mpx::post_recv, mpx::finish_recv
#include <mpx/runtime/world/speeds.hpp>           // mpx::probe_speed, mpx::exchange_speeds, mpx::slot_seconds
#include <mpx/runtime/world/world.hpp>            // mpx::World, mpx::make_world
