// SPDX-License-Identifier: Apache-2.0
// Text fine-tuning throughput of one device: moondream's text decoder (a shipped config, md2 on a GPU)
// trains on image-prefixed sequences as the frozen-vision fine-tune feeds it (random image embeddings
// in place of the vision encoder's, random answer tokens), AdamW on fp32 master weights, the forward
// under bf16 autocast. Reports tokens per second (every position the decoder runs: BOS, image tokens,
// answer tokens) and model FLOPs utilisation against the device's peak (--peak-tflops):
//   model FLOPs per step = 3 x forward; forward = 2 x (block weights) per position + attention's two
//   (T x T x dim) matmuls per layer + the head's 2 x dim x vocab per supervised position.
// One JSON line per run on stdout (scripts/gpu_bench.sh collects them).
//   usage: text_throughput --config md2 --device cuda --batch 4 --answer-tokens 128 --steps 20 --peak-tflops 989
#include "../../examples/moondream/model.hpp"

#include <CLI/CLI.hpp>
#include <mpx/runtime/precision.hpp>  // mpx::AutocastGuard
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <optional>

namespace
{
struct Options
{
  std::string config = "tiny", device = "cpu", precision = "bf16";
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

int run(const Options& o)
{
  const moondream::Config c = moondream::load_config(o.config);
  const torch::Device dev(o.device);
  const int64_t B = o.batch, P = c.prefix() - 1, L = o.answer_tokens, T = c.prefix() + L;
  if (T > c.text.max_context)
    throw mpx::config_error("text_throughput: " + std::to_string(T) + " positions exceed the config's max_context " + std::to_string(c.text.max_context) +
                            "; lower --answer-tokens");
  torch::manual_seed(1);
  moondream::Text text(c);
  text->to(dev);
  std::vector<torch::Tensor> params;
  for (auto& p : text->parameters()) params.push_back(p);
  torch::optim::AdamW opt(params, torch::optim::AdamWOptions(1e-5).weight_decay(0.0));
  const auto img = torch::randn({B, P, int64_t(c.text.dim)}, torch::TensorOptions().device(dev)) * 0.02;  // the frozen vision's output
  moondream::Batch b;
  b.tokens = torch::randint(0, c.text.vocab_size, {B, L}, torch::TensorOptions().dtype(torch::kLong).device(dev));
  b.targets = b.tokens.clone();
  const c10::DeviceType kind = dev.is_cuda() ? c10::DeviceType::CUDA : c10::DeviceType::CPU;

  auto step = [&] {
    for (auto& p : params) p.mutable_grad() = at::Tensor();  // set to none (1.13's zero_grad fills zeros)
    torch::Tensor loss;
    {
      std::optional<mpx::AutocastGuard> autocast;
      if (o.precision == "bf16") autocast.emplace(kind, true, at::kBFloat16);
      loss = moondream::answer_loss(text->forward(img, b), b);
    }
    loss.backward();
    opt.step();
    return loss.item<double>();  // waits for the device
  };
  for (int i = 0; i < o.warmup; ++i) step();
  const auto t0 = std::chrono::steady_clock::now();
  double loss = 0;
  for (int i = 0; i < o.steps; ++i) loss = step();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / o.steps;

  const double tokens_s = double(B * T) / secs, tflops = step_flops(c, B, T, L) / secs / 1e12;
  int64_t n = 0;
  for (auto& p : params) n += p.numel();
  std::printf("{\"bench\": \"text_throughput\", \"config\": \"%s\", \"device\": \"%s\", \"precision\": \"%s\", \"params\": %lld, "
              "\"batch\": %lld, \"positions\": %lld, \"answer_tokens\": %lld, \"steps\": %d, \"step_s\": %.5f, \"tokens_per_s\": %.1f, "
              "\"model_tflops\": %.3f, \"peak_tflops\": %.1f, \"mfu\": %s, \"loss\": %.5f}\n",
              c.name.c_str(), o.device.c_str(), o.precision.c_str(), (long long)n, (long long)B, (long long)T, (long long)L, o.steps, secs, tokens_s,
              tflops, o.peak_tflops, o.peak_tflops > 0 ? std::to_string(tflops / o.peak_tflops).c_str() : "null", loss);
  return std::isfinite(loss) ? 0 : 1;
}
}  // namespace

int main(int argc, char** argv)
{
  Options o;
  CLI::App app{"moondream text fine-tuning throughput on one device (tokens/s, model FLOPs utilisation)"};
  app.add_option("--config", o.config, "tiny | medium | md05 | md2 | path.json")->capture_default_str();
  app.add_option("--device", o.device, "cpu | cuda | cuda:N")->capture_default_str();
  app.add_option("--precision", o.precision, "bf16 (autocast) | fp32")->check(CLI::IsMember({"fp32", "bf16"}))->capture_default_str();
  app.add_option("--batch", o.batch, "samples per step")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--answer-tokens", o.answer_tokens, "supervised tokens after the image prefix")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--steps", o.steps, "timed steps")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--warmup", o.warmup, "untimed steps first")->check(CLI::NonNegativeNumber)->capture_default_str();
  app.add_option("--peak-tflops", o.peak_tflops, "the device's dense peak at this precision (H100/H200 SXM bf16: 989); 0: unknown")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  try {
    return run(o);
  } catch (const std::exception& e) {
    std::cerr << "text_throughput: " << e.what() << "\n";
    return 2;
  }
}
