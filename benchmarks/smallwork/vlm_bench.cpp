// SPDX-License-Identifier: Apache-2.0
// Small-work benchmark, the model: a 2-stage moondream-architecture model (examples/moondream,
// vision | text) small enough that a step takes a few tens of milliseconds on these CPUs — vision of 2 ViT
// layers of width 64 over 5 crops of 56 px (a global crop and 2 x 2 local ones, 16 patches each), text of
// 2 layers of width 128, vocabulary 512, 41 positions (BOS, 16 image tokens, 24 tokens of which the last 12
// are supervised); AdamW (mpx::FusedAdamW everywhere: the one-process runs step the same one-pass AdamW that
// mpx's stages do), micro-batches of 2 samples, m per step:
//   whole        one process, the whole batch of m micro-batches in one forward and backward
//   accumulate   one process, m micro-batches, gradients accumulated
//   gpipe | 1f1b | zbh1 | zbh1-split | 1f1b-overlap   mpx::Trainer on two CPU ranks (vision | text), as in
//                smallwork_bench.cpp
// One intra-op thread per rank. The output lines are smallwork_bench's ("result", "detail", "split"), so
// run.sh and report.py read both (MODEL=vlm benchmarks/smallwork/run.sh).
//   smallwork_vlm_bench MODE M [steps]
#include "../../examples/moondream/model.hpp"  // moondream::Vision, Text, Moondream, Batch, answer_loss

#include "steps.hpp"  // smallwork::run_steps, median

#include <mpx/mpx.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

namespace
{
constexpr int samples_per_microbatch = 2, tokens = 24, rows = 2, cols = 2;

moondream::Config config()
{
  moondream::Config c;
  c.name = "smallwork";
  auto& v = c.vision;
  v.enc_dim = 64, v.enc_patch_size = 14, v.enc_n_layers = 2, v.enc_ff_dim = 128, v.enc_n_heads = 2;
  v.proj_out_dim = 128, v.crop_size = 56, v.in_channels = 3, v.max_crops = 1 + rows * cols, v.overlap_margin = 1, v.proj_inner_dim = 256;
  auto& t = c.text;
  t.dim = 128, t.ff_dim = 512, t.n_layers = 2, t.vocab_size = 512, t.max_context = 64, t.n_heads = 2, t.n_kv_heads = 2, t.rot_dim = 32;
  c.tokenizer.bos_id = c.tokenizer.eos_id = 511;
  return c;
}

/// One micro-batch: every sample tiled 2 x 2, random crops and tokens, the second half of the tokens supervised.
moondream::Batch microbatch(const moondream::Config& c)
{
  const int B = samples_per_microbatch, S = c.vision.crop_size;
  auto toks = torch::randint(0, c.text.vocab_size - 1, {B, tokens}, torch::kLong);
  auto targets = toks.clone();
  targets.narrow(1, 0, tokens / 2).fill_(moondream::ignore_index);
  return {torch::rand({B, 1 + rows * cols, 3, S, S}) * 2 - 1, torch::full({B, 2}, 2, torch::kLong), toks, targets};
}
/// steps x m micro-batches, the same for every contender.
std::vector<std::vector<moondream::Batch>> data(const moondream::Config& c, int steps, int m)
{
  torch::manual_seed(1234);
  std::vector<std::vector<moondream::Batch>> out(static_cast<std::size_t>(steps));
  for (auto& s : out)
    for (int k = 0; k < m; ++k) s.push_back(microbatch(c));
  return out;
}
/// The micro-batches of a step as one batch.
moondream::Batch whole_batch(const std::vector<moondream::Batch>& mbs)
{
  auto cat = [&](auto field) {
    std::vector<torch::Tensor> parts;
    for (const auto& b : mbs) parts.push_back(b.*field);
    return torch::cat(parts);
  };
  return {cat(&moondream::Batch::crops), cat(&moondream::Batch::tiling), cat(&moondream::Batch::tokens), cat(&moondream::Batch::targets)};
}


int one_process(bool whole, int m, int steps)
{
  if (mpx::read_env().keep_host_memory) mpx::keep_host_memory();  // as make_world does in the pipelined modes
  const auto c = config();
  torch::manual_seed(0);
  moondream::Moondream model(c);
  mpx::FusedAdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-4));
  const auto batches = data(c, steps + 2, m);
  std::vector<moondream::Batch> wholes;
  for (const auto& s : batches) wholes.push_back(whole_batch(s));
  std::vector<double> t;
  for (int s = 0; s < steps + 2; ++s) {
    const auto t0 = std::chrono::steady_clock::now();
    if (whole) {
      const auto& b = wholes[std::size_t(s)];
      moondream::answer_loss(model->forward(b), b).backward();
    } else
      for (const auto& b : batches[std::size_t(s)]) (moondream::answer_loss(model->forward(b), b) / double(m)).backward();
    opt.step();
    opt.zero_grad();
    if (s >= 2) t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::printf("result %s %.6f m %d\n", whole ? "whole" : "accumulate", smallwork::median(t), m);
  return 0;
}

template <class Sched, int M>
using P2 = mpx::Pipeline<mpx::Stage<moondream::Vision, mpx::CPU<0>, mpx::Optimizer<mpx::AdamW>>,
                         mpx::Stage<moondream::Text, mpx::CPU<1>, mpx::Optimizer<mpx::AdamW>, mpx::Reads<"tokens">>,
                         mpx::Batch<moondream::Batch>, mpx::Schedule<Sched>, mpx::Microbatches<M>>;

template <class Sched, int M>
int pipelined(const std::string& name, int steps, int argc, char** argv, bool overlap = false,
              mpx::SplitBackward split = mpx::SplitBackward::measure)
{
  using P = P2<Sched, M>;
  if (const int st = mpx::relaunch_self(P::num_slots, argc, argv); st >= 0) return st;
  torch::set_num_threads(1);
  const auto c = config();
  auto env = mpx::read_env();
  auto world = mpx::make_world<P>(env);
  auto make = [&c](auto stage) {
    constexpr int I = decltype(stage)::value;
    torch::manual_seed(I);
    if constexpr (I == 0) return moondream::Vision(c);
    else return moondream::Text(c);
  };
  mpx::TrainOptions o;
  o.lr = mpx::WarmupCosine{1e-4, 0, 1, 1.0};
  o.weight_decay = 0.01;  // LibTorch's AdamW default, which the one-process runs use
  o.skip_nonfinite = !overlap;
  o.split_backward = split;
  const bool measures = std::is_same_v<Sched, mpx::ZBH1> && split == mpx::SplitBackward::measure;
  const int warm = measures ? 2 + 2 * o.split_trials : 2;
  const std::string trace = bench::flags_of(argc, argv).trace;
  o.trace = !trace.empty();
  mpx::Trainer<P, moondream::Batch> trainer(world, make, [](const moondream::Batch& b) { return b.crops; }, moondream::answer_loss, o);
  const auto batches = data(c, steps + warm, M);
  return smallwork::run_steps(trainer, world, name, M, warm, steps, [&](int s) { return batches[std::size_t(s)]; }, trace);
}

template <int M>
int pipelined_mode(const std::string& mode, int steps, int argc, char** argv)
{
  if (mode == "gpipe") return pipelined<mpx::GPipe, M>(mode, steps, argc, argv);
  if (mode == "1f1b") return pipelined<mpx::OneFOneB, M>(mode, steps, argc, argv);
  if (mode == "1f1b-overlap") return pipelined<mpx::OneFOneB, M>(mode, steps, argc, argv, true);
  if (mode == "zbh1") return pipelined<mpx::ZBH1, M>(mode, steps, argc, argv);
  if (mode == "zbh1-split") return pipelined<mpx::ZBH1, M>(mode, steps, argc, argv, false, mpx::SplitBackward::always);
  std::fprintf(stderr, "unknown mode %s: whole | accumulate | gpipe | 1f1b | 1f1b-overlap | zbh1 | zbh1-split\n", mode.c_str());
  return 2;
}
}  // namespace

int main(int argc, char** argv)
{
  return smallwork::main_of(
      argc, argv, "whole|accumulate|gpipe|1f1b|1f1b-overlap|zbh1|zbh1-split",
      [](const std::string& mode, int m, int steps) { return mode == "whole" || mode == "accumulate" ? one_process(mode == "whole", m, steps) : -1; },
      [&](auto M, const std::string& mode, int steps) { return pipelined_mode<decltype(M)::value>(mode, steps, argc, argv); });
}
