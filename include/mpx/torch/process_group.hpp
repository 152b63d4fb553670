// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file torch/process_group.hpp
/// `mpx::ProcessGroupPtr`: a c10d group as this LibTorch names it (`ProcessGroupBase` — 1.13: ProcessGroup;
/// 2.x: Backend, from which Gloo and NCCL derive), and `detail::wait_bounded`, a wait with the run's timeout
/// on either.

#include <mpx/errors.hpp>         // mpx::peer_error
#include <mpx/torch/version.hpp>  // MPX_TORCH_AT_LEAST

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>  // c10d::ProcessGroupGloo (and the group it derives from)

#include <chrono>  // std::chrono::milliseconds, std::chrono::steady_clock
#include <string>  // std::to_string
#include <thread>  // std::this_thread::sleep_for

namespace mpx
{

#if MPX_TORCH_AT_LEAST(2, 0)
using ProcessGroupBase = c10d::Backend;
#else
using ProcessGroupBase = c10d::ProcessGroup;
#endif
using ProcessGroupPtr = c10::intrusive_ptr<ProcessGroupBase>;

namespace detail
{
/// Waits for `w` within `timeout`, or throws. For work on a CUDA device (NCCL), whose `wait` only orders the
/// current stream after it and never blocks the host unless blocking wait is on, by polling its completion
/// until the deadline (then ordering the stream after it): a dead or silent GPU peer is then an error here,
/// not a hang until NCCL's watchdog aborts the process.
inline void wait_bounded(const c10::intrusive_ptr<c10d::Work>& w, const c10::Device& device, std::chrono::milliseconds timeout)
{
  if (!device.is_cuda()) {
    try {
      w->wait(timeout);
    } catch (const c10::Error& e) {  // its message without LibTorch's C++ backtrace, which tells a user nothing
      throw peer_error(e.what_without_backtrace());
    }
    return;
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!w->isCompleted()) {
    if (std::chrono::steady_clock::now() > deadline)
      throw peer_error("the peer's part did not arrive within the timeout (" + std::to_string(timeout.count()) + " ms)");
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
  w->wait();  // rethrows its failure; orders the current stream after it
}
}  // namespace detail

}  // namespace mpx
