// SPDX-License-Identifier: Apache-2.0
// Memory and precision benchmark: one pipeline stage (4 MLP blocks, dim 1024, hidden 4096, 1024 rows per
// micro-batch), run in its own process per mode so that the peak resident set is the mode's own:
//   plain-k / ckpt-k   forward k micro-batches and keep them (what a rank holds in flight), then backward
//                      them; with mpx::checkpoint around the stage in the ckpt modes
//   optim-adamw / optim-adamw8bit   optimizer state bytes per parameter after one step
//   speed-fp32 / speed-bf16         forward + backward of one micro-batch, without and with bf16 autocast
// Prints "result <mode> <peak MiB over baseline> <seconds> [bytes/param]".
#include <mpx/mpx.hpp>

#include <sys/resource.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>

namespace
{
constexpr int dim = 1024, hidden = 4096, rows = 1024, blocks = 4;

struct BlockImpl : torch::nn::Module
{
  BlockImpl() : fc1(register_module("fc1", torch::nn::Linear(dim, hidden))), fc2(register_module("fc2", torch::nn::Linear(hidden, dim))) {}
  torch::Tensor forward(torch::Tensor x) { return x + fc2(torch::gelu(fc1(x))); }
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Block);

struct StageImpl : torch::nn::Module
{
  StageImpl()
  {
    for (int i = 0; i < blocks; ++i) list->push_back(Block());
    register_module("list", list);
  }
  torch::Tensor forward(torch::Tensor x)
  {
    for (auto& b : *list) {  // blocks marked for per-block checkpointing (plain calls unless it is on)
      auto* blk = b->as<BlockImpl>();
      x = mpx::checkpoint_block(*blk, [blk](const torch::Tensor& t) { return blk->forward(t); }, x);
    }
    return x;
  }
  torch::nn::ModuleList list;
};
TORCH_MODULE(Stage);

double peak_mib()
{
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return double(u.ru_maxrss) / 1024.0;
}
double now()
{
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

int main(int argc, char** argv)
{
  torch::set_num_threads(1);
  const std::string mode = argc > 1 ? argv[1] : "plain-4";
  torch::manual_seed(0);
  Stage stage;
  std::vector<at::Tensor> params = stage->parameters();
  std::vector<at::Tensor> inputs;
  for (int i = 0; i < 8; ++i) inputs.push_back(torch::randn({rows, dim}).requires_grad_(true));
  // warm the allocator and the parameters' gradients so the baseline includes them
  stage(inputs[0]).sum().backward();
  for (auto& x : inputs) x.mutable_grad() = at::Tensor();
  const double base = peak_mib();

  if (mode.rfind("plain-", 0) == 0 || mode.rfind("ckpt-", 0) == 0 || mode.rfind("blocks-", 0) == 0) {
    const bool ckpt = mode[0] == 'c';
    mpx::BlockCheckpointing per_block(mode[0] == 'b');  // blocks-k: each block keeps only its input
    const int k = std::stoi(mode.substr(mode.find('-') + 1));
    auto fn = [&](const std::vector<at::Tensor>& in) { return std::vector<at::Tensor>{stage(in[0])}; };
    const double t0 = now();
    std::vector<at::Tensor> outs;
    for (int i = 0; i < k; ++i) outs.push_back(ckpt ? mpx::checkpoint(fn, {inputs[std::size_t(i)]}, params)[0] : stage(inputs[std::size_t(i)]));
    for (auto& y : outs) {
      y.pow(2).mean().backward();
      y = at::Tensor();
    }
    std::printf("result %s %.0f %.3f\n", mode.c_str(), peak_mib() - base, now() - t0);
  } else if (mode == "optim-adamw" || mode == "optim-adamw8bit") {
    std::unique_ptr<torch::optim::Optimizer> opt;
    if (mode == "optim-adamw") opt = std::make_unique<torch::optim::AdamW>(params, torch::optim::AdamWOptions(1e-3));
    else opt = std::make_unique<mpx::AdamW8bitOptimizer>(params, torch::optim::AdamWOptions(1e-3));
    stage(inputs[0]).sum().backward();
    opt->step();
    std::size_t bytes = 0, n = 0;
    for (auto& p : params) n += std::size_t(p.numel());
    if (auto* q = dynamic_cast<mpx::AdamW8bitOptimizer*>(opt.get())) {
      bytes = q->state_bytes();
    } else {
      for (auto& [key, st] : opt->state()) {
        auto& s = static_cast<torch::optim::AdamWParamState&>(*st);
        bytes += std::size_t(s.exp_avg().numel() * s.exp_avg().element_size() + s.exp_avg_sq().numel() * s.exp_avg_sq().element_size());
      }
    }
    std::printf("result %s %.0f 0 %.3f\n", mode.c_str(), peak_mib() - base, double(bytes) / double(n));
  } else if (mode == "speed-fp32" || mode == "speed-bf16") {
    const bool bf16 = mode == "speed-bf16";
    double best = 1e9;
    for (int r = 0; r < 3; ++r) {
      const double t0 = now();
      at::Tensor y;
      {
        std::optional<mpx::AutocastGuard> g;
        if (bf16) g.emplace(c10::DeviceType::CPU, true, at::kBFloat16);
        y = stage(inputs[0]);
      }
      y.to(torch::kFloat).pow(2).mean().backward();
      best = std::min(best, now() - t0);
    }
    std::printf("result %s %.0f %.3f\n", mode.c_str(), peak_mib() - base, best);
  } else {
    std::fprintf(stderr, "unknown mode %s\n", mode.c_str());
    return 2;
  }
  return 0;
}
