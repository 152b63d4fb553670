// SPDX-License-Identifier: Apache-2.0
// The hand-written baseline: the same balanced model and step as pipeline_bench, pipelined over two
// ranks with plain c10d send/recv and a hard-coded 1F1B order — no framework (of mpx only its host
// allocator, as the mpx modes use), no headers (shapes are fixed), every receive posted at the start of
// the step, sends waited at its end. Start it with mpxrun:
//   mpxrun --nproc-per-node 2 baseline_1f1b [steps]
// Prints "result handwritten <median seconds per step>" on rank 0.
#include "model.hpp"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <mpx/torch/host_memory.hpp>  // the same allocator as the mpx modes (only this standalone header of mpx)

#include <algorithm>
#include <cstdio>
#include <cstdlib>

using namespace bench;

int main(int argc, char** argv)
{
  torch::set_num_threads(1);
  mpx::keep_host_memory();  // large tensors from a cache, as make_world does for the mpx modes
  const int steps = argc > 1 ? std::atoi(argv[1]) : 10;
  const int rank = std::atoi(std::getenv("RANK")), world = std::atoi(std::getenv("WORLD_SIZE"));
  if (world != 2) {
    std::fprintf(stderr, "baseline_1f1b runs on exactly 2 ranks\n");
    return 2;
  }
  c10d::TCPStoreOptions so;
  so.port = static_cast<std::uint16_t>(std::atoi(std::getenv("MASTER_PORT")));
  so.isServer = rank == 0;
  so.numWorkers = 2;
  auto store = c10::make_intrusive<c10d::TCPStore>(std::getenv("MASTER_ADDR"), so);
  auto opts = c10d::ProcessGroupGloo::Options::create(std::chrono::seconds(60));
  opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(c10::make_intrusive<c10d::PrefixStore>("b/", store), rank, 2, opts);

  torch::manual_seed(rank);
  Stack stage(layers_total / 2);
  torch::optim::AdamW opt(stage->parameters(), torch::optim::AdamWOptions(1e-4));
  const int m = microbatches, peer = 1 - rank;
  std::vector<double> times;
  const auto data = batches(steps + 2);
  using clock = std::chrono::steady_clock;
  auto ms = [](clock::time_point a, clock::time_point b) { return std::chrono::duration<double, std::milli>(b - a).count(); };
  for (int s = 0; s < steps + 2; ++s) {
    const auto t0 = clock::now();
    auto x = data[std::size_t(s)].chunk(m);
    std::vector<at::Tensor> in(m), out(m), buf(m);
    std::vector<c10::intrusive_ptr<c10d::Work>> recvs(m), sends;
    double compute = 0;  // forward and backward time after their receive arrived (MPX_BENCH_VERBOSE)
    for (int i = 0; i < m; ++i) {  // every receive posted ahead: activations on rank 1, gradients on rank 0
      buf[i] = torch::empty({rows_per_mb, dim});
      std::vector<at::Tensor> v{buf[i]};
      recvs[i] = pg->recv(v, peer, rank == 0 ? 1 : 0);
    }
    auto forward = [&](int i) {
      if (rank == 0) {
        const auto c0 = clock::now();
        out[i] = stage->forward(x[i]);
        compute += ms(c0, clock::now());
        std::vector<at::Tensor> v{out[i].detach().contiguous()};
        sends.push_back(pg->send(v, peer, 0));
      } else {
        recvs[i]->wait();
        const auto c0 = clock::now();
        in[i] = buf[i].requires_grad_(true);
        out[i] = loss(stage->forward(in[i]), in[i]) / double(m);
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
    opt.step();
    const auto t2 = clock::now();
    opt.zero_grad();
    const auto t3 = clock::now();
    if (std::getenv("MPX_BENCH_VERBOSE"))
      std::printf("rank %d step %d: %.1f ms = schedule %.1f (compute %.1f) + optimizer %.1f + rest\n", rank, s, ms(t0, t3), ms(t0, t1),
                  compute, ms(t1, t2));
    if (s >= 2) times.push_back(ms(t0, t3) / 1e3);
  }
  std::sort(times.begin(), times.end());
  auto mx = torch::full({1}, times[times.size() / 2], torch::kDouble);
  std::vector<at::Tensor> v{mx};
  pg->allreduce(v, {c10d::ReduceOp::MAX})->wait();
  if (rank == 0) std::printf("result handwritten %.6f\n", mx.item<double>());
  return 0;
}
