// SPDX-License-Identifier: Apache-2.0
#pragma once
// The hand-written baseline the pipeline benchmarks compare mpx with: two ranks, plain c10d send/recv
// and a hard-coded 1F1B order — no framework (of mpx only its host allocator, as the mpx modes use), no
// headers (shapes are fixed), every receive posted at the start of the step, sends waited at its end.
// `handwritten::run` trains `stage` (this rank's half) for `steps` + 2 steps on `batches` and returns
// the median step time of the slower rank. Needs RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (mpxrun).
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <stdexcept>
#include <vector>

namespace handwritten
{
/// Rank `rank`'s Gloo group of two over the launcher's store.
inline c10::intrusive_ptr<c10d::ProcessGroupGloo> group_of_two(int rank)
{
  c10d::TCPStoreOptions so;
  so.port = static_cast<std::uint16_t>(std::atoi(std::getenv("MASTER_PORT")));
  so.isServer = rank == 0;
  so.numWorkers = 2;
  auto store = c10::make_intrusive<c10d::TCPStore>(std::getenv("MASTER_ADDR"), so);
  auto opts = c10d::ProcessGroupGloo::Options::create(std::chrono::seconds(60));
  opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  return c10::make_intrusive<c10d::ProcessGroupGloo>(c10::make_intrusive<c10d::PrefixStore>("b/", store), rank, 2, opts);
}

/// What one step needs: this rank's stage, its optimizer, the loss of the last stage's output.
struct Setup
{
  std::function<at::Tensor(const at::Tensor&)> forward;
  std::function<at::Tensor(const at::Tensor&)> loss;  ///< of rank 1's output
  torch::optim::Optimizer* opt = nullptr;
  int microbatches = 1;
  std::vector<int64_t> message;  ///< the shape of one micro-batch's activation (and its gradient)
  bool verbose = false;          ///< every step's parts on every rank (--verbose)
};

/// The median step time (seconds) over `steps` steps after 2 warm-up ones, the slower rank's.
inline double run(const Setup& su, int rank, const std::vector<at::Tensor>& batches, int steps)
{
  if (std::atoi(std::getenv("WORLD_SIZE")) != 2) throw std::runtime_error("the hand-written pipeline runs on exactly 2 ranks");
  auto pg = group_of_two(rank);
  const int m = su.microbatches, peer = 1 - rank;
  std::vector<double> times;
  using clock = std::chrono::steady_clock;
  auto ms = [](clock::time_point a, clock::time_point b) { return std::chrono::duration<double, std::milli>(b - a).count(); };
  for (int s = 0; s < steps + 2; ++s) {
    const auto t0 = clock::now();
    auto x = batches[std::size_t(s)].chunk(m);
    const auto mu = std::size_t(m);
    std::vector<at::Tensor> in(mu), out(mu), buf(mu);
    std::vector<c10::intrusive_ptr<c10d::Work>> recvs(mu), sends;
    double compute = 0;  // forward and backward time after their receive arrived (--verbose)
    for (int i = 0; i < m; ++i) {  // every receive posted ahead: activations on rank 1, gradients on rank 0
      buf[i] = torch::empty(su.message);
      std::vector<at::Tensor> v{buf[i]};
      recvs[i] = pg->recv(v, peer, rank == 0 ? 1 : 0);
    }
    auto forward = [&](int i) {
      if (rank == 0) {
        const auto c0 = clock::now();
        out[i] = su.forward(x[i]);
        compute += ms(c0, clock::now());
        std::vector<at::Tensor> v{out[i].detach().contiguous()};
        sends.push_back(pg->send(v, peer, 0));
      } else {
        recvs[i]->wait();
        const auto c0 = clock::now();
        in[i] = buf[i].requires_grad_(true);
        out[i] = su.loss(su.forward(in[i])) / double(m);
        compute += ms(c0, clock::now());
      }
    };
    auto backward = [&](int i) {
      if (rank == 0) recvs[i]->wait();
      const auto c0 = clock::now();
      if (rank == 0) out[i].backward(buf[i]);
      else out[i].backward();
      compute += ms(c0, clock::now());
      if (rank == 1) {
        std::vector<at::Tensor> v{in[i].grad().contiguous()};
        sends.push_back(pg->send(v, peer, 1));
      }
      out[i] = at::Tensor();
    };
    const int warmup = rank == 0 ? 1 : 0;  // 1F1B: p - r - 1
    for (int i = 0; i < warmup; ++i) forward(i);
    for (int i = 0; i < m - warmup; ++i) {
      forward(warmup + i);
      backward(i);
    }
    for (int i = m - warmup; i < m; ++i) backward(i);
    for (auto& w : sends) w->wait();
    const auto t1 = clock::now();
    su.opt->step();
    const auto t2 = clock::now();
    su.opt->zero_grad();
    const auto t3 = clock::now();
    if (su.verbose)
      std::printf("rank %d step %d: %.1f ms = schedule %.1f (compute %.1f) + optimizer %.1f + rest\n", rank, s, ms(t0, t3), ms(t0, t1),
                  compute, ms(t1, t2));
    if (s >= 2) times.push_back(ms(t0, t3) / 1e3);
  }
  std::sort(times.begin(), times.end());
  auto mx = torch::full({1}, times[times.size() / 2], torch::kDouble);
  std::vector<at::Tensor> v{mx};
  pg->allreduce(v, {c10d::ReduceOp::MAX})->wait();
  return mx.item<double>();
}
}  // namespace handwritten
