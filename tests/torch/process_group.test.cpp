// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/torch/process_group.hpp: `wait_bounded` ends a wait that never completes with a named error
// within the timeout, both ways: a work's own timed wait (Gloo), and polling (a work on a CUDA device,
// whose wait would not block: here a never-finishing work under the CUDA branch).
#include "support/catch_torch.hpp"

#include <mpx/errors.hpp>
#include <mpx/torch/process_group.hpp>

#include <chrono>
#include <string>
#include <thread>

namespace
{
using namespace std::chrono_literals;

/// A work that completes when told to.
struct Pending : c10d::Work
{
  void complete() { finish(); }
};
}  // namespace

TEST_CASE("wait_bounded: a work that never completes fails within the timeout, polled on CUDA and waited on CPU", "[torch][process_group]")
{
  for (const c10::Device device : {c10::Device(c10::kCUDA, 0), c10::Device(c10::kCPU)}) {
    CAPTURE(device.str());
    auto never = c10::make_intrusive<Pending>();
    const auto t0 = std::chrono::steady_clock::now();
    CHECK_THROWS(mpx::detail::wait_bounded(never, device, 200ms));
    const auto took = std::chrono::steady_clock::now() - t0;
    CHECK(took >= 200ms);
    CHECK(took < 5s);
  }
  // either way a peer_error whose message is one line a user can read (no LibTorch backtrace)
  for (const c10::Device device : {c10::Device(c10::kCUDA, 0), c10::Device(c10::kCPU)}) {
    CAPTURE(device.str());
    auto never = c10::make_intrusive<Pending>();
    CHECK_THROWS_AS(mpx::detail::wait_bounded(never, device, 50ms), mpx::peer_error);
    try {
      mpx::detail::wait_bounded(never, device, 50ms);
    } catch (const std::exception& e) {
      const std::string m = e.what();
      CAPTURE(m);
      CHECK(!m.empty());
      CHECK(m.find("frame #") == std::string::npos);
      CHECK(m.find("Exception raised from") == std::string::npos);
    }
  }
}

TEST_CASE("wait_bounded: a work completed by another thread is waited for, not failed", "[torch][process_group]")
{
  auto later = c10::make_intrusive<Pending>();
  std::thread t([&] {
    std::this_thread::sleep_for(50ms);
    later->complete();
  });
  CHECK_NOTHROW(mpx::detail::wait_bounded(later, c10::Device(c10::kCUDA, 0), 5000ms));
  t.join();
}
