// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file runtime/activation_checkpoint.hpp
/// Activation checkpointing: `mpx::checkpoint(fn, inputs, params)` runs `fn` without keeping its
/// intermediate activations (only the inputs), and recomputes it in backward — with the RNG state of the
/// forward restored, so dropout masks repeat and the gradients equal those of the plain run. The
/// parameters are explicit inputs of the autograd function, so their gradients flow through the engine:
/// it works under `backward()` and `autograd::grad()` alike (and so under the B/W split).
/// The generators saved and restored are the CPU one, tensor parallelism's sharded-region one (tp/dropout.hpp)
/// and, for every CUDA device an input lives on, that device's (dropout on a GPU draws from it). `Stage<..., Checkpointed>` wraps the stage's forward in it;
/// `Stage<..., CheckpointBlocks>` turns on `checkpoint_block`, with which a module marks its blocks.

#include <mpx/tp/dropout.hpp>  // mpx::tp::sharded_region_generator
#include <mpx/linkage.hpp>  // MPX_DECL, MPX_DEFINITIONS

#include <torch/torch.h>  // torch::autograd::Function, at::detail::getDefaultCPUGenerator, at::globalContext

#include <algorithm>   // std::find
#include <functional>  // std::function
#include <mutex>       // std::lock_guard
#include <vector>      // std::vector

namespace mpx
{

namespace detail
{
/// The generators a region on `inputs` draws from: CPU's, sharded regions', and each CUDA device's that an input is on.
MPX_DECL std::vector<at::Generator> generators_of(at::TensorList inputs);
MPX_DECL std::vector<at::Tensor> get_states(std::vector<at::Generator>& gens);
MPX_DECL void set_states(std::vector<at::Generator>& gens, const std::vector<at::Tensor>& states);

/// The recomputable forward, kept in the autograd graph's saved data.
struct CheckpointClosure : torch::CustomClassHolder
{
  std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)> fn;
};

struct CheckpointFunction : torch::autograd::Function<CheckpointFunction>
{
  /// `all` = inputs..., params...; the first `n_inputs` are the inputs.
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, c10::intrusive_ptr<CheckpointClosure> fn,
                                                int64_t n_inputs, at::TensorList all);

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx, torch::autograd::variable_list grad_out);
};
}  // namespace detail

namespace detail
{
MPX_DECL bool& block_checkpointing_flag();
}  // namespace detail

/// While alive, `checkpoint_block` checkpoints on this thread (the trainer opens one around the forward of a
/// `CheckpointBlocks` stage; a program may open its own). Nests; restores the previous state.
class BlockCheckpointing
{
 public:
  explicit BlockCheckpointing(bool on = true) : was_(detail::block_checkpointing_flag()) { detail::block_checkpointing_flag() = on; }
  ~BlockCheckpointing() { detail::block_checkpointing_flag() = was_; }
  BlockCheckpointing(const BlockCheckpointing&) = delete;
  BlockCheckpointing& operator=(const BlockCheckpointing&) = delete;

 private:
  bool was_;
};

namespace detail
{
MPX_DECL std::vector<at::Tensor>*& block_boundaries();
}  // namespace detail

/// While alive, every `checkpoint_block` on this thread appends its block's input and output to `list`.
/// The trainer collects them under a split backward (ZB-H1): the weight-gradient pass then differentiates
/// block by block from these boundaries instead of walking the stage's whole graph again.
class BlockBoundaries
{
 public:
  explicit BlockBoundaries(std::vector<at::Tensor>* list) : was_(detail::block_boundaries()) { detail::block_boundaries() = list; }
  ~BlockBoundaries() { detail::block_boundaries() = was_; }
  BlockBoundaries(const BlockBoundaries&) = delete;
  BlockBoundaries& operator=(const BlockBoundaries&) = delete;

 private:
  std::vector<at::Tensor>* was_;
};

/// Model code marks its blocks with this: `x = mpx::checkpoint_block(*block, [&](const at::Tensor& t) {
/// return block->forward(t); }, x);`. Under `BlockCheckpointing` with gradients on, the block keeps only
/// `x` and is recomputed in backward (its parameters' gradients flow); otherwise it is a plain call, so the
/// module stays ordinary single-device code. Either way the block's boundaries are reported to an open
/// `BlockBoundaries`.
template <class Fn>
at::Tensor checkpoint_block(torch::nn::Module& block, Fn&& fn, const at::Tensor& x)
{
  const bool active = detail::block_checkpointing_flag() && at::GradMode::is_enabled();
  std::vector<at::Tensor> params;
  if (active)
    for (auto& p : block.parameters())
      if (p.requires_grad()) params.push_back(p);
  at::Tensor y;
  if (active && (!params.empty() || x.requires_grad())) {
    auto f = [fn = std::forward<Fn>(fn)](const std::vector<at::Tensor>& in) mutable { return std::vector<at::Tensor>{fn(in[0])}; };
    y = checkpoint(std::move(f), {x}, params)[0];
  } else {
    y = fn(x);  // a plain call (or nothing to differentiate: no graph to save)
  }
  if (auto* list = detail::block_boundaries()) list->insert(list->end(), {x, y});
  return y;
}

/// Runs `fn(inputs)` keeping only `inputs` for backward, which recomputes `fn` (see the file comment).
/// `params` are the parameters `fn` uses: their gradients flow through the recomputation.
MPX_DECL std::vector<at::Tensor> checkpoint(std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)> fn,
                                          const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& params);

}  // namespace mpx

#if MPX_DEFINITIONS
// ---- definitions (compiled once under MPX_SEPARATE_COMPILATION: linkage.hpp) ----

namespace mpx::detail
{

MPX_DECL std::vector<at::Generator> generators_of(at::TensorList inputs)
{
  std::vector<at::Generator> gens{at::detail::getDefaultCPUGenerator(), tp::sharded_region_generator()};
  std::vector<c10::DeviceIndex> seen;
  for (const auto& t : inputs)
    if (t.defined() && t.is_cuda() && std::find(seen.begin(), seen.end(), t.device().index()) == seen.end()) {
      seen.push_back(t.device().index());
      gens.push_back(at::globalContext().defaultGenerator(t.device()));
    }
  return gens;
}

MPX_DECL std::vector<at::Tensor> get_states(std::vector<at::Generator>& gens)
{
  std::vector<at::Tensor> out;
  for (auto& g : gens) {
    std::lock_guard<std::mutex> lock(g.mutex());
    out.push_back(g.get_state());
  }
  return out;
}

MPX_DECL void set_states(std::vector<at::Generator>& gens, const std::vector<at::Tensor>& states)
{
  for (std::size_t i = 0; i < gens.size(); ++i) {
    std::lock_guard<std::mutex> lock(gens[i].mutex());
    gens[i].set_state(states[i]);
  }
}

MPX_DECL torch::autograd::variable_list CheckpointFunction::forward(torch::autograd::AutogradContext* ctx,
                                                                    c10::intrusive_ptr<CheckpointClosure> fn, int64_t n_inputs, at::TensorList all)
{
  auto gens = generators_of(all.slice(0, std::size_t(n_inputs)));
  ctx->saved_data["rng"] = c10::List<at::Tensor>(get_states(gens));
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

MPX_DECL torch::autograd::variable_list CheckpointFunction::backward(torch::autograd::AutogradContext* ctx, torch::autograd::variable_list grad_out)
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
  auto gens = generators_of(inputs);
  const auto now = get_states(gens);
  set_states(gens, ctx->saved_data["rng"].toTensorVector());
  std::vector<at::Tensor> outs;
  {
    torch::AutoGradMode enable(true);
    outs = fn->fn(inputs);
  }
  set_states(gens, now);
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

MPX_DECL bool& block_checkpointing_flag()
{
  thread_local bool on = false;
  return on;
}

MPX_DECL std::vector<at::Tensor>*& block_boundaries()
{
  thread_local std::vector<at::Tensor>* list = nullptr;
  return list;
}

}  // namespace mpx::detail

namespace mpx
{

MPX_DECL std::vector<at::Tensor> checkpoint(std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)> fn,
                                          const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& params)
{
  auto holder = c10::make_intrusive<detail::CheckpointClosure>();
  holder->fn = std::move(fn);
  std::vector<at::Tensor> all(inputs);
  all.insert(all.end(), params.begin(), params.end());
  return detail::CheckpointFunction::apply(holder, static_cast<int64_t>(inputs.size()), at::TensorList(all));
}

}  // namespace mpx
#endif  // MPX_DEFINITIONS
