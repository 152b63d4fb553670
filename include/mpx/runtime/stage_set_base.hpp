// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file runtime/stage_set_base.hpp
/// `StageSetBase`: a rank's stages as the runtime reads them without the pipeline's type — which stages
/// the rank holds, their parameters (all, those that train, those it counts in the global gradient norm),
/// their tensors by name and how the cut ones are cut, each stage's input boundary, wire dtype and
/// optimizer policy. `StageSet<P>` (stage_set.hpp) builds the modules and fills it; the optimizers, the
/// executor's body, the checkpoint and the trainer's step read it, so they are compiled once under
/// `mpx::compiled` (linkage.hpp) rather than in every TU that declares a pipeline.

#include <mpx/linkage.hpp>                      // MPX_DECL, MPX_DEFINITIONS
#include <mpx/runtime/wire/boundary_value.hpp>  // mpx::detail::DeclaredDims
#include <mpx/tp/cut.hpp>                       // mpx::tp::Cut
#include <mpx/tp/gradients.hpp>                 // mpx::tp::NormTerm
#include <mpx/tp/group.hpp>                     // mpx::tp::GroupPtr

#include <torch/torch.h>  // torch::nn::Module, at::Tensor

#include <functional>  // std::function
#include <map>         // std::map
#include <string>      // std::string
#include <vector>      // std::vector

namespace mpx
{

/// A stage's `Optimizer<O>` policy at run time (AdamW also for a trainable stage without one).
enum class OptimizerKind
{
  adamw,
  adamw8bit,
  sgd,
};

class StageSetBase
{
 public:
  /// A stage's input boundary as its receives check it: field names and the type's name (for errors),
  /// each field's declared shape (shape.hpp).
  struct BoundaryInfo
  {
    std::vector<std::string> names;
    std::string type;
    std::vector<detail::DeclaredDims> dims;
  };
  /// What the pipeline's type says of one stage, whether or not this rank holds it.
  struct Declared
  {
    bool mine = false;          ///< this rank's slot holds it
    bool frozen = false;        ///< `Frozen`: its parameters do not train
    bool global_names = false;  ///< its module names its parameters globally (`named_weights()`)
    OptimizerKind optimizer = OptimizerKind::adamw;
    int sharding = 0;           ///< `Sharded<L>`: its ZeRO level over the replicas (0: none)
    at::ScalarType wire = at::kFloat;  ///< the dtype its output travels in (WireCompression)
    BoundaryInfo input;
  };

  StageSetBase(const StageSetBase&) = delete;  // the executor, the optimizers and the checkpoint point at it
  StageSetBase& operator=(const StageSetBase&) = delete;

  int num_stages() const { return int(stages_.size()); }
  /// The pipeline type's fingerprint (fingerprint.hpp): what a checkpoint must have been saved under.
  const std::string& fingerprint() const { return fingerprint_; }
  bool holds(int s) const { return stages_.at(std::size_t(s)).declared.mine; }
  bool frozen(int s) const { return stages_.at(std::size_t(s)).declared.frozen; }
  OptimizerKind optimizer_kind(int s) const { return stages_.at(std::size_t(s)).declared.optimizer; }
  /// Stage s's ZeRO level (`Sharded<L>`; 0: unsharded).
  int sharding(int s) const { return stages_.at(std::size_t(s)).declared.sharding; }
  /// Whether stage s's module names its parameters globally (`named_weights()`, see `state`).
  bool global_names(int s) const { return stages_.at(std::size_t(s)).declared.global_names; }
  /// The dtype stage s's output travels in (its WireCompression policy; kFloat: as it is).
  at::ScalarType wire_dtype(int s) const { return stages_.at(std::size_t(s)).declared.wire; }
  const BoundaryInfo& input_boundary(int s) const { return stages_.at(std::size_t(s)).declared.input; }

  /// This rank's parameters of stage `s` (empty if the stage lives elsewhere), in module order.
  const std::vector<at::Tensor>& parameters(int s) const { return stages_.at(std::size_t(s)).params; }
  /// Those of them that train (none for a `Frozen` stage).
  MPX_DECL std::vector<at::Tensor> trainable(int s) const;
  /// The parameters of stage `s` this rank counts in the global gradient norm (`tp::norm_terms`).
  const std::vector<tp::NormTerm>& norm_parameters(int s) const { return stages_.at(std::size_t(s)).norm_params; }
  /// Completes stage s's gradients that each tensor-parallel rank holds only part of: under sequence
  /// parallelism the replicated parameters' (each rank saw 1/N of the sequence), and key/value heads shared
  /// by several ranks (each used them for its own query heads); sums over the group, a no-op otherwise.
  MPX_DECL void sum_partial_gradients(int s);
  /// Whether `sum_partial_gradients(s)` has anything to sum.
  bool has_partial_gradients(int s) const { return stages_.at(std::size_t(s)).sequence_parallel || stages_.at(std::size_t(s)).shared; }
  /// Stage s's parameters made whole (cut ones gathered over the tensor-parallel group: a collective of
  /// the slot's ranks), in module order: what the stage would hold at degree 1.
  MPX_DECL std::vector<at::Tensor> whole_parameters(int s);
  /// Stage s's parameters and buffers by name, aliasing the module's tensors: its parameters under the
  /// global names of the module's `named_weights()` when it declares one (names that do not depend on how
  /// the model is partitioned into stages, so checkpoints move between layouts), else their module names;
  /// buffers under `buffer.` + their module names.
  MPX_DECL std::map<std::string, at::Tensor> state(int s);
  static constexpr const char* buffer_prefix = "buffer.";
  /// How stage s's cut parameters are cut on this rank (at a tensor-parallel degree above 1), under the
  /// names `state` gives them: what a checkpoint records so that it loads into another degree.
  MPX_DECL std::map<std::string, tp::Cut> cuts(int s);
  /// What names this rank's share of a stage in saved files: "" at degree 1, else ".tp<k>of<N>".
  MPX_DECL std::string shard_suffix() const;
  /// This rank's place in its stages' tensor-parallel group, and the group's size.
  int tp_rank() const { return tp_->rank; }
  int tp_size() const { return tp_->size; }

 protected:
  MPX_DECL StageSetBase(std::vector<Declared> declared, std::string fingerprint, tp::GroupPtr tp);
  MPX_DECL ~StageSetBase();
  /// Takes `module`, built for stage s on this rank, as the stage's: its parameters (frozen when the stage
  /// is), norm terms and partial-gradient facts; `named_weights` gives its global names when it has them.
  MPX_DECL void hold(int s, torch::nn::Module& module, std::function<std::map<std::string, at::Tensor>()> named_weights);

  tp::GroupPtr tp_;

 private:
  struct Held
  {
    Declared declared;
    torch::nn::Module* module = nullptr;  // this rank's, once held
    std::function<std::map<std::string, at::Tensor>()> named_weights;
    std::vector<at::Tensor> params;
    std::vector<tp::NormTerm> norm_params;
    bool sequence_parallel = false;
    bool shared = false;  // key/value heads shared by several tensor-parallel ranks
  };
  std::string fingerprint_;
  std::vector<Held> stages_;
};

}  // namespace mpx

#if MPX_DEFINITIONS
// ---- definitions (compiled once under MPX_SEPARATE_COMPILATION: linkage.hpp) ----
namespace mpx
{

MPX_DECL StageSetBase::StageSetBase(std::vector<Declared> declared, std::string fingerprint, tp::GroupPtr tp)
    : tp_(std::move(tp)), fingerprint_(std::move(fingerprint))
{
  stages_.resize(declared.size());
  for (std::size_t s = 0; s < declared.size(); ++s) stages_[s].declared = std::move(declared[s]);
}

MPX_DECL StageSetBase::~StageSetBase() = default;

MPX_DECL std::vector<at::Tensor> StageSetBase::trainable(int s) const
{
  std::vector<at::Tensor> out;
  for (auto& p : parameters(s))
    if (p.requires_grad()) out.push_back(p);
  return out;
}

MPX_DECL void StageSetBase::hold(int s, torch::nn::Module& module, std::function<std::map<std::string, at::Tensor>()> named_weights)
{
  Held& h = stages_.at(std::size_t(s));
  h.module = &module;
  h.named_weights = std::move(named_weights);
  for (auto& p : module.parameters()) {
    if (h.declared.frozen) p.requires_grad_(false);
    h.params.push_back(p);
  }
  h.norm_params = tp::norm_terms(module, tp_);
  h.shared = tp::has_shared_cut(module);
  auto sp = [](const torch::nn::Module* m) {
    const auto* cm = dynamic_cast<const tp::CutModule*>(m);
    return cm && cm->sequence_parallel();
  };
  h.sequence_parallel = sp(&module);
  for (const auto& m : module.modules(/*include_self=*/false)) h.sequence_parallel = h.sequence_parallel || sp(m.get());
}

MPX_DECL void StageSetBase::sum_partial_gradients(int s)
{
  Held& h = stages_.at(std::size_t(s));
  if (h.module == nullptr) return;
  if (h.sequence_parallel) tp::sum_replicated_gradients(*h.module, tp_);
  if (h.shared) tp::sum_shared_gradients(*h.module, tp_);
}

MPX_DECL std::vector<at::Tensor> StageSetBase::whole_parameters(int s)
{
  std::vector<at::Tensor> out;
  Held& h = stages_.at(std::size_t(s));
  if (h.module == nullptr) return out;
  const auto cuts = tp::cut_parameters(*h.module);
  for (const auto& p : h.module->named_parameters()) {
    const tp::Cut* c = tp::cut_of(cuts, p.key());
    out.push_back(c == nullptr ? p.value().detach().clone() : tp::unshard(p.value(), *c, *tp_));
  }
  return out;
}

MPX_DECL std::map<std::string, at::Tensor> StageSetBase::state(int s)
{
  std::map<std::string, at::Tensor> out;
  Held& h = stages_.at(std::size_t(s));
  if (h.module == nullptr) return out;
  if (h.named_weights) out = h.named_weights();
  else
    for (auto& p : h.module->named_parameters()) out[p.key()] = p.value();
  for (auto& b : h.module->named_buffers()) out[buffer_prefix + b.key()] = b.value();
  return out;
}

MPX_DECL std::map<std::string, tp::Cut> StageSetBase::cuts(int s)
{
  std::map<std::string, tp::Cut> out;
  Held& h = stages_.at(std::size_t(s));
  if (h.module == nullptr) return out;
  std::map<const c10::TensorImpl*, tp::Cut> by_tensor;
  const auto cuts = tp::cut_parameters(*h.module);
  for (const auto& p : h.module->named_parameters())
    if (const tp::Cut* c = tp::cut_of(cuts, p.key())) by_tensor[p.value().unsafeGetTensorImpl()] = *c;
  for (auto& [name, t] : state(s))
    if (auto it = by_tensor.find(t.unsafeGetTensorImpl()); it != by_tensor.end()) out[name] = it->second;
  return out;
}

MPX_DECL std::string StageSetBase::shard_suffix() const
{
  return tp_->size == 1 ? std::string() : ".tp" + std::to_string(tp_->rank) + "of" + std::to_string(tp_->size);
}

}  // namespace mpx
#endif  // MPX_DEFINITIONS
