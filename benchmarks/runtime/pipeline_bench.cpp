// SPDX-License-Identifier: Apache-2.0
// Runtime benchmark: one training step of a balanced 8-layer model, as
//   single          one rank running the whole model, micro-batch after micro-batch;
//   mpx <schedule>  two CPU ranks, one stage each (interleaved: two chunks each), under mpx::Trainer;
//   dp2-1f1b        2 replicas x 2 stages (4 ranks) under 1F1B: data parallelism's bucket all-reduce, which
//                   starts inside the last backward (--no-overlap: after it; --bucket-mb=X: size).
// One intra-op thread per rank. Prints "result <mode> <median seconds per step>" on rank 0.
//   pipeline_bench single|gpipe|1f1b|zbh1|interleaved|dp2-1f1b [steps] [flags: ../flags.hpp]
#include "../flags.hpp"
#include "model.hpp"

#include <mpx/mpx.hpp>

#include <algorithm>
#include <cstdio>

namespace
{
using namespace bench;
template <class Sched>
using P2 = mpx::Pipeline<mpx::Stage<Stack, mpx::CPU<0>, mpx::Optimizer<mpx::AdamW>>,
                         mpx::Stage<Stack, mpx::CPU<1>, mpx::Optimizer<mpx::AdamW>>, mpx::Schedule<Sched>,
                         mpx::Microbatches<microbatches>>;
using P2x2 = mpx::Pipeline<mpx::Stage<Stack, mpx::CPU<0>>, mpx::Stage<Stack, mpx::CPU<1>>, mpx::Stage<Stack, mpx::CPU<0>>,
                           mpx::Stage<Stack, mpx::CPU<1>>, mpx::Schedule<mpx::Interleaved1F1B>, mpx::Microbatches<microbatches>>;

double median(std::vector<double> v)
{
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int single(int steps)
{
  if (mpx::read_env().keep_host_memory) mpx::keep_host_memory();  // as make_world does in the pipelined modes
  torch::manual_seed(0);
  Stack model(layers_total);
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-4));
  std::vector<double> t;
  const auto data = batches(steps + 2);
  for (int s = 0; s < steps + 2; ++s) {
    const auto t0 = std::chrono::steady_clock::now();
    for (auto& mb : data[std::size_t(s)].chunk(microbatches)) (loss(model->forward(mb), mb) / double(microbatches)).backward();
    opt.step();
    opt.zero_grad();
    if (s >= 2) t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::printf("result single %.6f\n", median(t));
  return 0;
}

template <class P>
int pipelined(const char* name, int steps, int argc, char** argv, int replicas = 1)
{
  if (const int st = mpx::relaunch_self(replicas * P::num_slots, argc, argv); st >= 0) return st;
  torch::set_num_threads(1);
  auto env = mpx::read_env();
  auto world = mpx::make_world<P>(env);
  static constexpr int per_stage = layers_total / P::num_stages;
  auto make = [](auto stage) {
    torch::manual_seed(decltype(stage)::value);
    return Stack(per_stage);
  };
  mpx::TrainOptions o;
  o.lr = mpx::WarmupCosine{1e-4, 0, 1, 1.0};
  const bench::Flags flags = bench::flags_of(argc, argv);
  o.trace = !flags.trace.empty();  // write the last step's Chrome trace there
  if (flags.no_overlap) o.overlap_reduction = false;
  if (flags.bucket_mb > 0) o.bucket_bytes = std::size_t(flags.bucket_mb * (1 << 20));
  mpx::Trainer<P, torch::Tensor> trainer(world, make, [](const torch::Tensor& x) { return x; }, loss, o);
  std::vector<double> t, idle;
  const auto data = batches(steps + 2);
  for (int s = 0; s < steps + 2; ++s) {
    const auto t0 = std::chrono::steady_clock::now();  // the whole call, as the hand-written program times its step
    auto st = trainer.step(mpx::slice_microbatches(data[std::size_t(s)], microbatches));
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s >= 2) t.push_back(wall), idle.push_back(1.0 - st.compute_seconds / st.seconds);
    if (flags.verbose)
      std::printf("rank %d step %d: %.1f ms = schedule %.1f (compute %.1f, waits %.1f) + optimizer %.1f + rest\n", env.rank, s,
                  st.seconds * 1e3, st.schedule_seconds * 1e3, st.compute_seconds * 1e3, st.wait_seconds * 1e3, st.optimizer_seconds * 1e3);
  }
  if (o.trace) trainer.write_trace(flags.trace);
  // the step time of the slowest rank
  auto mx = torch::full({1}, median(t), torch::kDouble);
  std::vector<at::Tensor> v{mx};
  world.world->allreduce(v, {c10d::ReduceOp::MAX})->wait();
  // the measured bubble: each rank's median idle fraction of its steps, averaged over the ranks
  std::vector<at::Tensor> b{torch::full({1}, median(idle) / double(env.world_size), torch::kDouble)};
  world.world->allreduce(b)->wait();
  if (env.rank == 0)
    std::printf("result %s %.6f expected-bubble %.4f measured-bubble %.4f\n", name, mx.item<double>(), trainer.expected_bubble(),
                b[0].item<double>());
  return 0;
}
}  // namespace

int main(int argc, char** argv)
{
  torch::set_num_threads(1);
  const auto args = bench::positional_of(argc, argv);
  const std::string mode = args.size() > 1 ? args[1] : "single";
  const int steps = args.size() > 2 ? std::stoi(args[2]) : 10;
  try {
    if (mode == "single") return single(steps);
    if (mode == "gpipe") return pipelined<P2<mpx::GPipe>>("gpipe", steps, argc, argv);
    if (mode == "1f1b") return pipelined<P2<mpx::OneFOneB>>("1f1b", steps, argc, argv);
    if (mode == "zbh1") return pipelined<P2<mpx::ZBH1>>("zbh1", steps, argc, argv);
    if (mode == "interleaved") return pipelined<P2x2>("interleaved", steps, argc, argv);
    if (mode == "dp2-1f1b") return pipelined<P2<mpx::OneFOneB>>("dp2-1f1b", steps, argc, argv, 2);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  std::fprintf(stderr, "unknown mode %s\n", mode.c_str());
  return 2;
}
