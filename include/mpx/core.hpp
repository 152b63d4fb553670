// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file core.hpp
/// The compile-time layer of mpx, free of LibTorch: devices, stages, policies, pipelines, schedules,
/// their proof, fingerprints and printing. Builds in seconds; `mpx/mpx.hpp` adds the LibTorch glue.

#include <mpx/action.hpp>       // mpx::Op, mpx::Action, mpx::Step, mpx::Layout, mpx::Table
#include <mpx/batch.hpp>        // mpx::Batch
#include <mpx/boundary.hpp>     // mpx::Boundary
#include <mpx/channels.hpp>     // mpx::activation_channel, mpx::recv_channel, mpx::peer_stage
#include <mpx/config.hpp>       // MPX_VERSION_*, mpx::fixed_string
#include <mpx/device.hpp>       // mpx::GPU, mpx::CPU, mpx::Device
#include <mpx/fingerprint.hpp>  // mpx::fingerprint_v
#include <mpx/module.hpp>       // mpx::StageModule, mpx::module_traits
#include <mpx/nccl_order.hpp>   // mpx::prove_nccl_order, mpx::Streams (the reference model of NCCL's order)
#include <mpx/pipeline.hpp>     // mpx::Pipeline, queries (pipeline_queries.hpp)
#include <mpx/policy.hpp>       // mpx::Frozen, mpx::Checkpointed, mpx::Optimizer, ...
#include <mpx/print.hpp>        // mpx::print
#include <mpx/proof.hpp>        // mpx::prove, mpx::Proof
#include <mpx/run_proof.hpp>    // mpx::prove of a RunTable
#include <mpx/runs.hpp>         // mpx::RunTable, mpx::to_table
#include <mpx/shape.hpp>        // mpx::Dims, mpx::any, mpx::DeclaresShape
#include <mpx/speed_watch.hpp>  // mpx::SpeedWatch
#include <mpx/schedule.hpp>     // mpx::GPipe, mpx::OneFOneB, mpx::Interleaved1F1B, mpx::ZBH1
#include <mpx/stage.hpp>        // mpx::Stage
#include <mpx/tensor.hpp>       // mpx::TensorLike
#include <mpx/user_table.hpp>   // mpx::UserTable
