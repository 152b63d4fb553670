// SPDX-License-Identifier: Apache-2.0
#pragma once
// What the small-work benchmarks share (smallwork_bench.cpp, vlm_bench.cpp): the median, a pipelined
// contender's timed steps with the lines run.sh and report.py read, and the command line.
#include "../flags.hpp"

#include <mpx/mpx.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <type_traits>
#include <vector>

namespace smallwork
{
inline double median(std::vector<double> v)
{
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

/// Runs `warm + steps` steps of `trainer` (`microbatches(s)`: step s's micro-batches) and times those after
/// the warm-up. Prints per rank "detail <rank> <step> <schedule> <compute> <wait> <optimizer> <end-of-step>"
/// (medians, ms; end-of-step is the step less its schedule walk and its optimizer steps), on rank 0
/// "result <name> <the slower rank's median step, s> m <m>" and, when ZB-H1 measured its split,
/// "split <kept 0|1> <split ms> <whole ms> <median split / whole>". `trace` (with TrainOptions::trace set):
/// where the last step's Chrome trace goes ("": nowhere).
template <class Trainer, class Microbatches>
int run_steps(Trainer& trainer, mpx::World& world, const std::string& name, int m, int warm, int steps, Microbatches&& microbatches,
              const std::string& trace = "")
{
  std::vector<double> t, sched, compute, wait, optim, rest;
  for (int s = 0; s < steps + warm; ++s) {
    const auto t0 = std::chrono::steady_clock::now();
    auto st = trainer.step(microbatches(s));
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s < warm) continue;
    t.push_back(wall), sched.push_back(st.schedule_seconds), compute.push_back(st.compute_seconds), wait.push_back(st.wait_seconds);
    optim.push_back(st.optimizer_seconds), rest.push_back(wall - st.schedule_seconds - st.optimizer_seconds);
  }
  if (!trace.empty()) trainer.write_trace(trace);
  const int rank = world.env.rank;
  std::printf("detail %d %.3f %.3f %.3f %.3f %.3f %.3f\n", rank, median(t) * 1e3, median(sched) * 1e3, median(compute) * 1e3,
              median(wait) * 1e3, median(optim) * 1e3, median(rest) * 1e3);
  std::fflush(stdout);
  auto mx = torch::full({1}, median(t), torch::kDouble);  // the slower rank's
  std::vector<at::Tensor> v{mx};
  world.world->allreduce(v, {c10d::ReduceOp::MAX})->wait();
  if (rank == 0) std::printf("result %s %.6f m %d\n", name.c_str(), mx.item<double>(), m);
  if (const auto& d = trainer.split_decision(); rank == 0 && d.decided())
    std::printf("split %d %.3f %.3f %.4f\n", int(d.split()), d.split_seconds() * 1e3, d.whole_seconds() * 1e3, d.ratio());
  return 0;
}

/// A small-work benchmark's main: parses MODE M [steps] (`modes`: the modes, for the usage line), runs
/// `one_process(mode, m, steps)` — it returns -1 for a mode it does not run — else
/// `pipelined(std::integral_constant<int, M>{}, mode, steps)` with M = m among 2, 4, 8, 16 (the pipeline's
/// compile-time micro-batch count). One intra-op thread; a failure is printed and returns 1.
template <class OneProcess, class Pipelined>
int main_of(int argc, char** argv, const char* modes, OneProcess&& one_process, Pipelined&& pipelined)
{
  torch::set_num_threads(1);
  const auto args = bench::positional_of(argc, argv);
  if (args.size() < 3) {
    std::fprintf(stderr, "usage: %s %s M [steps] [--trace=FILE] [--verbose]\n", argv[0], modes);
    return 2;
  }
  const std::string mode = args[1];
  const int m = std::stoi(args[2]);
  const int steps = args.size() > 3 ? std::stoi(args[3]) : 20;
  try {
    if (const int st = one_process(mode, m, steps); st >= 0) return st;
    switch (m) {
      case 2: return pipelined(std::integral_constant<int, 2>{}, mode, steps);
      case 4: return pipelined(std::integral_constant<int, 4>{}, mode, steps);
      case 8: return pipelined(std::integral_constant<int, 8>{}, mode, steps);
      case 16: return pipelined(std::integral_constant<int, 16>{}, mode, steps);
      default: std::fprintf(stderr, "M must be 2, 4, 8 or 16 for the mpx modes\n"); return 2;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
}  // namespace smallwork
