// SPDX-License-Identifier: Apache-2.0
#pragma once
/// An unbalanced toy model for the profiler and the balancer: six MLP layers of width 64 whose hidden widths
/// double from layer to layer (64, 128, ..., 2048), so each layer costs about twice the one before it and an
/// even partition by layer count leaves the first slot nearly idle. Its layer range is chosen at run time (the
/// balancer's ranges come from measured costs), as moondream's text stages are.

#include <mpx/mpx.hpp>

#include <boost/hana/define_struct.hpp>  // BOOST_HANA_DEFINE_STRUCT
#include <torch/torch.h>

#include <vector>

namespace toy
{
inline constexpr int width = 64, num_layers = 6;
inline int hidden_of(int layer) { return 64 << layer; }

struct Batch
{
  BOOST_HANA_DEFINE_STRUCT(Batch, (torch::Tensor, x), (torch::Tensor, y));
};

struct LayerImpl : torch::nn::Module
{
  explicit LayerImpl(int hidden)
      : up(register_module("up", torch::nn::Linear(width, hidden))), down(register_module("down", torch::nn::Linear(hidden, width)))
  {
  }
  torch::Tensor forward(const torch::Tensor& x) { return x + down(torch::gelu(up(x))); }
  torch::nn::Linear up, down;
};
TORCH_MODULE(Layer);

/// Layers [begin, end) of the toy: one pipeline stage.
struct GeometricImpl : torch::nn::Module
{
  using input_type = torch::Tensor;   // (rows, 64)
  using output_type = torch::Tensor;  // (rows, 64)
  GeometricImpl(int begin, int end)
  {
    for (int i = begin; i < end; ++i) layers.push_back(register_module("layer" + std::to_string(i), Layer(hidden_of(i))));
  }
  torch::Tensor forward(const torch::Tensor& x)
  {
    auto h = x;
    for (auto& l : layers) h = l->forward(h);
    return h;
  }
  std::vector<Layer> layers;
};
TORCH_MODULE(Geometric);

/// Each layer as the profiler runs it.
inline std::vector<mpx::LayerFunction> layer_functions(Geometric& whole)
{
  std::vector<mpx::LayerFunction> f;
  for (auto& l : whole->layers) f.push_back([l](const at::Tensor& x) mutable { return l->forward(x); });
  return f;
}

inline Batch make_batch(int rows, long step)
{
  auto g = at::make_generator<at::CPUGeneratorImpl>(500 + step);
  return {torch::randn({rows, width}, g), torch::randn({rows, width}, g)};
}
inline torch::Tensor loss(const torch::Tensor& out, const Batch& b) { return torch::mse_loss(out, b.y); }

/// Two slots, 1F1B, four micro-batches of 256 rows; the cut between the slots is a run-time choice.
using Pipe = mpx::Pipeline<mpx::Stage<Geometric, mpx::CPU<0>>, mpx::Stage<Geometric, mpx::CPU<1>>, mpx::Schedule<mpx::OneFOneB>,
                           mpx::Microbatches<4>, mpx::Batch<Batch>>;
inline constexpr int rows_per_microbatch = 256;
}  // namespace toy
