// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file runtime/microbatches.hpp
/// A step's batch as the schedule consumes it: `slice_microbatches` slices a batch (a tensor or a Hana struct
/// of tensors) into m micro-batches along dim 0 (views, no copy); `to_device` moves micro-batches to the
/// rank's device (non-blocking), so the loss and the stages that read batch fields see device tensors.

#include <mpx/runtime/wire/boundary_value.hpp>  // mpx::detail::flatten, unflatten
#include <mpx/errors.hpp>          // mpx::config_error

#include <torch/torch.h>  // torch::Device

#include <string>  // std::to_string
#include <vector>  // std::vector

namespace mpx
{

/// Slices a batch (a tensor or a Hana struct of tensors) into m micro-batches along dim 0.
template <class Batch>
std::vector<Batch> slice_microbatches(const Batch& b, int m)
{
  auto fields = detail::flatten(b);
  const auto n = fields.at(0).size(0);
  for (auto& f : fields)
    if (f.size(0) != n)
      throw config_error("mpx: slice_microbatches: the batch's fields have different sizes along dim 0 (" + std::to_string(n) +
                         " and " + std::to_string(f.size(0)) + "); give every field the batch size first");
  if (m < 1 || n % m != 0)
    throw config_error("mpx: slice_microbatches: batch size (" + std::to_string(n) + ") is not divisible by the micro-batch count (" +
                       std::to_string(m) + "); choose a batch size that is a multiple of " + std::to_string(m));
  std::vector<Batch> out;
  for (int i = 0; i < m; ++i) {
    std::vector<at::Tensor> part;
    for (auto& f : fields) part.push_back(f.narrow(0, i * (n / m), n / m));
    out.push_back(detail::unflatten<Batch>(part));
  }
  return out;
}

/// The micro-batches with every defined field on `device` (copied without waiting).
template <class Batch>
std::vector<Batch> to_device(const std::vector<Batch>& microbatches, torch::Device device)
{
  std::vector<Batch> out;
  out.reserve(microbatches.size());
  for (const auto& b : microbatches) {
    auto fields = detail::flatten(b);
    for (auto& f : fields)
      if (f.defined()) f = f.to(device, /*non_blocking=*/true);
    out.push_back(detail::unflatten<Batch>(fields));
  }
  return out;
}

}  // namespace mpx
