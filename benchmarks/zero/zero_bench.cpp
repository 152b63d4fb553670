// SPDX-License-Identifier: Apache-2.0
// Sharded data parallelism (ZeRO, TrainOptions::sharding / mpx::Sharded<L>): d replicas x 2 stages of the
// runtime benchmark's model (benchmarks/runtime/model.hpp: 4 Linear 1024x1024 layers per stage, 4.2 M
// parameters), trained under 1F1B with clipping. Every rank measures, with the allocator's statistics
// (mpx's host cache for large tensors, malloc's for the rest):
//   params  bytes that building the trainer added (the stage's parameters; level 3: what it keeps of them between steps)
//   grads   bytes in use at the optimizer's entry, less those after the step returned (the gradients
//           dropped), the median over the steps after the first: what a step holds as gradients when the
//           optimizer runs (level 2: only the shard's)
//   state   bytes the optimizer's first step added (its moments)
//   peak    the peak resident set of the process (getrusage), libraries included
// run.sh measures bytes with mpx's host cache off (MPX_KEEP_HOST_MEMORY=0: every tensor from malloc, whose
// statistics count what was asked, page-rounded; the cache rounds a block up to its size class, up to 12.5%)
// and times steps with it on, as a run has it.
//   sent    bytes this process wrote to sockets per step (/proc/self/io wchar; the pipeline's messages go
//           through shared memory, so this is the data-parallel collectives'), median of the timed steps
//   step    median seconds per step, the slowest rank's
// Prints "result <d> <level> <optimizer> <rank> <N> <params> <grads> <state> <peak> <sent> <step>" per rank.
//   zero_bench <replicas> <level 0|1|2|3> <adamw|adamw8bit> [steps]
#include "../flags.hpp"
#include "../runtime/model.hpp"

#include <mpx/mpx.hpp>

#include <malloc.h>        // mallinfo2
#include <sys/resource.h>  // getrusage

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>

namespace
{
using namespace bench;
constexpr int layers_per_stage = 4;
using P = mpx::Pipeline<mpx::Stage<Stack, mpx::CPU<0>>, mpx::Stage<Stack, mpx::CPU<1>>, mpx::Schedule<mpx::OneFOneB>, mpx::Microbatches<microbatches>>;

std::int64_t in_use()
{
  const struct mallinfo2 mi = ::mallinfo2();
  return std::int64_t(mi.uordblks + mi.hblkhd + mpx::host_memory_stats().live_bytes);
}
std::int64_t written()
{
  std::ifstream io("/proc/self/io");
  std::string key;
  std::int64_t v = 0;
  while (io >> key >> v)
    if (key == "wchar:") return v;
  return 0;
}
double median(std::vector<double> v)
{
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

/// The optimizer mpx would build, with the bytes in use at each step's entry and exit.
template <class Base>
struct Measured : Base
{
  using Base::Base;
  at::Tensor step(torch::optim::Optimizer::LossClosure c = nullptr) override
  {
    entry.push_back(in_use());
    auto r = Base::step(c);
    exit.push_back(in_use());
    return r;
  }
  std::vector<std::int64_t> entry, exit;
};
}  // namespace

int main(int argc, char** argv)
{
  const auto args = bench::positional_of(argc, argv);
  if (args.size() < 4) {
    std::fprintf(stderr, "usage: zero_bench <replicas> <level 0|1|2|3> <adamw|adamw8bit> [steps]\n");
    return 2;
  }
  const int replicas = std::stoi(args[1]), level = std::stoi(args[2]);
  const std::string optimizer = args[3];
  const int steps = args.size() > 4 ? std::stoi(args[4]) : 8;
  if (const int st = mpx::relaunch_self(replicas * P::num_slots, argc, argv); st >= 0) return st;
  try {
    torch::set_num_threads(1);
    auto env = mpx::read_env();
    auto world = mpx::make_world<P>(env);
    mpx::TrainOptions o;
    o.lr = mpx::WarmupCosine{1e-4, 0, 1, 1.0};
    o.clip_norm = 1.0;
    o.sharding = level;
    std::int64_t n = 0;
    std::function<std::vector<std::int64_t>()> entries, exits;
    o.make_optimizer = [&](int, const std::vector<at::Tensor>& params) -> std::unique_ptr<torch::optim::Optimizer> {
      const auto adamw = torch::optim::AdamWOptions(1e-4);
      if (optimizer == "adamw8bit") {
        auto m = std::make_unique<Measured<mpx::AdamW8bitOptimizer>>(params, adamw);
        entries = [p = m.get()] { return p->entry; }, exits = [p = m.get()] { return p->exit; };
        return m;
      }
      auto m = std::make_unique<Measured<mpx::FusedAdamW>>(params, adamw);
      entries = [p = m.get()] { return p->entry; }, exits = [p = m.get()] { return p->exit; };
      return m;
    };
    auto make = [&](auto stage) {
      torch::manual_seed(decltype(stage)::value);
      Stack s(layers_per_stage);
      for (auto& p : s->parameters()) n += p.numel();
      return s;
    };
    const std::int64_t before_build = in_use();
    mpx::Trainer<P, torch::Tensor> trainer(world, make, [](const torch::Tensor& x) { return x; }, loss, o);
    const std::int64_t params = in_use() - before_build;
    const auto data = batches(steps + 2);
    std::vector<std::int64_t> after_step;
    std::vector<double> t, sent;
    for (int s = 0; s < steps + 2; ++s) {
      const auto w0 = written();
      const auto t0 = std::chrono::steady_clock::now();
      trainer.step(mpx::slice_microbatches(data[std::size_t(s)], microbatches));
      after_step.push_back(in_use());
      if (s >= 2) t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()), sent.push_back(double(written() - w0));
    }
    const auto in = entries(), out = exits();
    std::vector<double> held;  // per step after the first: what the optimizer's entry held beyond the step's end (a
                               // collective's buffers may still be on their way back at one step's end: the median)
    for (std::size_t k = 1; k < in.size(); ++k) held.push_back(double(in[k] - after_step[k]));
    const auto grads = std::int64_t(median(held)), state = out.at(0) - in.at(0);
    rusage u{};
    getrusage(RUSAGE_SELF, &u);
    auto mx = torch::full({1}, median(t), torch::kDouble);
    std::vector<at::Tensor> v{mx};
    world.world->allreduce(v, {c10d::ReduceOp::MAX})->wait();
    std::printf("result %d %d %s %d %lld %lld %lld %lld %lld %.0f %.6f\n", replicas, level, optimizer.c_str(), env.rank, (long long)n,
                (long long)params, (long long)grads, (long long)state, (long long)u.ru_maxrss * 1024, median(sent),
                mx.item<double>());
    std::fflush(stdout);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
