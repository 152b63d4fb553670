// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file runtime/checkpoint.hpp
/// Activation checkpointing: `mpx::checkpoint(fn, inputs, params)` runs `fn` without keeping its
/// intermediate activations (only the inputs), and recomputes it in backward — with the RNG state of the
/// forward restored, so dropout masks repeat and the gradients equal those of the plain run. The
/// parameters are explicit inputs of the autograd function, so their gradients flow through the engine:
/// it works under `backward()` and `autograd::grad()` alike (and so under the B/W split).
/// `Stage<..., Checkpointed>` wraps the stage's forward in it.

#include <torch/torch.h>  // torch::autograd::Function, at::detail::getDefaultCPUGenerator

#include <functional>  // std::function
#include <mutex>       // std::lock_guard
#include <vector>      // std::vector

namespace mpx
{

namespace detail
{
/// The recomputable forward, kept in the autograd graph's saved data.
struct CheckpointClosure : torch::CustomClassHolder
{
  std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)> fn;
};

struct CheckpointFunction : torch::autograd::Function<CheckpointFunction>
{
  /// `all` = inputs..., params...; the first `n_inputs` are the inputs.
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, c10::intrusive_ptr<CheckpointClosure> fn,
                                                int64_t n_inputs, at::TensorList all)
  {
    auto gen = at::detail::getDefaultCPUGenerator();
    {
      std::lock_guard<std::mutex> lock(gen.mutex());
      ctx->saved_data["rng"] = gen.get_state();
    }
    c10::List<bool> wants;
    for (const auto& t : all) wants.push_back(t.defined() && t.requires_grad());
    ctx->saved_data["wants"] = wants;
    ctx->saved_data["fn"] = c10::IValue::make_capsule(fn);
    ctx->saved_data["n"] = n_inputs;
    ctx->save_for_backward(std::vector<at::Tensor>(all.begin(), all.end()));
    auto outs = fn->fn(std::vector<at::Tensor>(all.begin(), all.begin() + n_inputs));  // runs without a graph
    for (auto& o : outs)
      if (o.defined() && !o.is_floating_point()) ctx->mark_non_differentiable({o});
    return outs;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx, torch::autograd::variable_list grad_out)
  {
    auto saved = ctx->get_saved_variables();
    const auto n = ctx->saved_data["n"].toInt();
    const auto wants = ctx->saved_data["wants"].toBoolList();
    auto fn = c10::static_intrusive_pointer_cast<CheckpointClosure>(ctx->saved_data["fn"].toCapsule());
    std::vector<at::Tensor> inputs;
    for (int64_t i = 0; i < n; ++i)
      inputs.push_back(saved[std::size_t(i)].defined() ? saved[std::size_t(i)].detach().requires_grad_(wants[std::size_t(i)])
                                                       : at::Tensor());
    // recompute with the forward's random numbers, then put the generator back
    auto gen = at::detail::getDefaultCPUGenerator();
    at::Tensor now;
    {
      std::lock_guard<std::mutex> lock(gen.mutex());
      now = gen.get_state();
      gen.set_state(ctx->saved_data["rng"].toTensor());
    }
    std::vector<at::Tensor> outs;
    {
      torch::AutoGradMode enable(true);
      outs = fn->fn(inputs);
    }
    {
      std::lock_guard<std::mutex> lock(gen.mutex());
      gen.set_state(now);
    }
    std::vector<at::Tensor> ys, gys, wrt;
    for (std::size_t i = 0; i < outs.size() && i < grad_out.size(); ++i)
      if (outs[i].defined() && outs[i].requires_grad() && grad_out[i].defined()) {
        ys.push_back(outs[i]);
        gys.push_back(grad_out[i]);
      }
    std::vector<std::size_t> where;
    for (std::size_t i = 0; i < saved.size(); ++i)
      if (wants[i]) {
        wrt.push_back(std::int64_t(i) < n ? inputs[i] : saved[i]);
        where.push_back(i);
      }
    torch::autograd::variable_list result(2 + saved.size());  // fn, n_inputs, then one per tensor
    if (!ys.empty() && !wrt.empty()) {
      auto g = torch::autograd::grad(ys, wrt, gys, /*retain_graph=*/false, /*create_graph=*/false, /*allow_unused=*/true);
      for (std::size_t k = 0; k < where.size(); ++k) result[2 + where[k]] = g[k];
    }
    return result;
  }
};
}  // namespace detail

/// Runs `fn(inputs)` keeping only `inputs` for backward, which recomputes `fn` (see the file comment).
/// `params` are the parameters `fn` uses: their gradients flow through the recomputation.
inline std::vector<at::Tensor> checkpoint(std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)> fn,
                                          const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& params)
{
  auto holder = c10::make_intrusive<detail::CheckpointClosure>();
  holder->fn = std::move(fn);
  std::vector<at::Tensor> all(inputs);
  all.insert(all.end(), params.begin(), params.end());
  return detail::CheckpointFunction::apply(holder, static_cast<int64_t>(inputs.size()), at::TensorList(all));
}

}  // namespace mpx
