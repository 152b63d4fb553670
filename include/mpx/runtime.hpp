// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file runtime.hpp
/// The distributed runtime: environment, launcher, process groups, wire protocol, the trainer and its rooms
/// (docs/05_running.md, "How one step flows").

#include <mpx/runtime/activation_checkpoint.hpp>  // mpx::checkpoint, mpx::checkpoint_block
#include <mpx/runtime/env.hpp>      // mpx::Env, mpx::read_env
#include <mpx/runtime/errors.hpp>   // mpx::config_error, mpx::peer_error
#include <mpx/runtime/launch.hpp>   // mpx::launch, mpx::relaunch_self
#include <mpx/runtime/lr.hpp>       // mpx::WarmupCosine
#include <mpx/runtime/precision.hpp>  // mpx::AutocastGuard, mpx::LossScaler
#include <mpx/runtime/profile.hpp>    // mpx::measure_layer_costs, mpx::balance_report
#include <mpx/runtime/sampler.hpp>  // mpx::DistributedSampler
#include <mpx/runtime/trainer.hpp>  // mpx::Trainer (and every room it composes: options, stage set, executor, ...)
#include <mpx/runtime/wire.hpp>     // mpx::send_tensors, mpx::post_recv, mpx::finish_recv
#include <mpx/runtime/world.hpp>    // mpx::World, mpx::make_world
