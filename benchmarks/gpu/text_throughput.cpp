// SPDX-License-Identifier: Apache-2.0
// Text fine-tuning throughput of one device: moondream's text decoder (a shipped config, md2 on a GPU)
// trains on image-prefixed sequences as the frozen-vision fine-tune feeds it (random image embeddings
// in place of the vision encoder's, random answer tokens), on fp32 master weights, the forward under bf16
// autocast. Two programs of the same model and data: `--loop plain`, a hand-written LibTorch loop with
// LibTorch's AdamW (the strongest honest baseline), and `--loop mpx`, the decoder as a one-stage mpx
// pipeline under mpx::Trainer (AdamW, or 8-bit AdamW with --optimizer adamw8bit; --checkpoint-blocks
// recomputes each block in the backward). Reports tokens per second (every position the decoder runs:
// BOS, image tokens, answer tokens) and model FLOPs utilisation against the device's peak (--peak-tflops):
//   model FLOPs per step = 3 x forward; forward = 2 x (block weights) per position + attention's two
//   (T x T x dim) matmuls per layer + the head's 2 x dim x vocab per supervised position
// (a recomputed forward is not counted: MFU is useful work).
// One JSON line per run on stdout (scripts/gpu_bench.sh collects them).
//   usage: text_throughput --config md2 --device cuda --batch 4 --answer-tokens 128 --steps 20 --peak-tflops 989 [--loop mpx]
#include "../../examples/moondream/model.hpp"

#include <CLI/CLI.hpp>
#include <mpx/mpx.hpp>  // mpx::Trainer, mpx::AutocastGuard
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <optional>

namespace
{
struct Options
{
  std::string config = "tiny", device = "cpu", precision = "bf16", loop = "plain", optimizer = "adamw";
  bool checkpoint_blocks = false;
  int batch = 2, answer_tokens = 32, steps = 5, warmup = 2;
  double peak_tflops = 0;  // 0: unknown, no utilisation
};

/// Model FLOPs of one training step (forward, and backward at twice the forward).
double step_flops(const moondream::Config& c, int64_t B, int64_t T, int64_t answer)
{
  const auto& t = c.text;
  const double d = t.dim, blocks = t.n_layers * (d * t.qkv_dim() + d * d + 2 * d * t.ff_dim);  // qkv, out, fc1, fc2
  const double forward = 2 * blocks * B * T + t.n_layers * 4.0 * B * T * T * d + 2 * d * t.vocab_size * B * answer;
  return 3 * forward;
}

/// The decoder as a one-stage mpx pipeline (the device is the rank's: cuda:0 on a GPU machine).
template <class Optimizer>
using OneStage = mpx::Pipeline<mpx::Stage<moondream::Text, mpx::GPU<0>, mpx::Optimizer<Optimizer>, mpx::Reads<"tokens">>,
                               mpx::Batch<moondream::Batch>, mpx::Microbatches<1>>;

/// What both loops train on.
struct Work
{
  moondream::Config c;
  torch::Device dev{torch::kCPU};
  int64_t B = 0, T = 0, L = 0;
  torch::Tensor img;  ///< the frozen vision's output (B, P, dim)
  moondream::Batch b;
};

Work make_work(const Options& o)
{
  Work w;
  w.c = moondream::load_config(o.config);
  w.dev = torch::Device(o.device);
  const int64_t P = w.c.prefix() - 1;
  w.B = o.batch, w.L = o.answer_tokens, w.T = w.c.prefix() + w.L;
  if (w.T > w.c.text.max_context)
    throw mpx::config_error("text_throughput: " + std::to_string(w.T) + " positions exceed the config's max_context " +
                            std::to_string(w.c.text.max_context) + "; lower --answer-tokens");
  torch::manual_seed(2);
  w.img = torch::randn({w.B, P, int64_t(w.c.text.dim)}, torch::TensorOptions().device(w.dev)) * 0.02;
  w.b.tokens = torch::randint(0, w.c.text.vocab_size, {w.B, w.L}, torch::TensorOptions().dtype(torch::kLong).device(w.dev));
  w.b.targets = w.b.tokens.clone();
  return w;
}

/// Times `step` (a function returning the step's loss, after the device is done) and prints the JSON line.
template <class Step>
int report(const Options& o, const Work& w, int64_t params, Step&& step)
{
  for (int i = 0; i < o.warmup; ++i) step();
  const auto t0 = std::chrono::steady_clock::now();
  double loss = 0;
  for (int i = 0; i < o.steps; ++i) loss = step();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / o.steps;
  const double tokens_s = double(w.B * w.T) / secs, tflops = step_flops(w.c, w.B, w.T, w.L) / secs / 1e12;
  std::printf("{\"bench\": \"text_throughput\", \"loop\": \"%s\", \"optimizer\": \"%s\", \"checkpoint_blocks\": %s, \"config\": \"%s\", "
              "\"device\": \"%s\", \"precision\": \"%s\", \"params\": %lld, \"batch\": %lld, \"positions\": %lld, \"answer_tokens\": %lld, "
              "\"steps\": %d, \"step_s\": %.5f, \"tokens_per_s\": %.1f, \"model_tflops\": %.3f, \"peak_tflops\": %.1f, \"mfu\": %s, "
              "\"loss\": %.5f}\n",
              o.loop.c_str(), o.optimizer.c_str(), o.checkpoint_blocks ? "true" : "false", w.c.name.c_str(), o.device.c_str(), o.precision.c_str(),
              (long long)params, (long long)w.B, (long long)w.T, (long long)w.L, o.steps, secs, tokens_s, tflops, o.peak_tflops,
              o.peak_tflops > 0 ? std::to_string(tflops / o.peak_tflops).c_str() : "null", loss);
  return std::isfinite(loss) ? 0 : 1;
}

int64_t count(const std::vector<torch::Tensor>& ps)
{
  int64_t n = 0;
  for (auto& p : ps) n += p.numel();
  return n;
}

int run_plain(const Options& o)
{
  const Work w = make_work(o);
  torch::manual_seed(1);
  moondream::Text text(w.c);
  text->to(w.dev);
  std::vector<torch::Tensor> params;
  for (auto& p : text->parameters()) params.push_back(p);
  torch::optim::AdamW opt(params, torch::optim::AdamWOptions(1e-5).weight_decay(0.0));
  const c10::DeviceType kind = w.dev.is_cuda() ? c10::DeviceType::CUDA : c10::DeviceType::CPU;
  return report(o, w, count(params), [&] {
    for (auto& p : params) p.mutable_grad() = at::Tensor();  // set to none (1.13's zero_grad fills zeros)
    torch::Tensor loss;
    {
      std::optional<mpx::AutocastGuard> autocast;
      if (o.precision == "bf16") autocast.emplace(kind, true, at::kBFloat16);
      loss = moondream::answer_loss(text->forward(w.img, w.b), w.b);
    }
    loss.backward();
    opt.step();
    return loss.item<double>();  // waits for the device
  });
}

template <class P>
int run_mpx(const Options& o)
{
  const Work w = make_work(o);
  mpx::WorldOptions wo;
  wo.allow_cpu = !w.dev.is_cuda();  // the dry run: GPU<0> on CPU
  auto world = mpx::make_world<P>(mpx::read_env(), wo);
  if (world.device != w.dev)
    throw mpx::config_error("text_throughput --loop mpx: the rank computes on " + world.device.str() + ", not --device " + o.device +
                            " (a GPU<0> stage runs on CUDA device LOCAL_RANK, or on CPU without CUDA)");
  mpx::TrainOptions to;
  to.lr = mpx::WarmupCosine{1e-5, 0, 1, 1.0};
  to.weight_decay = 0.0;
  to.skip_nonfinite = false;  // plain LibTorch's loop neither checks nor agrees
  to.checkpoint_blocks = o.checkpoint_blocks;
  if (o.precision == "bf16") to.autocast = at::kBFloat16;
  auto make = [&](auto) {
    torch::manual_seed(1);
    return moondream::Text(w.c);
  };
  const torch::Tensor img = w.img;
  mpx::Trainer<P, moondream::Batch> trainer(world, make, [img](const moondream::Batch&) { return img; }, moondream::answer_loss, to);
  const std::vector<moondream::Batch> mbs{w.b};
  return report(o, w, count(trainer.template module<0>()->parameters()), [&] { return trainer.step(mbs).loss; });
}

int run(const Options& o)
{
  if (o.loop == "plain") return run_plain(o);
  if (o.optimizer == "adamw8bit") return run_mpx<OneStage<mpx::AdamW8bit>>(o);
  return run_mpx<OneStage<mpx::AdamW>>(o);
}
}  // namespace

int main(int argc, char** argv)
{
  Options o;
  CLI::App app{"moondream text fine-tuning throughput on one device (tokens/s, model FLOPs utilisation)"};
  app.add_option("--config", o.config, "tiny | medium | md05 | md2 | path.json")->capture_default_str();
  app.add_option("--device", o.device, "cpu | cuda | cuda:N")->capture_default_str();
  app.add_option("--precision", o.precision, "bf16 (autocast) | fp32")->check(CLI::IsMember({"fp32", "bf16"}))->capture_default_str();
  app.add_option("--loop", o.loop, "plain (a LibTorch loop) | mpx (a one-stage mpx pipeline)")->check(CLI::IsMember({"plain", "mpx"}))->capture_default_str();
  app.add_option("--optimizer", o.optimizer, "adamw | adamw8bit (mpx only)")->check(CLI::IsMember({"adamw", "adamw8bit"}))->capture_default_str();
  app.add_flag("--checkpoint-blocks", o.checkpoint_blocks, "recompute each block in the backward (mpx only)");
  app.add_option("--batch", o.batch, "samples per step")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--answer-tokens", o.answer_tokens, "supervised tokens after the image prefix")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--steps", o.steps, "timed steps")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--warmup", o.warmup, "untimed steps first")->check(CLI::NonNegativeNumber)->capture_default_str();
  app.add_option("--peak-tflops", o.peak_tflops, "the device's dense peak at this precision (H100/H200 SXM bf16: 989); 0: unknown")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  if (o.loop == "plain" && (o.optimizer != "adamw" || o.checkpoint_blocks)) {
    std::cerr << "text_throughput: --optimizer adamw8bit and --checkpoint-blocks are the mpx loop's (--loop mpx)\n";
    return 2;
  }
  try {
    return run(o);
  } catch (const std::exception& e) {
    std::cerr << "text_throughput: " << e.what() << "\n";
    return 2;
  }
}
