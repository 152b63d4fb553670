// SPDX-License-Identifier: Apache-2.0
// Tensor-parallel benchmark, one rank of N (mpxrun --nproc-per-node N; N = 1 is the whole model): the tiny
// transformer of tests/support/tiny_tp_transformer.hpp at width 256, 4 heads, sequence 64, 8 rows, written
// with mpx::tp blocks, training (forward, backward, SGD) under one TP group of all ranks.
//   tp_bench <plain|sp> <steps>
// Rank 0 prints, for a model of 2 and of 4 layers, the collectives of one step (calls and payload bytes,
// tp::traffic), and "result <mode> <N> <seconds per step>" for the 4-layer model. The difference between
// the two depths is what one transformer layer moves per micro-batch, compared by run.sh with Megatron's
// formula. It also prints "activations <mode> <N> <layers> <bytes>": what this rank holds for the backward after
// the forward and the loss: the live bytes of mpx's host cache (torch/host_memory.hpp, every CPU block of 128 KiB
// and more, whichever thread frees it; sizes rounded to its classes) then, less before the forward.
#include "support/tiny_tp_transformer.hpp"

#include <mpx/mpx.hpp>

#include <chrono>
#include <cstdio>
#include <iostream>

namespace
{
namespace tp = mpx::tp;
using P1 = mpx::Pipeline<mpx::Stage<tiny_tp::Model, mpx::CPU<0>, mpx::Layers<0, 2>>, mpx::Microbatches<1>, mpx::Batch<tiny::Batch>>;
constexpr int rows = 8;

struct Measured
{
  tp::Traffic per_step;
  double seconds = 0;
  long long activation_bytes = 0;
};


Measured run(const tp::GroupPtr& g, int layers, bool sp, int steps)
{
  const tiny::Config c{512, 256, 4, layers, 64};
  torch::manual_seed(1);
  tiny_tp::Model model(c, 0, layers, sp);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(1e-3));
  auto step = [&](long k) {
    auto b = tiny::make_batch(c, rows, k, 0, 1);
    opt.zero_grad();
    tiny_tp::loss(model(b.tokens), b).backward();
    if (sp) tp::sum_replicated_gradients(*model, g);
    opt.step();
  };
  for (long k = 0; k < 2; ++k) step(k);  // warm-up
  Measured m;
  {  // the activations one step's forward leaves for its backward
    auto b = tiny::make_batch(c, rows, 2, 0, 1);
    opt.zero_grad();
    const auto before = mpx::host_memory_stats().live_bytes;
    auto loss = tiny_tp::loss(model(b.tokens), b);
    m.activation_bytes = static_cast<long long>(mpx::host_memory_stats().live_bytes) - static_cast<long long>(before);
    loss.backward();
    if (sp) tp::sum_replicated_gradients(*model, g);
    opt.step();
  }
  tp::traffic() = {};
  const auto t0 = std::chrono::steady_clock::now();
  for (long k = 0; k < steps; ++k) step(k);
  m.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / steps;
  const auto t = tp::traffic();
  m.per_step = {t.all_reduce_calls / steps, t.all_reduce_bytes / steps, t.all_gather_calls / steps, t.all_gather_bytes / steps};
  return m;
}
}  // namespace

int main(int argc, char** argv)
{
  if (argc < 3) {
    std::cerr << "usage: tp_bench plain|sp <steps>\n";
    return 2;
  }
  try {
    at::set_num_threads(1);
    const bool sp = std::string(argv[1]) == "sp";
    const int steps = std::atoi(argv[2]);
    auto world = mpx::make_world<P1>(mpx::read_env(), mpx::WorldOptions{std::chrono::seconds(60)});
    auto g = c10::make_intrusive<tp::Group>();
    g->pg = world.world;
    g->rank = world.env.rank;
    g->size = world.env.world_size;
    g->timeout = world.timeout;
    tp::Scope scope(g);
    for (int layers : {2, 4}) {
      const auto m = run(g, layers, sp, steps);
      if (g->rank == 0) {
        std::printf("traffic %s %d layers %d: all_reduce %lld calls %lld bytes, all_gather %lld calls %lld bytes\n", argv[1], g->size, layers,
                    (long long)m.per_step.all_reduce_calls, (long long)m.per_step.all_reduce_bytes, (long long)m.per_step.all_gather_calls,
                    (long long)m.per_step.all_gather_bytes);
        const auto cache = mpx::host_memory_stats();
        if (cache.hits + cache.misses > 0) std::printf("activations %s %d %d %lld\n", argv[1], g->size, layers, m.activation_bytes);
        else std::printf("activations %s %d %d unmeasured (mpx's host cache is off: unset MPX_KEEP_HOST_MEMORY)\n", argv[1], g->size, layers);
        if (layers == 4) std::printf("result %s %d %.6f\n", argv[1], g->size, m.seconds);
      }
    }
    std::fflush(stdout);
    return 0;
  } catch (const std::exception& e) {
    std::cerr << e.what() << "\n";
    return 1;
  }
}
