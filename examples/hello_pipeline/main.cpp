// SPDX-License-Identifier: Apache-2.0
// hello_pipeline: a two-stage model declared as one mpx::Pipeline type, printed with its schedule.
#include <mpx/mpx.hpp>

#include <torch/torch.h>

#include <iostream>

struct EncoderImpl : torch::nn::Module
{
  EncoderImpl() : fc(register_module("fc", torch::nn::Linear(16, 32))) {}
  torch::Tensor forward(torch::Tensor x) { return torch::gelu(fc(x)); }
  torch::nn::Linear fc;
};
TORCH_MODULE(Encoder);

struct HeadImpl : torch::nn::Module
{
  HeadImpl() : fc(register_module("fc", torch::nn::Linear(32, 4))) {}
  torch::Tensor forward(torch::Tensor h) { return fc(h); }
  torch::nn::Linear fc;
};
TORCH_MODULE(Head);

using Model = mpx::Pipeline<mpx::Stage<Encoder, mpx::CPU<0>, mpx::Optimizer<mpx::AdamW>>,
                            mpx::Stage<Head, mpx::CPU<1>, mpx::Optimizer<mpx::AdamW>>,
                            mpx::Schedule<mpx::OneFOneB>, mpx::Microbatches<4>>;

int main()
{
  std::cout << "hello_pipeline: CPU ranks (this example opts into CPU)\n";
  mpx::check_blas();
  std::cout << mpx::print<Model>;
  Encoder enc;
  Head head;
  const auto y = head(enc(torch::randn({8, 16})));
  std::cout << "forward through both stages: " << y.sizes() << "\n";
  std::cout << "hello_pipeline: ok\n";
}
