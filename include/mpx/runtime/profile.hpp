// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file runtime/profile.hpp
/// Measured layer costs, and the balancer's report from them: when a module does not declare its costs
/// (balance.hpp), a short profiling run times each layer's forward and backward on one micro-batch, and
/// the report gives the `Layers<b, e>` ranges to paste, each slot's load and the predicted step against
/// the even partition.
///
/// ```
/// std::vector<mpx::LayerFunction> layers;
/// for (auto& block : *model->blocks) layers.push_back([&block](const at::Tensor& x) { return block->forward(x); });
/// const auto costs = mpx::measure_layer_costs(layers, one_microbatch_input);
/// std::cout << mpx::balance_report<mpx::OneFOneB>(costs, 4, 8);   // mpx::Layers<0, 5>, mpx::Layers<5, 9>, ...
/// ```
/// Each layer runs as a pipeline stage would: its input is a fresh leaf (needing a gradient when anything
/// before it trains), its backward computes its parameters' and its input's gradients from a gradient of
/// its output's shape. The costs are nanoseconds on this rank's device (CUDA work is synchronised around
/// each timing); the median of `rounds` timed rounds after `warmup` untimed ones. The parameters keep the
/// gradients the profiling accumulated: zero them before training.

#include <mpx/balance.hpp>         // mpx::LayerCost, mpx::balance, mpx::even_partition, mpx::predict
#include <mpx/errors.hpp>  // mpx::config_error
#include <mpx/linkage.hpp>  // MPX_DECL, MPX_DEFINITIONS

#include <torch/cuda.h>   // torch::cuda::synchronize
#include <torch/torch.h>  // at::Tensor, torch::autograd::backward

#include <algorithm>   // std::nth_element
#include <chrono>      // std::chrono::steady_clock
#include <cstdint>     // std::int64_t
#include <functional>  // std::function
#include <span>        // std::span
#include <sstream>     // std::ostringstream
#include <string>      // std::string
#include <vector>      // std::vector

namespace mpx
{

/// One layer as the profiler runs it: the previous layer's output (or the micro-batch's input) in, this
/// layer's output out.
using LayerFunction = std::function<at::Tensor(const at::Tensor&)>;

struct ProfileOptions
{
  int warmup = 2;  ///< untimed rounds first (allocator pools, lazy initialisation)
  int rounds = 5;  ///< timed rounds; each layer's cost is the median
};

namespace detail
{
MPX_DECL void wait_for_device(const at::Tensor& t);

MPX_DECL std::int64_t nanoseconds_since(std::chrono::steady_clock::time_point t0);

/// One round: every layer's forward in order, then every backward in reverse, each timed alone.
MPX_DECL std::vector<LayerCost> time_layers_once(const std::vector<LayerFunction>& layers, const at::Tensor& input);

MPX_DECL std::int64_t median(std::vector<std::int64_t> v);
}  // namespace detail

/// Each layer's forward and backward per micro-batch in nanoseconds, measured (see the file comment).
MPX_DECL std::vector<LayerCost> measure_layer_costs(const std::vector<LayerFunction>& layers, const at::Tensor& input, ProfileOptions o = {});

namespace detail
{
inline std::string milliseconds(std::int64_t ns) { return std::to_string(ns / 1000000) + "." + std::to_string(ns / 100000 % 10) + std::to_string(ns / 10000 % 10) + " ms"; }
inline std::string percent(double f) { return std::to_string(int(f * 100 + 0.5)) + "%"; }

MPX_DECL void describe_partition(std::ostringstream& os, std::span<const LayerCost> layers, const Partition& part, int slots, int frozen_layers, const Proof& p);
}  // namespace detail

/// The balanced ranges of measured `layers` (nanoseconds, as `measure_layer_costs` gives them) over
/// `slots` slots under schedule Tag with m micro-batches, each slot's load and the predicted step and
/// bubble, beside the even partition's (`even_partition`): the text to read, and the ranges to paste.
template <class Tag = OneFOneB>
std::string balance_report(std::span<const LayerCost> layers, int slots, int microbatches, int frozen_layers = 0)
{
  const int L = int(layers.size());
  if (slots < 1 || slots > L || slots > max_balance_slots)
    throw config_error("mpx::balance_report: " + std::to_string(L) + " layers cannot be partitioned into " + std::to_string(slots) +
                       " non-empty ranges; use between 1 and " + std::to_string(L < max_balance_slots ? L : max_balance_slots) + " slots");
  const Partition balanced = balance<Tag>(layers, slots, microbatches, frozen_layers), even = even_partition(L, slots);
  auto timeline = [&](const Partition& c) {
    return predict<Tag>(partition_layout(c, slots, microbatches, frozen_layers), stage_costs(layers, c, slots, frozen_layers));
  };
  const Proof pb = timeline(balanced), pe = timeline(even);
  std::ostringstream os;
  os << "measured cost per micro-batch, forward + backward:";
  for (int i = 0; i < L; ++i)
    os << (i % 4 == 0 ? "\n " : "") << " layer " << i << " " << detail::milliseconds(layers[std::size_t(i)].forward) << " + "
       << detail::milliseconds(i < frozen_layers ? 0 : layers[std::size_t(i)].backward) << ";";
  os << "\nbalanced over " << slots << " slots (" << Tag::name << ", " << microbatches << " micro-batches):\n";
  detail::describe_partition(os, layers, balanced, slots, frozen_layers, pb);
  os << "even partition by layer count:\n";
  detail::describe_partition(os, layers, even, slots, frozen_layers, pe);
  os << "the balanced step is " << detail::percent(double(pe.makespan - pb.makespan) / double(pe.makespan > 0 ? pe.makespan : 1))
     << " shorter (predicted)\n";
  return os.str();
}
MPX_DECL std::string balance_report(const std::vector<LayerCost>& layers, int slots, int microbatches, int frozen_layers = 0);

}  // namespace mpx

#if MPX_DEFINITIONS
// ---- definitions (compiled once under MPX_SEPARATE_COMPILATION: linkage.hpp) ----

namespace mpx::detail
{

MPX_DECL void wait_for_device(const at::Tensor& t)
{
  if (t.defined() && t.is_cuda()) torch::cuda::synchronize();
}

MPX_DECL std::int64_t nanoseconds_since(std::chrono::steady_clock::time_point t0)
{
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
}

MPX_DECL std::vector<LayerCost> time_layers_once(const std::vector<LayerFunction>& layers, const at::Tensor& input)
{
  const std::size_t n = layers.size();
  std::vector<LayerCost> cost(n);
  std::vector<at::Tensor> outputs(n);
  at::Tensor x = input;
  for (std::size_t i = 0; i < n; ++i) {
    const at::Tensor in = i == 0 ? input : x.detach().requires_grad_(x.requires_grad());  // a received activation
    wait_for_device(in);
    const auto t0 = std::chrono::steady_clock::now();
    outputs[i] = layers[i](in);
    wait_for_device(outputs[i]);
    cost[i].forward = nanoseconds_since(t0);
    if (!outputs[i].defined())
      throw config_error("mpx::measure_layer_costs: layer " + std::to_string(i) + " returned no tensor; each layer must return its output");
    x = outputs[i];
  }
  for (std::size_t i = n; i-- > 0;) {
    if (!outputs[i].requires_grad()) continue;  // nothing trainable up to here: no backward runs through it
    const at::Tensor grad = torch::ones_like(outputs[i]);
    wait_for_device(grad);
    const auto t0 = std::chrono::steady_clock::now();
    torch::autograd::backward({outputs[i]}, {grad});
    wait_for_device(grad);
    cost[i].backward = nanoseconds_since(t0);
  }
  return cost;
}

MPX_DECL std::int64_t median(std::vector<std::int64_t> v)
{
  std::nth_element(v.begin(), v.begin() + std::ptrdiff_t(v.size() / 2), v.end());
  return v[v.size() / 2];
}

}  // namespace mpx::detail

namespace mpx
{

MPX_DECL std::vector<LayerCost> measure_layer_costs(const std::vector<LayerFunction>& layers, const at::Tensor& input, ProfileOptions o)
{
  if (layers.empty()) throw config_error("mpx::measure_layer_costs: no layers given; pass one function per layer");
  if (o.rounds < 1 || o.warmup < 0)
    throw config_error("mpx::measure_layer_costs: rounds must be at least 1 and warmup at least 0 (got " + std::to_string(o.rounds) + ", " +
                       std::to_string(o.warmup) + ")");
  for (int r = 0; r < o.warmup; ++r) detail::time_layers_once(layers, input);
  std::vector<std::vector<std::int64_t>> forward(layers.size()), backward(layers.size());
  for (int r = 0; r < o.rounds; ++r) {
    const auto round = detail::time_layers_once(layers, input);
    for (std::size_t i = 0; i < layers.size(); ++i) forward[i].push_back(round[i].forward), backward[i].push_back(round[i].backward);
  }
  std::vector<LayerCost> cost(layers.size());
  for (std::size_t i = 0; i < layers.size(); ++i) cost[i] = {detail::median(forward[i]), detail::median(backward[i])};
  return cost;
}

}  // namespace mpx

namespace mpx::detail
{

MPX_DECL void describe_partition(std::ostringstream& os, std::span<const LayerCost> layers, const Partition& part, int slots, int frozen_layers, const Proof& p)
{
  const StageCosts c = stage_costs(layers, part, slots, frozen_layers);
  for (int k = 0; k < slots; ++k)
    os << "  slot " << k << ": mpx::Layers<" << part[std::size_t(k)] << ", " << part[std::size_t(k) + 1] << ">  load "
       << milliseconds(c.forward[std::size_t(k)] + c.backward[std::size_t(k)]) << " per micro-batch\n";
  os << "  predicted step " << milliseconds(p.makespan) << ", bubble " << percent(p.bubble()) << "\n";
}

}  // namespace mpx::detail

namespace mpx
{

MPX_DECL std::string balance_report(const std::vector<LayerCost>& layers, int slots, int microbatches, int frozen_layers)
{
  return balance_report<OneFOneB>(std::span<const LayerCost>(layers), slots, microbatches, frozen_layers);
}

}  // namespace mpx
#endif  // MPX_DEFINITIONS
