// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file runtime/backward.hpp
/// One micro-batch's backward through one stage, whole or split. `full_backward` (B) accumulates the
/// parameters' gradients and returns the inputs'. The split of ZB-H1: `input_backward` (I) computes the
/// inputs' gradients and those of the stage's block boundaries, keeping the graph; `weight_backward` (W),
/// later, computes each parameter's gradient from the nearest boundary above it — the stage's outputs or a
/// block boundary whose gradient I kept — so W differentiates each block alone instead of walking the
/// activation-gradient chain again (libtorch-notes §5). A parameter reached from several boundaries (shared
/// between blocks) or from none takes the whole graph. Every parameter's gradient is computed once.

#include <mpx/linkage.hpp>  // MPX_DECL, MPX_DEFINITIONS
#include <torch/csrc/autograd/functions/accumulate_grad.h>  // torch::autograd::AccumulateGrad
#include <torch/torch.h>                                    // torch::autograd::backward, torch::autograd::grad

#include <algorithm>      // std::find
#include <unordered_map>  // std::unordered_map
#include <unordered_set>  // std::unordered_set
#include <vector>         // std::vector

namespace mpx
{

namespace detail
{
inline constexpr int several_segments = -2;

/// The block boundaries a W pass can start from: tensors in the graph (whose grad_fn has one output, so
/// that stopping there cuts no other path), once each, not the stage's own outputs.
MPX_DECL std::vector<at::Tensor> usable_boundaries(const std::vector<at::Tensor>& bounds, const std::vector<at::Tensor>& outputs);

/// For each parameter (by TensorImpl) reached from the outputs (-1) or from boundary k (k) without
/// crossing another boundary: its segment, or several_segments when it is reached from more than one.
MPX_DECL std::unordered_map<c10::TensorImpl*, int> boundary_segments(const std::vector<at::Tensor>& outputs,
                                                                   const std::vector<at::Tensor>& bounds);
}  // namespace detail

/// B: backpropagates `grads` from `outs` (empty: nothing to do) into the parameters and the inputs;
/// returns each input's gradient (undefined where the input needs none).
MPX_DECL std::vector<at::Tensor> full_backward(const std::vector<at::Tensor>& outs, const std::vector<at::Tensor>& grads,
                                             const std::vector<at::Tensor>& inputs);

/// What I leaves for W and for the previous stage.
struct InputGradients
{
  std::vector<at::Tensor> inputs;  ///< per input (undefined where none is needed)
  std::vector<at::Tensor> bounds;  ///< per usable block boundary, for W
};

/// I: the gradients of the inputs and of the block boundaries `bounds`; keeps the graph for W.
MPX_DECL InputGradients input_backward(const std::vector<at::Tensor>& outs, const std::vector<at::Tensor>& grads,
                                     const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& bounds);

/// W: the gradients of `trainable` (see the file comment), after I kept `bound_grads` for `bounds`.
MPX_DECL void weight_backward(const std::vector<at::Tensor>& outs, const std::vector<at::Tensor>& grads,
                            const std::vector<at::Tensor>& bounds, const std::vector<at::Tensor>& bound_grads,
                            const std::vector<at::Tensor>& trainable);

}  // namespace mpx

#if MPX_DEFINITIONS
// ---- definitions (compiled once under MPX_SEPARATE_COMPILATION: linkage.hpp) ----

namespace mpx::detail
{
MPX_DECL std::vector<at::Tensor> usable_boundaries(const std::vector<at::Tensor>& bounds, const std::vector<at::Tensor>& outputs)
{
  std::vector<torch::autograd::Node*> seen;
  for (const auto& o : outputs)
    if (o.defined() && o.grad_fn()) seen.push_back(o.grad_fn().get());
  std::vector<at::Tensor> out;
  for (const auto& b : bounds) {
    if (!b.defined() || !b.requires_grad() || !b.grad_fn() || b.grad_fn()->num_inputs() != 1) continue;
    auto* n = b.grad_fn().get();
    if (std::find(seen.begin(), seen.end(), n) != seen.end()) continue;
    seen.push_back(n);
    out.push_back(b);
  }
  return out;
}

MPX_DECL std::unordered_map<c10::TensorImpl*, int> boundary_segments(const std::vector<at::Tensor>& outputs,
                                                                   const std::vector<at::Tensor>& bounds)
{
  using torch::autograd::Node;
  std::unordered_set<Node*> stop;
  for (const auto& b : bounds) stop.insert(b.grad_fn().get());
  std::unordered_map<c10::TensorImpl*, int> where;
  auto visit = [&](std::vector<Node*> todo, int seg) {
    std::unordered_set<Node*> seen(todo.begin(), todo.end());
    while (!todo.empty()) {
      Node* n = todo.back();
      todo.pop_back();
      if (auto* acc = dynamic_cast<torch::autograd::AccumulateGrad*>(n)) {
        auto [it, fresh] = where.emplace(acc->variable.unsafeGetTensorImpl(), seg);
        if (!fresh && it->second != seg) it->second = several_segments;
        continue;
      }
      for (const auto& e : n->next_edges()) {
        Node* m = e.function.get();
        if (m != nullptr && stop.count(m) == 0 && seen.insert(m).second) todo.push_back(m);
      }
    }
  };
  std::vector<Node*> roots;
  for (const auto& o : outputs)
    if (o.defined() && o.grad_fn()) roots.push_back(o.grad_fn().get());
  visit(roots, -1);
  for (std::size_t k = 0; k < bounds.size(); ++k) visit({bounds[k].grad_fn().get()}, int(k));
  return where;
}

}  // namespace mpx::detail

namespace mpx
{
MPX_DECL std::vector<at::Tensor> full_backward(const std::vector<at::Tensor>& outs, const std::vector<at::Tensor>& grads,
                                             const std::vector<at::Tensor>& inputs)
{
  std::vector<at::Tensor> input_grads(inputs.size());
  if (outs.empty()) return input_grads;
  torch::autograd::backward(outs, grads);
  for (std::size_t i = 0; i < inputs.size(); ++i)
    if (inputs[i].defined() && inputs[i].requires_grad()) input_grads[i] = inputs[i].grad();
  return input_grads;
}

MPX_DECL InputGradients input_backward(const std::vector<at::Tensor>& outs, const std::vector<at::Tensor>& grads,
                                     const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& bounds)
{
  InputGradients g;
  g.inputs.assign(inputs.size(), at::Tensor());
  std::vector<at::Tensor> wrt;  // inputs that want a gradient, then the boundaries
  for (auto& x : inputs)
    if (x.defined() && x.requires_grad()) wrt.push_back(x);
  const std::size_t need = wrt.size();
  if (outs.empty() || (need == 0 && bounds.empty())) return g;
  wrt.insert(wrt.end(), bounds.begin(), bounds.end());
  auto gi = torch::autograd::grad(outs, wrt, grads, /*retain_graph=*/true, /*create_graph=*/false, /*allow_unused=*/true);
  std::size_t j = 0;
  for (std::size_t i = 0; i < inputs.size(); ++i)
    if (inputs[i].defined() && inputs[i].requires_grad()) g.inputs[i] = gi[j++];
  g.bounds.assign(gi.begin() + std::ptrdiff_t(need), gi.end());
  return g;
}

MPX_DECL void weight_backward(const std::vector<at::Tensor>& outs, const std::vector<at::Tensor>& grads,
                            const std::vector<at::Tensor>& bounds, const std::vector<at::Tensor>& bound_grads,
                            const std::vector<at::Tensor>& trainable)
{
  if (outs.empty() || trainable.empty()) return;
  const auto segments = detail::boundary_segments(outs, bounds);  // parameter -> segment (-1: outputs)
  std::vector<at::Tensor> top, rest;
  std::vector<std::vector<at::Tensor>> per_bound(bounds.size());
  for (const auto& p : trainable) {
    const auto it = segments.find(p.unsafeGetTensorImpl());
    const int seg = it == segments.end() ? detail::several_segments : it->second;
    if (seg == -1) top.push_back(p);
    else if (seg >= 0) {
      if (bound_grads[std::size_t(seg)].defined()) per_bound[std::size_t(seg)].push_back(p);  // else: no gradient
    } else {
      rest.push_back(p);
    }
  }
  // retain the graph: segments share it until the micro-batch's state is dropped just after
  if (!top.empty()) torch::autograd::backward(outs, grads, /*retain_graph=*/true, /*create_graph=*/false, top);
  for (std::size_t k = 0; k < per_bound.size(); ++k)
    if (!per_bound[k].empty())
      torch::autograd::backward({bounds[k]}, {bound_grads[k]}, /*retain_graph=*/true, /*create_graph=*/false, per_bound[k]);
  if (!rest.empty()) torch::autograd::backward(outs, grads, /*retain_graph=*/true, /*create_graph=*/false, rest);
}

}  // namespace mpx
#endif  // MPX_DEFINITIONS
