// SPDX-License-Identifier: Apache-2.0
// The compile-time floor of a downstream TU (benchmarks/compile_time/downstream.sh): hello_pipeline's model,
// optimizers and training loop in plain single-process LibTorch, no mpx. What a TU with a model costs
// before any framework adds to it.
#include <torch/torch.h>
#include <cstdio>
struct EncoderImpl : torch::nn::Module {
  EncoderImpl() : fc1(register_module("fc1", torch::nn::Linear(16, 64))), fc2(register_module("fc2", torch::nn::Linear(64, 64))) {}
  torch::Tensor forward(torch::Tensor x) { return torch::gelu(fc2(torch::gelu(fc1(x)))); }
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Encoder);
struct HeadImpl : torch::nn::Module {
  HeadImpl() : fc1(register_module("fc1", torch::nn::Linear(64, 64))), fc2(register_module("fc2", torch::nn::Linear(64, 4))) {}
  torch::Tensor forward(torch::Tensor h) { return fc2(torch::gelu(fc1(h))); }
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Head);
int main(int argc, char**) {
  Encoder e; Head h;
  torch::optim::AdamW o1(e->parameters(), torch::optim::AdamWOptions(1e-2)), o2(h->parameters(), torch::optim::AdamWOptions(1e-2));
  for (int s = 0; s < 60; ++s) {
    auto g = at::make_generator<at::CPUGeneratorImpl>(s);
    auto x = torch::randn({64, 16}, g);
    auto y = (x.narrow(1, 0, 1).squeeze(1) > 0).to(torch::kLong);
    auto loss = torch::nn::functional::cross_entropy(h(e(x)), y);
    o1.zero_grad(); o2.zero_grad(); loss.backward();
    torch::nn::utils::clip_grad_norm_(e->parameters(), 1.0);
    o1.step(); o2.step();
    std::printf("%f\n", loss.item<double>());
  }
}
