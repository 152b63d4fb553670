// SPDX-License-Identifier: Apache-2.0
#pragma once
// The benchmark model: a stack of Linear + GELU layers of equal cost, so pipeline stages are balanced.
#include <mpx/runtime/activation_checkpoint.hpp>  // mpx::checkpoint_block
#include <torch/torch.h>

namespace bench
{
constexpr int dim = 1024;           // hidden size
constexpr int layers_total = 8;     // layers of the whole model
constexpr int rows_per_mb = 64;     // rows of one micro-batch
constexpr int microbatches = 8;

struct StackImpl : torch::nn::Module
{
  explicit StackImpl(int layers, int width = dim)
  {
    for (int i = 0; i < layers; ++i) fcs->push_back(torch::nn::Linear(width, width));
    register_module("fcs", fcs);
  }
  torch::Tensor forward(torch::Tensor x)
  {
    for (auto& m : *fcs) {  // each layer a block (mpx::checkpoint_block: a plain call outside mpx's trainer)
      auto* fc = m->as<torch::nn::LinearImpl>();
      x = mpx::checkpoint_block(*fc, [fc](const torch::Tensor& t) { return torch::gelu(fc->forward(t)); }, x);
    }
    return x;
  }
  torch::nn::ModuleList fcs;
};
TORCH_MODULE(Stack);

inline torch::Tensor batch(long step) { return torch::randn({rows_per_mb * microbatches, dim}, at::make_generator<at::CPUGeneratorImpl>(step)); }
/// The batches of `steps` steps, drawn before the timed loop: every mode times the same work (the step),
/// not the drawing of random numbers, which would sit on rank 0's critical path.
inline std::vector<torch::Tensor> batches(int steps)
{
  std::vector<torch::Tensor> out;
  for (int s = 0; s < steps; ++s) out.push_back(batch(s));
  return out;
}
inline torch::Tensor loss(const torch::Tensor& y, const torch::Tensor&) { return y.pow(2).mean(); }
}  // namespace bench
