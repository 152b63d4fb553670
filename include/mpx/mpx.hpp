// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file mpx.hpp
/// Everything: the compile-time layer (core.hpp), the LibTorch glue (mpx/torch/) and the runtime.

#include <mpx/core.hpp>          // the compile-time layer
#include <mpx/io/safetensors.hpp>   // mpx::load_safetensors, mpx::save_safetensors
#include <mpx/lora/adapters.hpp>   // mpx::lora::apply, fold, merged
#include <mpx/optim/adamw8bit.hpp>  // mpx::AdamW8bitOptimizer
#include <mpx/optim/fused_adamw.hpp>  // mpx::FusedAdamW
#include <mpx/quant/export.hpp>  // mpx::quant::pack_weights, read_packed, install_packed
#include <mpx/quant/model.hpp>  // mpx::quant::quantize_frozen, fake_quantize, Unpacked
#include <mpx/runtime.hpp>       // mpx::make_world, mpx::Trainer, mpx::launch
#include <mpx/torch/blas.hpp>    // mpx::check_blas
#include <mpx/torch/host_memory.hpp>  // mpx::keep_host_memory
#include <mpx/torch/nccl_rules.hpp>   // mpx::NcclRulesGroup
#include <mpx/torch/shaped.hpp>  // mpx::Shaped, mpx::Ranked
#include <mpx/torch/tensor.hpp>  // at::Tensor as mpx::TensorLike
#include <mpx/tp.hpp>            // mpx::tp: tensor-parallel blocks
