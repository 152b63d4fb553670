// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file runtime/world/speeds.hpp
/// Measuring the devices' speeds. `probe_speed` times fp32 matrix products on this rank's device for a
/// moment (every rank the same work; GFLOP/s, with the rank's intra-op threads, as training runs);
/// `exchange_speeds` gives every rank each rank's figure through the store (a store made before the world's
/// groups: a balanced layout needs the speeds to choose its pipeline type, `WorldOptions::store`);
/// `slot_seconds` gathers one step's compute seconds per slot — the slowest of the slot's ranks — for a
/// `SpeedWatch` (speed_watch.hpp).
///
/// ```
/// auto store = mpx::make_store(env, timeout);
/// const auto speeds = mpx::exchange_speeds(*store, env.rank, env.world_size, mpx::probe_speed(device), timeout);
/// const auto part = mpx::balance<mpx::OneFOneB>(costs, slots, microbatches, 0, speeds);   // one rank per slot
/// ```

#include <mpx/errors.hpp>                   // mpx::config_error, mpx::peer_error
#include <mpx/linkage.hpp>                  // MPX_DECL, MPX_DEFINITIONS
#include <mpx/runtime/world/rendezvous.hpp>  // mpx::make_store
#include <mpx/runtime/world/world.hpp>      // mpx::World

#include <torch/csrc/distributed/c10d/Store.hpp>  // c10d::Store
#include <torch/torch.h>                          // torch::Device

#include <chrono>  // std::chrono::milliseconds
#include <string>  // std::string
#include <vector>  // std::vector

namespace mpx
{

/// This rank's fp32 matrix-product throughput on `device` in GFLOP/s, timed over about `budget` (a throttled
/// device's quota periods average out over a few hundred milliseconds).
MPX_DECL double probe_speed(const torch::Device& device, std::chrono::milliseconds budget = std::chrono::milliseconds(400));

/// Every rank's `mine`, by rank (a collective over the store: every rank calls it once per `tag`).
MPX_DECL std::vector<double> exchange_speeds(c10d::Store& store, int rank, int world_size, double mine, std::chrono::milliseconds timeout,
                                             const std::string& tag = "probe");

/// Per slot, the most `mine` of its ranks (a collective over the world group: every rank calls it).
MPX_DECL std::vector<double> slot_seconds(World& w, double mine);

}  // namespace mpx

#if MPX_DEFINITIONS
// ---- definitions (compiled once under MPX_SEPARATE_COMPILATION: linkage.hpp) ----
#include <torch/cuda.h>  // torch::cuda::synchronize

#include <cmath>    // std::isfinite
#include <cstdlib>  // std::strtod

namespace mpx
{
MPX_DECL double probe_speed(const torch::Device& device, std::chrono::milliseconds budget)
{
  torch::NoGradGuard no_grad;
  const std::int64_t n = device.is_cuda() ? 4096 : 256;
  const auto opts = torch::TensorOptions().dtype(torch::kFloat).device(device);
  torch::manual_seed(0);
  const auto a = torch::randn({n, n}, opts), b = torch::randn({n, n}, opts);
  auto product = [&] {
    auto c = torch::mm(a, b);
    if (device.is_cuda()) torch::cuda::synchronize(device.index());
    return c;
  };
  product(), product();  // warm: kernels, allocator, threads
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  long products = 0;
  double seconds = 0;
  do {
    product();
    ++products;
    seconds = std::chrono::duration<double>(clock::now() - t0).count();
  } while (seconds * 1000 < double(budget.count()));
  return 2.0 * double(n) * double(n) * double(n) * double(products) / seconds / 1e9;
}

MPX_DECL std::vector<double> exchange_speeds(c10d::Store& store, int rank, int world_size, double mine, std::chrono::milliseconds timeout,
                                             const std::string& tag)
{
  if (!(mine > 0 && std::isfinite(mine))) throw config_error("mpx::exchange_speeds: rank " + std::to_string(rank) + "'s speed " + std::to_string(mine) + " is not a positive number");
  const std::string prefix = "mpx/speeds/" + tag + "/";
  const std::string text = std::to_string(mine);
  store.set(prefix + std::to_string(rank), std::vector<std::uint8_t>(text.begin(), text.end()));
  std::vector<std::string> keys;
  for (int r = 0; r < world_size; ++r) keys.push_back(prefix + std::to_string(r));
  try {
    store.wait(keys, timeout);
  } catch (const std::exception& e) {
    throw peer_error("mpx::exchange_speeds: rank " + std::to_string(rank) + " waited " + std::to_string(timeout.count()) +
                     " ms for every rank's measured speed; a rank did not reach the probe (is it running, with the same options?): " + e.what());
  }
  std::vector<double> speeds;
  for (const auto& k : keys) {
    const auto v = store.get(k);
    const std::string s(v.begin(), v.end());
    char* end = nullptr;
    const double x = std::strtod(s.c_str(), &end);
    if (end == s.c_str() || *end != '\0' || !(x > 0 && std::isfinite(x)))
      throw peer_error("mpx::exchange_speeds: the store holds '" + s + "' under " + k + ", not a speed: another program shares this rendezvous");
    speeds.push_back(x);
  }
  return speeds;
}

MPX_DECL std::vector<double> slot_seconds(World& w, double mine)
{
  auto t = torch::zeros({w.slots}, torch::kDouble);
  t[w.slot] = mine;
  std::vector<at::Tensor> v{t};
  w.world->allreduce(v, {c10d::ReduceOp::MAX})->wait(w.timeout);
  return std::vector<double>(t.data_ptr<double>(), t.data_ptr<double>() + w.slots);
}

}  // namespace mpx
#endif
