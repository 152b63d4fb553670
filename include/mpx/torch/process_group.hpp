// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file torch/process_group.hpp
/// `mpx::ProcessGroupPtr`: a c10d group as this LibTorch names it (1.13: ProcessGroup; 2.x: Backend, from
/// which Gloo and NCCL derive).

#include <mpx/torch/version.hpp>  // MPX_TORCH_AT_LEAST

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>  // c10d::ProcessGroupGloo (and the group it derives from)

namespace mpx
{

#if MPX_TORCH_AT_LEAST(2, 0)
using ProcessGroupPtr = c10::intrusive_ptr<c10d::Backend>;
#else
using ProcessGroupPtr = c10::intrusive_ptr<c10d::ProcessGroup>;
#endif

}  // namespace mpx
