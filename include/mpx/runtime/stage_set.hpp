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
/// index becomes a compile-time one. It knows nothing of schedules, messages or optimizers. What the runtime
/// reads of it without the pipeline's type — each stage's facts, parameters, tensors by name — is its base,
/// `StageSetBase` (stage_set_base.hpp), which it fills.

#include <mpx/fingerprint.hpp>                    // mpx::model_fingerprint_v
#include <mpx/pipeline.hpp>                       // mpx::PipelineType
#include <mpx/runtime/activation_checkpoint.hpp>  // mpx::checkpoint, mpx::BlockCheckpointing
#include <mpx/runtime/wire/boundary_value.hpp>         // mpx::detail::flatten, unflatten, field_names
#include <mpx/errors.hpp>                 // mpx::config_error
#include <mpx/runtime/options.hpp>                // mpx::TrainOptions
#include <mpx/runtime/precision.hpp>              // mpx::AutocastGuard
#include <mpx/runtime/stage_set_base.hpp>         // mpx::StageSetBase
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
class StageSet : public StageSetBase
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
      : StageSetBase(declared(slot), std::to_string(model_fingerprint_v<P>), std::move(tp)), slot_(slot), device_(device), checkpoint_all_(o.checkpoint_all),
        checkpoint_blocks_(o.checkpoint_blocks), autocast_(o.autocast)
  {
    tp::Scope scope(tp_);
    tp::seed_sharded_regions(at::detail::getDefaultCPUGenerator().current_seed(), tp_->rank);  // per-rank dropout streams
    for (int s = 0; s < N; ++s)
      if (holds(s)) visit(s, [&](auto i) { build<decltype(i)::value>(make); });
  }
  StageSet(const StageSet&) = delete;  // the base points at the modules it holds
  StageSet& operator=(const StageSet&) = delete;

  /// This rank's module of stage I (a `config_error` if stage I lives on another slot).
  template <int I>
  module_t<I>& module()
  {
    if (!holds(I))
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

 private:
  template <std::size_t... I>
  static auto modules_tuple(std::index_sequence<I...>) -> std::tuple<std::optional<module_t<int(I)>>...>;
  using Modules = decltype(modules_tuple(std::make_index_sequence<N>{}));

  /// What P says of each stage (StageSetBase::Declared), for a rank of slot `slot`.
  static std::vector<Declared> declared(int slot)
  {
    std::vector<Declared> out(N);
    for (int s = 0; s < N; ++s)
      visit(s, [&](auto i) {
        constexpr int I = decltype(i)::value;
        using S = typename P::template stage<I>;
        using In = typename P::template input_of<I>;
        Declared& d = out[std::size_t(I)];
        d.mine = P::slots[I] == slot;
        d.frozen = S::frozen;
        d.sharding = S::sharding;
        d.global_names = detail::declares_global_names<decltype(concrete(std::declval<module_t<I>&>()))>;
        if constexpr (std::is_same_v<typename S::optimizer, SGD>) d.optimizer = OptimizerKind::sgd;
        else if constexpr (std::is_same_v<typename S::optimizer, AdamW8bit>) d.optimizer = OptimizerKind::adamw8bit;
        if constexpr (std::is_same_v<typename S::wire, BF16>) d.wire = at::kBFloat16;
        else if constexpr (std::is_same_v<typename S::wire, FP16>) d.wire = at::kHalf;
        d.input = {detail::field_names<In>(), std::string(detail::type_name<In>()), detail::field_dims<In>()};
      });
    return out;
  }

  template <int I, class Make>
  void build(Make& make)
  {
    auto& m = std::get<I>(modules_);
    m.emplace(make(std::integral_constant<int, I>{}));
    auto& mod = impl(*m);
    mod.to(device_);
    std::function<std::map<std::string, at::Tensor>()> names;
    if constexpr (detail::declares_global_names<decltype(concrete(*m))>) names = [&c = concrete(*m)] { return c.named_weights(); };
    hold(I, mod, std::move(names));
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
};

}  // namespace mpx
