// SPDX-License-Identifier: Apache-2.0
// The hand-written baseline (benchmarks/handwritten.hpp) on the same balanced model and step as
// pipeline_bench. Start it with mpxrun:
//   mpxrun --nproc-per-node 2 baseline_1f1b [steps]
// Prints "result handwritten <median seconds per step>" on rank 0.
#include "../handwritten.hpp"
#include "model.hpp"

#include <mpx/runtime/launch/env.hpp>  // the same settings as the mpx modes
#include <mpx/torch/host_memory.hpp>  // the same allocator as the mpx modes

using namespace bench;

int main(int argc, char** argv)
{
  torch::set_num_threads(1);
  if (mpx::read_env().keep_host_memory) mpx::keep_host_memory();  // large tensors from a cache, as make_world does for the mpx modes
  const int steps = argc > 1 ? std::atoi(argv[1]) : 10;
  const int rank = mpx::read_env().rank;
  try {
    torch::manual_seed(rank);
    Stack stage(layers_total / 2);
    torch::optim::AdamW opt(stage->parameters(), torch::optim::AdamWOptions(1e-4));
    handwritten::Setup su{[&](const at::Tensor& x) { return stage->forward(x); }, [](const at::Tensor& y) { return loss(y, y); }, &opt,
                          microbatches, {rows_per_mb, dim}};
    const double t = handwritten::run(su, rank, batches(steps + 2), steps);
    if (rank == 0) std::printf("result handwritten %.6f\n", t);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
