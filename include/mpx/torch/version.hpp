// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file torch/version.hpp
/// `MPX_TORCH_AT_LEAST(major, minor)`: the one guard for LibTorch API differences (1.13 here, 2.x on GPUs).

#include <torch/version.h>  // TORCH_VERSION_MAJOR, TORCH_VERSION_MINOR

#define MPX_TORCH_AT_LEAST(M, m) (TORCH_VERSION_MAJOR > (M) || (TORCH_VERSION_MAJOR == (M) && TORCH_VERSION_MINOR >= (m)))
