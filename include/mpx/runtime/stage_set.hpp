// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file runtime/stage_set.hpp
/// `StageSet<P>`: this rank's stages of pipeline P. It builds the modules of the stages its slot holds
/// (and only those) on the rank's device, freezes `Frozen` stages, and runs a stage's forward as the
/// stage's policies say: under autocast (`Precision<BF16>` / `Precision<FP16>`, or the run's
/// `TrainOptions::autocast`), activation-checkpointed (`Checkpointed`, or `checkpoint_all`), with block
/// checkpointing on (`CheckpointBlocks`, or `checkpoint_blocks`). Under `TensorParallel<N>` the slot's
/// tensor-parallel group is the current `tp::Group` while a stage is built and while it runs (recomputes
/// included), so modules written with mpx::tp blocks cut themselves; `norm_parameters` are the ones this
/// rank counts in the global gradient norm (`tp::norm_terms`). `visit` is the one place a run-time stage
/// index becomes a compile-time one. It knows nothing of schedules, messages or optimizers.

#include <mpx/pipeline.hpp>                       // mpx::PipelineType
#include <mpx/runtime/activation_checkpoint.hpp>  // mpx::checkpoint, mpx::BlockCheckpointing
#include <mpx/runtime/wire/boundary_value.hpp>         // mpx::detail::flatten, unflatten, field_names
#include <mpx/errors.hpp>                 // mpx::config_error
#include <mpx/runtime/options.hpp>                // mpx::TrainOptions
#include <mpx/runtime/precision.hpp>              // mpx::AutocastGuard
#include <mpx/tp/cut.hpp>                         // mpx::tp::Cut, cut_parameters, unshard
#include <mpx/tp/dropout.hpp>                     // mpx::tp::seed_sharded_regions
#include <mpx/tp/gradients.hpp>                   // mpx::tp::NormTerm, norm_terms, sum_*_gradients
#include <mpx/tp/group.hpp>                       // mpx::tp::Group, Scope

#include <torch/torch.h>  // torch::nn::Module, torch::Device

#include <algorithm> // std::any_of, std::find_if
#include <concepts>  // std::convertible_to
#include <map>       // std::map
#include <optional>  // std::optional
#include <string>    // std::string
#include <tuple>     // std::tuple
#include <utility>   // std::index_sequence
#include <vector>    // std::vector

namespace mpx
{

namespace detail
{
/// A module that names its parameters globally: `named_weights()` gives them under names that do not
/// depend on the partition into stages (moondream: `text.blocks.7.attn.qkv.weight` on whichever stage holds block 7).
template <class M>
concept declares_global_names = requires(M& m) {
  { m.named_weights() } -> std::convertible_to<std::map<std::string, at::Tensor>>;
};
}  // namespace detail

template <PipelineType P>
class StageSet
{
  static constexpr int N = P::num_stages;

 public:
  template <int I>
  using module_t = typename P::template stage<I>::module;

  /// Calls `f(std::integral_constant<int, I>{})` for I == s: the one run-time to compile-time dispatch.
  template <class F>
  static void visit(int s, F&& f)
  {
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      ((int(I) == s ? (f(std::integral_constant<int, int(I)>{}), 0) : 0), ...);
    }(std::make_index_sequence<N>{});
  }

  /// Builds the stages slot `slot` holds with `make(std::integral_constant<int, I>{})`, on `device`, in
  /// tensor-parallel group `tp` (the slot's; the group of one at degree 1).
  template <class Make>
  StageSet(int slot, torch::Device device, Make& make, const TrainOptions& o, tp::GroupPtr tp = c10::make_intrusive<tp::Group>())
      : slot_(slot), device_(device), checkpoint_all_(o.checkpoint_all), checkpoint_blocks_(o.checkpoint_blocks), autocast_(o.autocast),
        tp_(std::move(tp))
  {
    for (int s = 0; s < N; ++s) mine_.push_back(P::slots[s] == slot);
    params_.resize(N);
    norm_params_.resize(N);
    sequence_parallel_.assign(N, false);
    shared_.assign(N, false);
    inputs_.resize(N);
    tp::Scope scope(tp_);
    tp::seed_sharded_regions(at::detail::getDefaultCPUGenerator().current_seed(), tp_->rank);  // per-rank dropout streams
    for (int s = 0; s < N; ++s) visit(s, [&](auto i) { build<decltype(i)::value>(make); });
  }

  /// The parameters of stage `s` this rank counts in the global gradient norm (see the file comment).
  const std::vector<tp::NormTerm>& norm_parameters(int s) const { return norm_params_.at(std::size_t(s)); }
  /// Completes stage s's gradients that each tensor-parallel rank holds only part of: under sequence
  /// parallelism the replicated parameters' (each rank saw 1/N of the sequence), and key/value heads shared
  /// by several ranks (each used them for its own query heads); sums over the group, a no-op otherwise.
  void sum_partial_gradients(int s)
  {
    visit(s, [&](auto i) {
      auto& m = impl(*std::get<decltype(i)::value>(modules_));
      if (sequence_parallel_[std::size_t(s)]) tp::sum_replicated_gradients(m, tp_);
      if (shared_[std::size_t(s)]) tp::sum_shared_gradients(m, tp_);
    });
  }
  /// Stage s's parameters made whole (cut ones gathered over the tensor-parallel group: a collective of
  /// the slot's ranks), in module order: what the stage would hold at degree 1.
  std::vector<at::Tensor> whole_parameters(int s)
  {
    std::vector<at::Tensor> out;
    visit(s, [&](auto i) {
      auto& m = impl(*std::get<decltype(i)::value>(modules_));
      const auto cuts = tp::cut_parameters(m);
      for (const auto& p : m.named_parameters()) {
        const tp::Cut* c = tp::cut_of(cuts, p.key());
        out.push_back(c == nullptr ? p.value().detach().clone() : tp::unshard(p.value(), *c, *tp_));
      }
    });
    return out;
  }
  /// What names this rank's share of a stage in saved files: "" at degree 1, else ".tp<k>of<N>".
  std::string shard_suffix() const
  {
    return tp_->size == 1 ? std::string() : ".tp" + std::to_string(tp_->rank) + "of" + std::to_string(tp_->size);
  }

  bool holds(int s) const { return mine_.at(std::size_t(s)); }
  /// This rank's parameters of stage `s` (empty if the stage lives elsewhere), in module order.
  const std::vector<at::Tensor>& parameters(int s) const { return params_.at(std::size_t(s)); }
  /// Those of them that train (none for a `Frozen` stage).
  std::vector<at::Tensor> trainable(int s) const
  {
    std::vector<at::Tensor> out;
    for (auto& p : params_[std::size_t(s)])
      if (p.requires_grad()) out.push_back(p);
    return out;
  }

  /// This rank's module of stage I (a `config_error` if stage I lives on another slot).
  template <int I>
  module_t<I>& module()
  {
    if (!mine_[std::size_t(I)])
      throw config_error("mpx: Trainer::module<" + std::to_string(I) + ">: stage " + std::to_string(I) + " lives on slot " +
                         std::to_string(P::slots[I]) + ", this rank is slot " + std::to_string(slot_) + "; ask holds(" + std::to_string(I) +
                         ") first");
    return *std::get<I>(modules_);
  }

  /// Stage s's forward on a list of input tensors (its input boundary, flattened); `b` is the micro-batch,
  /// for stages whose forward reads it.
  template <class Batch>
  std::vector<at::Tensor> forward(int s, const std::vector<at::Tensor>& in, const Batch& b)
  {
    std::vector<at::Tensor> out;
    visit(s, [&](auto i) { out = forward_one<decltype(i)::value>(in, b); });
    return out;
  }

  /// Stage s's parameters and buffers by name, aliasing the module's tensors: its parameters under the
  /// global names of the module's `named_weights()` when it declares one (names that do not depend on how
  /// the model is partitioned into stages, so checkpoints move between layouts), else their module names; buffers
  /// under `buffer.` + their module names.
  std::map<std::string, at::Tensor> state(int s)
  {
    std::map<std::string, at::Tensor> out;
    visit(s, [&](auto i) {
      auto& c = concrete(*std::get<decltype(i)::value>(modules_));
      auto& m = impl(*std::get<decltype(i)::value>(modules_));
      if constexpr (detail::declares_global_names<decltype(c)>) out = c.named_weights();
      else
        for (auto& p : m.named_parameters()) out[p.key()] = p.value();
      for (auto& b : m.named_buffers()) out[buffer_prefix + b.key()] = b.value();
    });
    return out;
  }
  static constexpr const char* buffer_prefix = "buffer.";
  /// How stage s's cut parameters are cut on this rank (at a tensor-parallel degree above 1), under the
  /// names `state` gives them: what a checkpoint records so that it loads into another degree.
  std::map<std::string, tp::Cut> cuts(int s)
  {
    std::map<std::string, tp::Cut> out;
    visit(s, [&](auto i) {
      auto& m = impl(*std::get<decltype(i)::value>(modules_));
      std::map<const c10::TensorImpl*, tp::Cut> by_tensor;
      const auto cuts = tp::cut_parameters(m);
      for (const auto& p : m.named_parameters())
        if (const tp::Cut* c = tp::cut_of(cuts, p.key())) by_tensor[p.value().unsafeGetTensorImpl()] = *c;
      for (auto& [name, t] : state(s))
        if (auto it = by_tensor.find(t.unsafeGetTensorImpl()); it != by_tensor.end()) out[name] = it->second;
    });
    return out;
  }
  /// This rank's place in its stages' tensor-parallel group, and the group's size.
  int tp_rank() const { return tp_->rank; }
  int tp_size() const { return tp_->size; }

  /// Whether stage s's module names its parameters globally (`named_weights()`, see `state`).
  static bool global_names(int s)
  {
    bool out = false;
    visit(s, [&](auto i) { out = detail::declares_global_names<decltype(concrete(std::declval<module_t<decltype(i)::value>&>()))>; });
    return out;
  }

  /// The dtype stage s's output travels in (its WireCompression policy; kFloat: as it is).
  static at::ScalarType wire_dtype(int s)
  {
    at::ScalarType w = at::kFloat;
    visit(s, [&](auto i) {
      using Wt = typename P::template stage<decltype(i)::value>::wire;
      if constexpr (std::is_same_v<Wt, BF16>) w = at::kBFloat16;
      else if constexpr (std::is_same_v<Wt, FP16>) w = at::kHalf;
    });
    return w;
  }
  /// Stage s's input boundary as its receives check it: field names and the type's name (for errors),
  /// each field's declared shape (shape.hpp).
  struct BoundaryInfo
  {
    std::vector<std::string> names;
    std::string type;
    std::vector<detail::DeclaredDims> dims;
  };
  const BoundaryInfo& input_boundary(int s) const { return inputs_[std::size_t(s)]; }

 private:
  template <std::size_t... I>
  static auto modules_tuple(std::index_sequence<I...>) -> std::tuple<std::optional<module_t<int(I)>>...>;
  using Modules = decltype(modules_tuple(std::make_index_sequence<N>{}));

  template <int I, class Make>
  void build(Make& make)
  {
    using In = typename P::template input_of<I>;
    inputs_[I] = {detail::field_names<In>(), std::string(detail::type_name<In>()), detail::field_dims<In>()};
    if (!mine_[I]) return;
    auto& m = std::get<I>(modules_);
    m.emplace(make(std::integral_constant<int, I>{}));
    auto& mod = impl(*m);
    mod.to(device_);
    for (auto& p : mod.parameters()) {
      if (P::template stage<I>::frozen) p.requires_grad_(false);
      params_[I].push_back(p);
    }
    norm_params_[I] = tp::norm_terms(mod, tp_);
    shared_[I] = tp::has_shared_cut(mod);
    auto sp = [](const torch::nn::Module* m) {
      const auto* cm = dynamic_cast<const tp::CutModule*>(m);
      return cm && cm->sequence_parallel();
    };
    sequence_parallel_[I] = sp(&mod);
    for (const auto& m : mod.modules(/*include_self=*/false)) sequence_parallel_[I] = sequence_parallel_[I] || sp(m.get());
  }

  template <class Mod>
  static torch::nn::Module& impl(Mod& m)
  {
    if constexpr (requires { m.ptr(); }) return *m.ptr();
    else return m;
  }
  /// The module itself, of its own type (a TORCH_MODULE holder's Impl).
  template <class Mod>
  static auto& concrete(Mod& m)
  {
    if constexpr (requires { m.ptr(); }) return *m.ptr();
    else return m;
  }

  template <int I, class Batch>
  std::vector<at::Tensor> forward_one(const std::vector<at::Tensor>& in, const Batch& b)
  {
    using S = typename P::template stage<I>;
    using In = typename P::template input_of<I>;
    auto& m = *std::get<I>(modules_);
    auto run = [this, &m, &b](const std::vector<at::Tensor>& ts) {
      tp::Scope scope(tp_);  // a recompute in backward too
      std::optional<AutocastGuard> autocast;
      if constexpr (std::is_same_v<typename S::precision, BF16>) autocast.emplace(device_.type(), true, at::kBFloat16);
      else if constexpr (std::is_same_v<typename S::precision, FP16>) autocast.emplace(device_.type(), true, at::kHalf);
      else if (autocast_) autocast.emplace(device_.type(), true, *autocast_);
      In x = detail::unflatten<In>(ts);
      BlockCheckpointing blocks(S::checkpoint_blocks || checkpoint_blocks_);
      if constexpr (requires { m->forward(x, b); }) return detail::flatten(m->forward(x, b));
      else if constexpr (requires { m->forward(x); }) return detail::flatten(m->forward(x));
      else if constexpr (requires { m.forward(x, b); }) return detail::flatten(m.forward(x, b));
      else return detail::flatten(m.forward(x));
    };
    if (!P::layout.trains(I)) return run(in);  // forward only (under no-grad): nothing to recompute
    if (S::checkpointed || checkpoint_all_) return checkpoint(run, in, trainable(I));
    return run(in);
  }

  int slot_;
  torch::Device device_;
  bool checkpoint_all_, checkpoint_blocks_;
  std::optional<at::ScalarType> autocast_;
  Modules modules_;
  std::vector<bool> mine_;
  std::vector<std::vector<at::Tensor>> params_;
  std::vector<BoundaryInfo> inputs_;  // each stage's input boundary
  tp::GroupPtr tp_;
  std::vector<std::vector<tp::NormTerm>> norm_params_;
  std::vector<bool> sequence_parallel_;
  std::vector<bool> shared_;  // stages with key/value heads shared by several tensor-parallel ranks
};

}  // namespace mpx
