// SPDX-License-Identifier: Apache-2.0
// Small-work benchmark: a balanced model whose step takes a few to a few tens of milliseconds on these
// CPUs (2 x 4 layers of Linear 512x512 + GELU, AdamW, micro-batches of 8 rows), m micro-batches per step:
//   whole        one process, the whole batch of m micro-batches in one forward and backward
//   accumulate   one process, m micro-batches, gradients accumulated
//   gpipe | 1f1b | zbh1   mpx::Trainer, two CPU ranks, one stage each; zbh1 measures whether its split
//                pays (TrainOptions::split_backward = measure, the default) in 1 + 2 x 8 warm-up steps
//                and prints "split <kept 0|1> <split ms> <whole ms> <median split / whole>"
//   zbh1-split   ZB-H1 split at every step (split_backward = always)
//   1f1b-overlap  the same 1F1B with TrainOptions::skip_nonfinite = false (no end-of-step wait)
//   1f1b-torch-adamw  the same 1F1B stepping LibTorch's torch::optim::AdamW (TrainOptions::make_optimizer)
//                instead of mpx's default mpx::FusedAdamW: what the one-pass step saves
//   handwritten  plain c10d 1F1B (../handwritten.hpp); start it with mpxrun --nproc-per-node 2
// One intra-op thread per rank. Rank 0 prints "result <mode> <median seconds per step> m <m>"; mpx modes also
// print, per rank, "detail <rank> <step> <schedule> <compute> <wait> <optimizer> <end-of-step>" (medians, ms:
// end-of-step is the step less its schedule walk and its optimizer steps: gradient statistics, the loss
// and norm all-reduce, zeroing). --trace=FILE writes the last step's Chrome trace (mpx modes).
//   smallwork_bench MODE M [steps]
#include "../handwritten.hpp"
#include "../runtime/model.hpp"

#include "steps.hpp"  // smallwork::run_steps, median

#include <mpx/mpx.hpp>

#include <algorithm>
#include <cstdio>
#include <string>

namespace
{
constexpr int width = 512, layers_per_stage = 4, rows = 8;

std::vector<torch::Tensor> batches(int steps, int m)
{
  std::vector<torch::Tensor> out;
  for (int s = 0; s < steps; ++s) out.push_back(torch::randn({rows * m, width}, at::make_generator<at::CPUGeneratorImpl>(s)));
  return out;
}
torch::Tensor loss(const torch::Tensor& y) { return y.pow(2).mean(); }

int one_process(bool whole, int m, int steps)
{
  if (mpx::read_env().keep_host_memory) mpx::keep_host_memory();  // as make_world does in the pipelined modes
  torch::manual_seed(0);
  bench::Stack model(2 * layers_per_stage, width);
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-4));
  std::vector<double> t;
  const auto data = batches(steps + 2, m);
  for (int s = 0; s < steps + 2; ++s) {
    const auto t0 = std::chrono::steady_clock::now();
    if (whole) loss(model->forward(data[std::size_t(s)])).backward();
    else
      for (auto& mb : data[std::size_t(s)].chunk(m)) (loss(model->forward(mb)) / double(m)).backward();
    opt.step();
    opt.zero_grad();
    if (s >= 2) t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::printf("result %s %.6f m %d\n", whole ? "whole" : "accumulate", smallwork::median(t), m);
  return 0;
}

int handwritten_run(int m, int steps)
{
  if (mpx::read_env().keep_host_memory) mpx::keep_host_memory();
  const int rank = mpx::read_env().rank;
  torch::manual_seed(rank);
  bench::Stack stage(layers_per_stage, width);
  torch::optim::AdamW opt(stage->parameters(), torch::optim::AdamWOptions(1e-4));
  handwritten::Setup su{[&](const at::Tensor& x) { return stage->forward(x); }, loss, &opt, m, {rows, width}};
  const double t = handwritten::run(su, rank, batches(steps + 2, m), steps);
  if (rank == 0) std::printf("result handwritten %.6f m %d\n", t, m);
  return 0;
}

template <class Sched, int M>
using P2 = mpx::Pipeline<mpx::Stage<bench::Stack, mpx::CPU<0>, mpx::Optimizer<mpx::AdamW>>,
                         mpx::Stage<bench::Stack, mpx::CPU<1>, mpx::Optimizer<mpx::AdamW>>, mpx::Schedule<Sched>, mpx::Microbatches<M>>;

template <class Sched, int M>
int pipelined(const std::string& name, int steps, int argc, char** argv, bool overlap = false,
              mpx::SplitBackward split = mpx::SplitBackward::measure, bool libtorch_adamw = false)
{
  using P = P2<Sched, M>;
  if (const int st = mpx::relaunch_self(P::num_slots, argc, argv); st >= 0) return st;
  torch::set_num_threads(1);
  auto env = mpx::read_env();
  auto world = mpx::make_world<P>(env);
  auto make = [](auto stage) {
    torch::manual_seed(decltype(stage)::value);
    return bench::Stack(layers_per_stage, width);
  };
  mpx::TrainOptions o;
  o.lr = mpx::WarmupCosine{1e-4, 0, 1, 1.0};
  o.weight_decay = 0.01;  // LibTorch's and PyTorch's AdamW default, which the other contenders use
  o.skip_nonfinite = !overlap;  // overlap: each rank steps its optimizers while the statistics are all-reduced
  o.split_backward = split;
  if (libtorch_adamw)  // LibTorch's own AdamW, as the hand-written program steps: what mpx's one-pass AdamW saves
    o.make_optimizer = [](int, const std::vector<at::Tensor>& ps) -> std::unique_ptr<torch::optim::Optimizer> {
      return std::make_unique<torch::optim::AdamW>(ps, torch::optim::AdamWOptions(1e-4));
    };
  // warm-up: 2 steps, and under a measured split its trials too (a start-up cost, like the warm-up's)
  const bool measures = std::is_same_v<Sched, mpx::ZBH1> && split == mpx::SplitBackward::measure;
  const int warm = measures ? 2 + 2 * o.split_trials : 2;
  const std::string trace = bench::flags_of(argc, argv).trace;
  o.trace = !trace.empty();
  mpx::Trainer<P, torch::Tensor> trainer(world, make, [](const torch::Tensor& x) { return x; },
                                         [](const torch::Tensor& y, const torch::Tensor&) { return loss(y); }, o);
  const auto data = batches(steps + warm, M);
  return smallwork::run_steps(trainer, world, name, M, warm, steps, [&](int s) { return mpx::slice_microbatches(data[std::size_t(s)], M); }, trace);
}

template <int M>
int pipelined_mode(const std::string& mode, int steps, int argc, char** argv)
{
  if (mode == "gpipe") return pipelined<mpx::GPipe, M>(mode, steps, argc, argv);
  if (mode == "1f1b") return pipelined<mpx::OneFOneB, M>(mode, steps, argc, argv);
  if (mode == "1f1b-overlap") return pipelined<mpx::OneFOneB, M>(mode, steps, argc, argv, true);
  if (mode == "1f1b-torch-adamw")
    return pipelined<mpx::OneFOneB, M>(mode, steps, argc, argv, false, mpx::SplitBackward::measure, true);
  if (mode == "zbh1") return pipelined<mpx::ZBH1, M>(mode, steps, argc, argv);
  if (mode == "zbh1-split") return pipelined<mpx::ZBH1, M>(mode, steps, argc, argv, false, mpx::SplitBackward::always);
  std::fprintf(stderr, "unknown mode %s: whole | accumulate | gpipe | 1f1b | 1f1b-overlap | 1f1b-torch-adamw | zbh1 | zbh1-split | handwritten\n", mode.c_str());
  return 2;
}
}  // namespace

int main(int argc, char** argv)
{
  return smallwork::main_of(
      argc, argv, "whole|accumulate|gpipe|1f1b|1f1b-overlap|1f1b-torch-adamw|zbh1|zbh1-split|handwritten",
      [](const std::string& mode, int m, int steps) {
        if (mode == "whole" || mode == "accumulate") return one_process(mode == "whole", m, steps);
        if (mode == "handwritten") return handwritten_run(m, steps);
        return -1;
      },
      [&](auto M, const std::string& mode, int steps) { return pipelined_mode<decltype(M)::value>(mode, steps, argc, argv); });
}
