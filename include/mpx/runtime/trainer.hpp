// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file runtime/trainer.hpp
/// `mpx::Trainer<P, Batch>`: runs a declared pipeline across processes. Each rank builds only its own
/// stages' modules and optimizers, walks its compile-time action list (receives posted ahead, sends
/// asynchronous, waits just before the compute that needs the data), accumulates gradients over the
/// micro-batches, averages them over replicas (bucketed, started as soon as a stage's last backward is
/// done), clips the global gradient norm across all stages and replicas, and steps each stage's optimizer
/// with the learning-rate schedule. A failure between ranks becomes a `peer_error` naming rank, step,
/// schedule action and peer.
///
/// ```
/// mpx::Trainer<Model, MyBatch> t(world, [](auto stage) { return make_stage<decltype(stage)::value>(); },
///                               input_fn, loss_fn, options);
/// double loss = t.step(mpx::split_microbatches(batch, Model::num_microbatches));
/// ```

#include <mpx/action.hpp>          // mpx::expand, mpx::op_name
#include <mpx/fingerprint.hpp>     // mpx::fingerprint_v
#include <mpx/io/safetensors.hpp>  // mpx::save_safetensors, mpx::load_safetensors
#include <mpx/optim/adamw8bit.hpp>  // mpx::AdamW8bitOptimizer
#include <mpx/pipeline.hpp>        // mpx::PipelineType, mpx::proof, mpx::table_v
#include <mpx/runtime/checkpoint.hpp>  // mpx::checkpoint
#include <mpx/runtime/errors.hpp>  // mpx::config_error, mpx::peer_error
#include <mpx/runtime/lr.hpp>      // mpx::WarmupCosine
#include <mpx/runtime/precision.hpp>  // mpx::AutocastGuard, mpx::LossScaler
#include <mpx/runtime/wire.hpp>    // mpx::send_tensors, mpx::post_recv, mpx::finish_recv
#include <mpx/runtime/world.hpp>   // mpx::World

#include <nlohmann/json.hpp>  // nlohmann::json (trace)
#include <torch/csrc/autograd/functions/accumulate_grad.h>  // torch::autograd::AccumulateGrad (the W pass)
#include <torch/torch.h>      // torch::optim, torch::autograd

#include <algorithm>   // std::find
#include <chrono>      // std::chrono::steady_clock
#include <fstream>     // std::ofstream
#include <iostream>    // std::cout
#include <cmath>       // std::isfinite, std::sqrt
#include <filesystem>  // std::filesystem
#include <map>         // std::map
#include <functional>  // std::function
#include <limits>      // std::numeric_limits
#include <memory>      // std::unique_ptr
#include <optional>    // std::optional
#include <tuple>       // std::tuple
#include <unordered_map>  // std::unordered_map
#include <unordered_set>  // std::unordered_set
#include <vector>      // std::vector

namespace mpx
{

/// Training hyper-parameters of a run.
struct TrainOptions
{
  WarmupCosine lr{1e-3, 0, 1, 1.0};  ///< default: constant 1e-3
  /// Per-stage multipliers of the learning rate (stage s steps with lr × lr_scale[s]; missing: 1), e.g. a
  /// faster vision tower trained from scratch beside a text decoder, or a slower one being fine-tuned.
  std::vector<double> lr_scale;
  double weight_decay = 0.0;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  ///< AdamW
  double momentum = 0.0;                           ///< SGD
  double clip_norm = 0.0;                          ///< global gradient-norm clipping; 0: off
  std::size_t bucket_bytes = std::size_t(25) << 20;  ///< data-parallel all-reduce bucket size
  bool trace = false;                              ///< record every action for `write_trace`
  LossScaler scaler{};                             ///< dynamic loss scaling (off by default; for fp16)
  /// Called on every rank after the gradients are complete (reduced over replicas, still scaled by the
  /// loss scale) and before the inf/NaN check: inspect or edit them. `params` are stage `stage`'s.
  std::function<void(int stage, long step, const std::vector<at::Tensor>& params)> before_optimizer;
  /// Run-time choices for programs that offer them as flags; each adds to what the stage policies say.
  bool checkpoint_all = false;                 ///< checkpoint every stage, as if each had mpx::Checkpointed
  bool checkpoint_blocks = false;              ///< checkpoint every stage's blocks, as if each had mpx::CheckpointBlocks
  std::optional<at::ScalarType> autocast;      ///< autocast every stage's forward (kBFloat16, kHalf) unless its policy says otherwise
  /// Builds stage `stage`'s optimizer over its trainable parameters instead of its Optimizer policy
  /// (return nullptr to keep the policy's).
  std::function<std::unique_ptr<torch::optim::Optimizer>(int stage, const std::vector<at::Tensor>& params)> make_optimizer;
};

/// Splits a batch (a tensor or a Hana struct of tensors) into m micro-batches along dim 0.
template <class Batch>
std::vector<Batch> split_microbatches(const Batch& b, int m)
{
  auto fields = detail::flatten(b);
  const auto n = fields.at(0).size(0);
  for (auto& f : fields)
    if (f.size(0) != n)
      throw config_error("mpx::split_microbatches: the batch's fields have different sizes along dim 0 (" +
                         std::to_string(n) + " and " + std::to_string(f.size(0)) + "); give every field the batch size first");
  if (m < 1 || n % m != 0)
    throw config_error("mpx::split_microbatches: batch size (" + std::to_string(n) + ") is not divisible by the micro-batch count (" +
                       std::to_string(m) + "); choose a batch size that is a multiple of " + std::to_string(m));
  std::vector<Batch> out;
  for (int i = 0; i < m; ++i) {
    std::vector<at::Tensor> part;
    for (auto& f : fields) part.push_back(f.narrow(0, i * (n / m), n / m));
    out.push_back(detail::unflatten<Batch>(part));
  }
  return out;
}

/// What one step measured on this rank.
struct StepStats
{
  double loss = 0;            ///< mean loss over the global batch (all replicas), on every rank
  double grad_norm = 0;       ///< global gradient norm before clipping
  double lr = 0;
  double seconds = 0;         ///< wall time of the step on this rank
  double compute_seconds = 0; ///< time in forward/backward on this rank, less their waits for received data
  double wait_seconds = 0;    ///< time forward/backward waited for their received activations or gradients
  double schedule_seconds = 0;  ///< time walking the schedule's actions (the rest: reductions, optimizer)
  bool skipped = false;         ///< an inf/NaN gradient on some rank: no rank stepped its optimizer
  double loss_scale = 1;        ///< the loss scale used by this step
  double optimizer_seconds = 0; ///< time in the optimizers' steps
};

namespace detail
{
inline constexpr int several_segments = -2;

/// The block boundaries a W pass can start from: tensors in the graph (whose grad_fn has one output, so
/// that stopping there cuts no other path), once each, not the stage's own outputs.
inline std::vector<at::Tensor> usable_boundaries(const std::vector<at::Tensor>& bounds, const std::vector<at::Tensor>& outputs)
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

/// For each parameter (by TensorImpl) reached from the outputs (-1) or from boundary k (k) without
/// crossing another boundary: its segment, or several_segments when it is reached from more than one.
inline std::unordered_map<c10::TensorImpl*, int> boundary_segments(const std::vector<at::Tensor>& outputs,
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
}  // namespace detail

template <PipelineType P, class Batch>
class Trainer
{
  static constexpr int N = P::num_stages;
  static constexpr int M = P::num_microbatches;
  template <int I>
  using module_t = typename P::template stage<I>::module;
  template <std::size_t... I>
  static auto modules_tuple(std::index_sequence<I...>) -> std::tuple<std::optional<module_t<int(I)>>...>;
  using Modules = decltype(modules_tuple(std::make_index_sequence<N>{}));

 public:
  using Input = typename P::template input_of<0>;
  using Output = typename P::template output_of<N - 1>;
  using InputFn = std::function<Input(const Batch&)>;
  using LossFn = std::function<at::Tensor(const Output&, const Batch&)>;

  /// Builds this rank's stages with `make(std::integral_constant<int, I>{})` (only for its own I) and their
  /// optimizers. Proves the schedule first when it was too large to prove at compile time.
  template <class Make>
  Trainer(World& world, Make&& make, InputFn input, LossFn loss, TrainOptions options = {})
      : w_(world), input_(std::move(input)), loss_(std::move(loss)), o_(std::move(options))
  {
    if constexpr (!P::proved_at_compile_time) {
      const Proof pr = proof<P>();
      if (!pr.ok())
        throw config_error(std::string("mpx: the schedule's proof failed at start-up: ") + verdict_text(pr.verdict) +
                           " (rank " + std::to_string(pr.rank) + ", step " + std::to_string(pr.step) + ")");
    }
    const Table t = P::make_table();
    actions_ = expand(t, w_.slot);
    for (const auto& a : actions_) split_ = split_ || a.op == Op::W;
    expected_bubble_ = prove(t).bubble();
    for (int s = 0; s < N; ++s) mine_.push_back(P::slots[s] == w_.slot);
    build(make, std::make_index_sequence<N>{});
    state_.resize(std::size_t(N) * M);
  }

  /// One optimizer step over this replica's m micro-batches (on CPU or this rank's device: they are
  /// moved to the device first, so the loss and the stages that read batch fields see device tensors).
  StepStats step(const std::vector<Batch>& host_microbatches)
  {
    if (static_cast<int>(host_microbatches.size()) != M)
      throw config_error("mpx::Trainer::step: got " + std::to_string(host_microbatches.size()) + " micro-batches, the pipeline declares " +
                         std::to_string(M) + " (mpx::Microbatches<M>); split the batch with mpx::split_microbatches(batch, " +
                         std::to_string(M) + ")");
    std::vector<Batch> on_device;
    if (!w_.device.is_cpu())
      for (const auto& b : host_microbatches) {
        auto fields = detail::flatten(b);
        for (auto& f : fields)
          if (f.defined()) f = f.to(w_.device, /*non_blocking=*/true);
        on_device.push_back(detail::unflatten<Batch>(fields));
      }
    const std::vector<Batch>& microbatches = w_.device.is_cpu() ? host_microbatches : on_device;
    const auto t0 = clock::now();
    double compute = 0, waited = 0;
    at::Tensor loss_sum;  // summed on the device, read once (no host sync per micro-batch)
    std::vector<PendingSend> sends;
    std::vector<int> backward_left(N, M);
    events_.clear();
    for (auto* sizes : {&sent_, &received_})  // a step's messages pack into the room its channels had before it
      for (auto& [key, size] : *sizes) size.next_step();
    for (std::size_t k = 0; k < actions_.size(); ++k) {
      const Action a = actions_[k];
      const auto a0 = clock::now();
      wait_ = {};
      try {
        run(a, microbatches, sends, backward_left, loss_sum);
      } catch (const config_error&) {
        throw;
      } catch (const std::exception& e) {
        throw peer_error(context(a, k) + ": " + e.what());
      }
      const auto a1 = clock::now();
      if (is_compute(a.op)) compute += seconds(a1 - a0 - wait_), waited += seconds(wait_);
      if (o_.trace) events_.push_back({a, us(a0 - t0), us(a1 - a0), us(wait_)});
    }
    for (auto& s : sends)
      for (auto& wk : s.works) {
        try {
          wk->wait(w_.timeout);
        } catch (const std::exception& e) {
          throw peer_error("mpx: rank " + std::to_string(w_.env.rank) + ", step " + std::to_string(step_) + ", " + s.what +
                           ": the send did not complete: " + e.what());
        }
      }
    StepStats st;
    st.schedule_seconds = seconds(clock::now() - t0);
    st.loss_scale = o_.scaler.scale();
    finish_data_parallel();
    if (o_.before_optimizer)
      for (int s = 0; s < N; ++s)
        if (mine_[std::size_t(s)]) o_.before_optimizer(s, step_, params_[std::size_t(s)]);
    // unscale; an inf/NaN anywhere makes the squared norm inf/NaN, so one pass finds both
    if (o_.scaler.enabled)
      for (int s = 0; s < N; ++s)
        if (mine_[std::size_t(s)])
          for (auto& p : params_[std::size_t(s)])
            if (p.grad().defined()) p.mutable_grad().mul_(1.0 / o_.scaler.scale());
    const double sq = local_grad_sq();
    const bool found_inf = !std::isfinite(sq);
    // one all-reduce over the world: the loss (last stage, mean over replicas), the squared gradient norm
    // (every stage once per replica; replicas hold equal gradients after the all-reduce above) and the
    // number of ranks that saw inf/NaN, so that every rank makes the same skip decision
    auto red = torch::zeros({3}, torch::kDouble);
    red[0] = mine_[N - 1] && loss_sum.defined() ? loss_sum.template item<double>() / w_.replicas : 0.0;
    red[1] = found_inf ? 0.0 : sq / w_.replicas;
    red[2] = found_inf ? 1.0 : 0.0;
    std::vector<at::Tensor> rv{red};
    w_.world->allreduce(rv)->wait(w_.timeout);
    st.loss = red[0].template item<double>();
    st.skipped = o_.scaler.update(red[2].template item<double>() > 0);
    st.grad_norm = st.skipped ? std::numeric_limits<double>::infinity() : std::sqrt(red[1].template item<double>());
    st.lr = o_.lr(step_);
    const auto o0 = clock::now();
    if (!st.skipped) {
      clip(st.grad_norm);
      for (std::size_t s = 0; s < optimizers_.size(); ++s) {
        auto& opt = optimizers_[s];
        if (!opt) continue;
        const double scale = s < o_.lr_scale.size() ? o_.lr_scale[s] : 1.0;
        for (auto& g : opt->param_groups()) g.options().set_lr(st.lr * scale);
        opt->step();
      }
    }
    st.optimizer_seconds = seconds(clock::now() - o0);
    for (int s = 0; s < N; ++s)  // zero in place: the next backward accumulates into warm buffers
      if (mine_[s])
        for (auto& p : params_[s])
          if (p.grad().defined()) p.mutable_grad().zero_();
    st.seconds = seconds(clock::now() - t0);
    st.compute_seconds = compute;
    st.wait_seconds = waited;
    last_ = st;
    ++step_;
    return st;
  }

  /// This rank's module of stage I (a `config_error` if stage I lives on another rank).
  template <int I>
  module_t<I>& module()
  {
    if (!mine_[std::size_t(I)])
      throw config_error("mpx::Trainer::module<" + std::to_string(I) + ">: stage " + std::to_string(I) + " lives on slot " +
                         std::to_string(P::slots[I]) + ", this rank is slot " + std::to_string(w_.slot) + "; ask holds(" +
                         std::to_string(I) + ") first");
    return *std::get<I>(modules_);
  }

  /// Saves the training state (every stage's parameters, buffers and optimizer state, the step count and the
  /// loss scaler) into directory `dir`. A collective: every rank calls it. Replica 0 writes its stages'
  /// `stage<I>.safetensors` and `stage<I>.optimizer.pt`, rank 0 `trainer.json`; all into `dir.partial`,
  /// which replaces `dir` only once every rank has finished, so a crash mid-save keeps the previous
  /// checkpoint whole.
  void save(const std::string& dir)
  {
    namespace fs = std::filesystem;
    const std::string tmp = dir + ".partial";
    if (w_.env.rank == 0) {
      fs::remove_all(tmp);
      fs::create_directories(tmp);
    }
    barrier("save: directory");
    if (w_.replica == 0)
      for (int s = 0; s < N; ++s) {
        if (!mine_[std::size_t(s)]) continue;
        save_safetensors(tmp + "/stage" + std::to_string(s) + ".safetensors", stage_state(s), {{"format", "pt"}, {"step", std::to_string(step_)}});
        if (optimizers_[std::size_t(s)]) {
          torch::serialize::OutputArchive ar;
          optimizers_[std::size_t(s)]->save(ar);
          ar.save_to(tmp + "/stage" + std::to_string(s) + ".optimizer.pt");
        }
      }
    if (w_.env.rank == 0) {
      const nlohmann::json j = {{"step", step_}, {"fingerprint", std::to_string(fingerprint_v<P>)}, {"stages", N},
                                {"loss_scale", o_.scaler.scale()}, {"skipped", o_.scaler.skipped()}, {"good_steps", o_.scaler.good_steps()}};
      std::ofstream(tmp + "/trainer.json") << j.dump(1) << "\n";
    }
    barrier("save: files");
    if (w_.env.rank == 0) {
      const std::string old = dir + ".old";
      fs::remove_all(old);
      if (fs::exists(dir)) fs::rename(dir, old);
      fs::rename(tmp, dir);
      fs::remove_all(old);
    }
    barrier("save: rename");
  }

  /// Restores what `save` wrote: parameters, buffers, optimizer states, step count and loss scaler. Errors
  /// name the file and the fix (a checkpoint of another pipeline, a missing or corrupt file).
  void load(const std::string& dir)
  {
    std::ifstream in(dir + "/trainer.json");
    if (!in) throw config_error("mpx: no checkpoint at " + dir + " (trainer.json missing); pass the directory Trainer::save wrote");
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(in);
    } catch (const std::exception& e) {
      throw config_error("mpx: " + dir + "/trainer.json is corrupt (" + e.what() + "); use an earlier checkpoint");
    }
    if (j.value("fingerprint", std::string()) != std::to_string(fingerprint_v<P>))
      throw config_error("mpx: the checkpoint " + dir + " was saved by a different pipeline (fingerprint " + j.value("fingerprint", std::string("?")) +
                         ", this one " + std::to_string(fingerprint_v<P>) + "); resume with the same Pipeline<...> type and layout");
    for (int s = 0; s < N; ++s) {
      if (!mine_[std::size_t(s)]) continue;
      const std::string f = dir + "/stage" + std::to_string(s) + ".safetensors";
      auto st = load_safetensors(f);
      auto want = stage_state(s);
      torch::NoGradGuard ng;
      for (auto& [k, t] : want) {
        auto it = st.tensors.find(k);
        if (it == st.tensors.end() || it->second.sizes() != t.sizes())
          throw config_error("mpx: " + f + ": tensor '" + k + "' is missing or has another shape; the checkpoint does not match this model");
        t.copy_(it->second);
      }
      if (optimizers_[std::size_t(s)]) {
        const std::string o = dir + "/stage" + std::to_string(s) + ".optimizer.pt";
        try {
          torch::serialize::InputArchive ar;
          ar.load_from(o);
          optimizers_[std::size_t(s)]->load(ar);
        } catch (const std::exception& e) {
          throw config_error("mpx: cannot restore the optimizer state from " + o + " (" + e.what() + "); the checkpoint is incomplete or corrupt");
        }
      }
    }
    step_ = j.at("step").get<long>();
    o_.scaler.restore(j.value("loss_scale", o_.scaler.scale()), j.value("skipped", 0L), j.value("good_steps", 0L));
  }

  /// This rank's parameters of stage `s` (empty if the stage lives elsewhere), in module order.
  std::vector<at::Tensor> parameters(int s) const { return mine_.at(std::size_t(s)) ? params_[std::size_t(s)] : std::vector<at::Tensor>{}; }
  bool holds(int s) const { return mine_.at(std::size_t(s)); }
  long steps_done() const { return step_; }
  /// Steps skipped because some rank saw an inf/NaN gradient.
  long skipped_steps() const { return o_.scaler.skipped(); }
  double loss_scale() const { return o_.scaler.scale(); }
  double expected_bubble() const { return expected_bubble_; }
  /// Measured idle fraction of the last step on this rank: 1 - compute / wall (waits for data are idle).
  double measured_bubble() const { return last_.seconds > 0 ? 1.0 - last_.compute_seconds / last_.seconds : 0.0; }

  /// Writes the last step's actions of every rank as one Chrome trace (open in Perfetto) and, on rank 0,
  /// prints the measured bubble (mean over ranks) next to the schedule's expected one. A collective over
  /// the world: every rank calls it; rank 0 writes `path` and returns the measured mean (others: their own).
  /// Needs `TrainOptions::trace`.
  double write_trace(const std::string& path, std::ostream& log = std::cout)
  {
    if (!o_.trace) throw config_error("mpx::Trainer::write_trace: set TrainOptions::trace = true to record the actions");
    nlohmann::json mine = nlohmann::json::array();
    for (auto& e : events_) {
      std::string name = std::string(op_name(e.a.op)) + std::to_string(e.a.mb);
      auto event = [&](std::string n, const char* cat, long ts, long dur) {
        mine.push_back({{"name", std::move(n)}, {"cat", cat}, {"ph", "X"}, {"ts", ts}, {"dur", dur}, {"pid", w_.replica},
                        {"tid", w_.env.rank}, {"args", {{"stage", e.a.stage}, {"mb", e.a.mb}}}});
      };
      if (e.wait > 0) event("wait " + name, "wait", e.ts, e.wait);  // the action's wait for its data, then its work
      event(name, is_compute(e.a.op) ? "compute" : "comm", e.ts + e.wait, e.dur - e.wait);
    }
    const std::string key = "mpx/trace/" + std::to_string(step_) + "/" + std::to_string(w_.env.rank);
    const std::string text = nlohmann::json{{"events", mine}, {"bubble", measured_bubble()}}.dump();
    w_.store->set(key, std::vector<uint8_t>(text.begin(), text.end()));
    if (w_.env.rank != 0) return measured_bubble();
    nlohmann::json all = {{"traceEvents", nlohmann::json::array()}, {"displayTimeUnit", "ms"}};
    double bubble = 0;
    for (int r = 0; r < w_.env.world_size; ++r) {
      const std::string k = "mpx/trace/" + std::to_string(step_) + "/" + std::to_string(r);
      w_.store->wait({k}, w_.timeout);
      auto bytes = w_.store->get(k);
      auto got = nlohmann::json::parse(std::string(bytes.begin(), bytes.end()));
      bubble += got["bubble"].template get<double>() / w_.env.world_size;
      for (auto& ev : got["events"]) all["traceEvents"].push_back(ev);
      all["traceEvents"].push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", r / w_.slots}, {"tid", r},
                                    {"args", {{"name", "rank " + std::to_string(r) + " (slot " + std::to_string(r % w_.slots) + ")"}}}});
    }
    std::ofstream(path) << all.dump(1);
    log << "mpx: bubble of step " << step_ - 1 << ": measured " << int(bubble * 1000 + 0.5) / 10.0 << "% (mean over ranks), "
        << "expected " << int(expected_bubble_ * 1000 + 0.5) / 10.0 << "% (" << P::schedule::name << ", p = " << P::num_slots
        << ", m = " << M << "); trace: " << path << "\n";
    return bubble;
  }

 private:
  using clock = std::chrono::steady_clock;
  static double seconds(clock::duration d) { return std::chrono::duration<double>(d).count(); }
  static long us(clock::duration d) { return long(std::chrono::duration_cast<std::chrono::microseconds>(d).count()); }

  struct Event { Action a; long ts, dur, wait; };
  /// What one (stage, micro-batch) holds between its forward and its backward.
  struct MicroState
  {
    std::vector<at::Tensor> inputs, outputs, grads, input_grads;
    std::vector<at::Tensor> bounds, bound_grads;  // block boundaries and their gradients (split backward only)
    at::Tensor loss;
    std::unique_ptr<PendingRecv> recv_f, recv_b;  // not movable: the receiver thread points at them
  };

  template <class Make, std::size_t... I>
  void build(Make& make, std::index_sequence<I...>)
  {
    params_.resize(N);
    optimizers_.resize(N);
    names_.resize(N);
    boundaries_.resize(N);
    (build_one<int(I)>(make), ...);
  }

  template <int I, class Make>
  void build_one(Make& make)
  {
    using S = typename P::template stage<I>;
    names_[I] = detail::field_names<typename P::template input_of<I>>();
    boundaries_[I] = std::string(detail::type_name<typename P::template input_of<I>>());
    if (!mine_[I]) return;
    auto& m = std::get<I>(modules_);
    m.emplace(make(std::integral_constant<int, I>{}));
    auto& mod = impl(*m);
    mod.to(w_.device);
    for (auto& p : mod.parameters()) {
      if (S::frozen) p.requires_grad_(false);
      params_[I].push_back(p);
    }
    std::vector<at::Tensor> trainable;
    for (auto& p : params_[I])
      if (p.requires_grad()) trainable.push_back(p);
    if (trainable.empty() || S::frozen) return;
    if (o_.make_optimizer)
      if ((optimizers_[I] = o_.make_optimizer(I, trainable))) return;
    using O = typename S::optimizer;
    if constexpr (std::is_same_v<O, SGD>) {
      optimizers_[I] = std::make_unique<torch::optim::SGD>(
          trainable, torch::optim::SGDOptions(o_.lr.peak).momentum(o_.momentum).weight_decay(o_.weight_decay));
    } else if constexpr (std::is_same_v<O, AdamW8bit>) {
      optimizers_[I] = std::make_unique<AdamW8bitOptimizer>(
          trainable, torch::optim::AdamWOptions(o_.lr.peak).betas({o_.beta1, o_.beta2}).eps(o_.eps).weight_decay(o_.weight_decay));
    } else {  // AdamW, also the default for a trainable stage without an Optimizer policy
      optimizers_[I] = std::make_unique<torch::optim::AdamW>(
          trainable, torch::optim::AdamWOptions(o_.lr.peak).betas({o_.beta1, o_.beta2}).eps(o_.eps).weight_decay(o_.weight_decay));
    }
  }

  template <class Mod>
  static torch::nn::Module& impl(Mod& m)
  {
    if constexpr (requires { m.ptr(); }) return *m.ptr();
    else return m;
  }

  /// Runs stage s's forward on a list of input tensors.
  template <std::size_t... I>
  std::vector<at::Tensor> forward(int s, const std::vector<at::Tensor>& in, const Batch& b, std::index_sequence<I...>)
  {
    std::vector<at::Tensor> out;
    ((int(I) == s ? (out = forward_one<int(I)>(in, b), 0) : 0), ...);
    return out;
  }
  template <int I>
  std::vector<at::Tensor> forward_one(const std::vector<at::Tensor>& in, const Batch& b)
  {
    using In = typename P::template input_of<I>;
    auto& m = *std::get<I>(modules_);
    auto run = [this, &m, &b](const std::vector<at::Tensor>& ts) {
      using Prec = typename P::template stage<I>::precision;
      std::optional<AutocastGuard> autocast;
      if constexpr (std::is_same_v<Prec, BF16>) autocast.emplace(w_.device.type(), true, at::kBFloat16);
      else if constexpr (std::is_same_v<Prec, FP16>) autocast.emplace(w_.device.type(), true, at::kHalf);
      else if (o_.autocast) autocast.emplace(w_.device.type(), true, *o_.autocast);
      In x = detail::unflatten<In>(ts);
      BlockCheckpointing blocks(P::template stage<I>::checkpoint_blocks || o_.checkpoint_blocks);
      if constexpr (requires { m->forward(x, b); }) return detail::flatten(m->forward(x, b));
      else if constexpr (requires { m->forward(x); }) return detail::flatten(m->forward(x));
      else if constexpr (requires { m.forward(x, b); }) return detail::flatten(m.forward(x, b));
      else return detail::flatten(m.forward(x));
    };
    if (P::template stage<I>::checkpointed || o_.checkpoint_all) {
      std::vector<at::Tensor> trainable;
      for (auto& p : params_[std::size_t(I)])
        if (p.requires_grad()) trainable.push_back(p);
      return checkpoint(run, in, trainable);
    } else {
      return run(in);
    }
  }

  int rank_of_stage(int s) const { return P::slots[s]; }
  at::ScalarType wire_dtype(int s) const
  {
    at::ScalarType w = at::kFloat;
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      ((int(I) == s ? (w = wire_of<int(I)>(), 0) : 0), ...);
    }(std::make_index_sequence<N>{});
    return w;
  }
  template <int I>
  static at::ScalarType wire_of()
  {
    using Wt = typename P::template stage<I>::wire;
    if constexpr (std::is_same_v<Wt, BF16>) return at::kBFloat16;
    else if constexpr (std::is_same_v<Wt, FP16>) return at::kHalf;
    else return at::kFloat;
  }

  std::string context(Action a, std::size_t k) const
  {
    std::string peer;
    if (a.op == Op::F || a.op == Op::RecvF) peer = a.stage > 0 ? std::to_string(w_.rank_of(w_.replica, rank_of_stage(a.stage - 1))) : "";
    if (a.op == Op::SendF || a.op == Op::RecvB || a.op == Op::B || a.op == Op::I)
      peer = a.stage + 1 < N ? std::to_string(w_.rank_of(w_.replica, rank_of_stage(a.stage + 1))) : "";
    if (a.op == Op::SendB) peer = std::to_string(w_.rank_of(w_.replica, rank_of_stage(a.stage - 1)));
    return "mpx: rank " + std::to_string(w_.env.rank) + " (slot " + std::to_string(w_.slot) + ", replica " +
           std::to_string(w_.replica) + "), step " + std::to_string(step_) + ", action " + std::to_string(k) + " " +
           op_name(a.op) + std::to_string(a.mb) + " of stage " + std::to_string(a.stage) +
           (peer.empty() ? std::string() : ", peer rank " + peer);
  }

  /// Over Gloo a boundary value travels packed in one message, received straight by the action that needs
  /// it; over NCCL (receives of exactly the message's size) as header + payloads, the `Receiver` thread
  /// posting each payload receive the moment its header arrives.
  bool packing() const { return w_.comm_device.is_cpu(); }
  ChannelSize* channel_size(std::map<std::pair<int, int>, ChannelSize>& sizes, int peer, int channel)
  {
    return packing() ? &sizes[{peer, channel}] : nullptr;
  }
  /// Sends one boundary value (or its gradients) to slot `dst`.
  PendingSend send(int dst, int channel, int stage, int mb, bool gradient, const std::vector<at::Tensor>& ts, at::ScalarType wire,
                   std::string what)
  {
    return send_tensors(w_.pp, dst, channel, stage, mb, gradient, ts, wire, std::move(what), w_.comm_device,
                        channel_size(sent_, dst, channel));
  }
  /// Posts the receive of one boundary value from slot `src`.
  std::unique_ptr<PendingRecv> post(int src, int channel, Expect e, std::string what)
  {
    auto r = std::make_unique<PendingRecv>();
    post_recv(*r, w_.pp, src, channel, std::move(e), std::move(what), w_.comm_device, channel_size(received_, src, channel));
    if (!packing()) receiver_->add(r.get());
    return r;
  }
  /// Waits for a posted receive and returns its tensors (gradients: checked against the activations
  /// `like`); the wait counts as this action's idle time.
  std::vector<at::Tensor> take(std::unique_ptr<PendingRecv>& r, const std::vector<at::Tensor>& like = {})
  {
    const auto w0 = clock::now();
    if (!packing()) receiver_->await(*r);
    auto out = finish_recv(w_.pp, *r, w_.timeout, like);
    r.reset();
    wait_ += clock::now() - w0;
    return out;
  }

  void run(Action a, const std::vector<Batch>& mbs, std::vector<PendingSend>& sends, std::vector<int>& backward_left,
           at::Tensor& loss_sum)
  {
    const int s = a.stage, mb = int(a.mb);
    MicroState& st = state_[std::size_t(s) * M + std::size_t(mb)];
    const std::string tag = op_name(a.op) + std::to_string(mb) + " of stage " + std::to_string(s);
    switch (a.op) {
      case Op::RecvF:
        st.recv_f = post(rank_of_stage(s - 1), 2 * (s - 1), Expect{s, mb, false, names_[std::size_t(s)], boundaries_[std::size_t(s)]},
                         tag + " from slot " + std::to_string(rank_of_stage(s - 1)));
        break;
      case Op::RecvB:
        st.recv_b = post(rank_of_stage(s + 1), 2 * s + 1,
                         Expect{s + 1, mb, true, names_[std::size_t(s + 1)], "gradients of " + boundaries_[std::size_t(s + 1)]},
                         tag + " from slot " + std::to_string(rank_of_stage(s + 1)));
        break;
      case Op::F: {
        if (s == 0) {
          st.inputs = detail::flatten(input_(mbs[std::size_t(mb)]));
          for (auto& x : st.inputs) x = x.to(w_.device);
        } else {
          st.inputs = take(st.recv_f);
          for (auto& x : st.inputs)
            if (x.defined()) {
              const bool g = x.requires_grad();
              x = x.to(w_.device).detach().requires_grad_(g);
            }
        }
        torch::AutoGradMode enable(true);
        std::vector<at::Tensor> bounds;  // under a split backward: the blocks' boundaries, for the W pass
        {
          BlockBoundaries capture(split_ ? &bounds : nullptr);
          st.outputs = forward(s, st.inputs, mbs[std::size_t(mb)], std::make_index_sequence<N>{});
        }
        st.bounds = detail::usable_boundaries(bounds, st.outputs);
        if (s == N - 1) {
          st.loss = loss_(detail::unflatten<Output>(st.outputs), mbs[std::size_t(mb)]) / double(M);
          // in double, as the host sum was: the same loss on every device and in every test
          loss_sum = loss_sum.defined() ? loss_sum + st.loss.detach().to(at::kDouble) : st.loss.detach().to(at::kDouble);
        }
        break;
      }
      case Op::SendF:
        sends.push_back(send(rank_of_stage(s + 1), 2 * s, s + 1, mb, false, st.outputs, wire_dtype(s),
                             tag + " to slot " + std::to_string(rank_of_stage(s + 1))));
        break;
      case Op::B:
      case Op::I: {
        std::vector<at::Tensor> outs, grads;
        if (s == N - 1) {
          outs = {st.loss};
          grads = {torch::full_like(st.loss, o_.scaler.scale())};  // d(scale * loss)
        } else {
          auto g = take(st.recv_b, st.outputs);
          for (std::size_t i = 0; i < st.outputs.size() && i < g.size(); ++i)
            if (g[i].defined() && st.outputs[i].requires_grad()) {
              outs.push_back(st.outputs[i]);
              grads.push_back(g[i].to(w_.device).to(st.outputs[i].scalar_type()));
            }
        }
        std::vector<at::Tensor> need;  // inputs that want a gradient
        for (auto& x : st.inputs)
          if (x.defined() && x.requires_grad()) need.push_back(x);
        st.input_grads.assign(st.inputs.size(), at::Tensor());
        if (!outs.empty()) {
          if (a.op == Op::B) {
            torch::autograd::backward(outs, grads);
            for (std::size_t i = 0; i < st.inputs.size(); ++i)
              if (st.inputs[i].defined() && st.inputs[i].requires_grad()) st.input_grads[i] = st.inputs[i].grad();
          } else if (!need.empty() || !st.bounds.empty()) {
            // I: the input gradients, and those of the block boundaries for W; keep the graph for W
            std::vector<at::Tensor> wrt(need);
            wrt.insert(wrt.end(), st.bounds.begin(), st.bounds.end());
            auto gi = torch::autograd::grad(outs, wrt, grads, /*retain_graph=*/true, /*create_graph=*/false, /*allow_unused=*/true);
            std::size_t j = 0;
            for (std::size_t i = 0; i < st.inputs.size(); ++i)
              if (st.inputs[i].defined() && st.inputs[i].requires_grad()) st.input_grads[i] = gi[j++];
            st.bound_grads.assign(gi.begin() + std::ptrdiff_t(need.size()), gi.end());
          }
        }
        if (a.op == Op::I) {
          st.outputs = outs;
          st.grads = grads;
        } else {
          finished_backward(s, backward_left);
          st.outputs.clear();
          st.loss = at::Tensor();
        }
        break;
      }
      case Op::W: {
        std::vector<at::Tensor> trainable;
        for (auto& p : params_[std::size_t(s)])
          if (p.requires_grad()) trainable.push_back(p);
        if (!st.outputs.empty() && !trainable.empty()) weight_gradients(st, trainable);
        st.outputs.clear();
        st.grads.clear();
        st.bounds.clear();
        st.bound_grads.clear();
        st.loss = at::Tensor();
        finished_backward(s, backward_left);
        break;
      }
      case Op::SendB:
        sends.push_back(send(rank_of_stage(s - 1), 2 * (s - 1) + 1, s, mb, true, st.input_grads, wire_dtype(s - 1),
                             tag + " to slot " + std::to_string(rank_of_stage(s - 1))));
        st.inputs.clear();
        st.input_grads.clear();
        break;
    }
    if (a.op == Op::B || a.op == Op::W) {
      if (s == 0) st.inputs.clear();
    }
  }

  /// The W pass of a split backward. Each parameter's gradient is taken from the nearest boundary above
  /// it — the stage's outputs or a block boundary whose gradient the I pass kept — so W differentiates
  /// each block alone instead of walking the activation-gradient chain again (libtorch-notes §5, the
  /// capture split). A parameter reached from several boundaries (shared between blocks) or from none
  /// takes the whole graph, as without boundaries. Every parameter's gradient is computed exactly once.
  static void weight_gradients(MicroState& st, const std::vector<at::Tensor>& trainable)
  {
    const auto segments = detail::boundary_segments(st.outputs, st.bounds);  // parameter -> segment (-1: outputs)
    std::vector<at::Tensor> top, rest;
    std::vector<std::vector<at::Tensor>> per_bound(st.bounds.size());
    for (const auto& p : trainable) {
      const auto it = segments.find(p.unsafeGetTensorImpl());
      const int seg = it == segments.end() ? detail::several_segments : it->second;
      if (seg == -1) top.push_back(p);
      else if (seg >= 0) {
        if (st.bound_grads[std::size_t(seg)].defined()) per_bound[std::size_t(seg)].push_back(p);  // else: no gradient
      } else {
        rest.push_back(p);
      }
    }
    // retain the graph: segments share it until the micro-batch's state is dropped just after
    if (!top.empty()) torch::autograd::backward(st.outputs, st.grads, /*retain_graph=*/true, /*create_graph=*/false, top);
    for (std::size_t k = 0; k < per_bound.size(); ++k)
      if (!per_bound[k].empty())
        torch::autograd::backward({st.bounds[k]}, {st.bound_grads[k]}, /*retain_graph=*/true, /*create_graph=*/false, per_bound[k]);
    if (!rest.empty()) torch::autograd::backward(st.outputs, st.grads, /*retain_graph=*/true, /*create_graph=*/false, rest);
  }

  void barrier(const char* what)
  {
    auto t = torch::zeros({1});
    std::vector<at::Tensor> v{t};
    try {
      w_.world->allreduce(v)->wait(w_.timeout);
    } catch (const std::exception& e) {
      throw peer_error(std::string("mpx: rank ") + std::to_string(w_.env.rank) + ", " + what + ": a peer did not arrive: " + e.what());
    }
  }

  /// Stage s's parameters and buffers by their module names, as CPU tensors that alias the module's.
  std::map<std::string, at::Tensor> stage_state(int s)
  {
    std::map<std::string, at::Tensor> out;
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      ((int(I) == s ? (collect(impl(*std::get<I>(modules_)), out), 0) : 0), ...);
    }(std::make_index_sequence<N>{});
    return out;
  }
  static void collect(torch::nn::Module& m, std::map<std::string, at::Tensor>& out)
  {
    for (auto& p : m.named_parameters()) out[p.key()] = p.value();
    for (auto& b : m.named_buffers()) out[buffer_prefix + b.key()] = b.value();
  }
  static constexpr const char* buffer_prefix = "buffer.";

  // ---- data parallelism: one all-reduce per bucket, started when the stage's last backward is done
  struct Bucket
  {
    std::vector<at::Tensor> params;
    at::Tensor flat;
    c10::intrusive_ptr<c10d::Work> work;
  };
  std::vector<Bucket> buckets_;

  void finished_backward(int s, std::vector<int>& left)
  {
    if (--left[std::size_t(s)] != 0 || w_.replicas == 1) return;
    std::vector<at::Tensor> group;
    std::size_t bytes = 0;
    auto flush = [&] {
      if (group.empty()) return;
      std::vector<at::Tensor> gs;
      for (auto& p : group) gs.push_back(p.grad().defined() ? p.grad().reshape(-1) : torch::zeros({p.numel()}, p.options()));
      Bucket b{group, torch::cat(gs), {}};
      std::vector<at::Tensor> v{b.flat};
      b.work = w_.dp->allreduce(v);
      buckets_.push_back(std::move(b));
      group.clear();
      bytes = 0;
    };
    for (auto& p : params_[std::size_t(s)]) {
      if (!p.requires_grad()) continue;
      group.push_back(p);
      bytes += std::size_t(p.numel()) * p.element_size();
      if (bytes >= o_.bucket_bytes) flush();
    }
    flush();
  }

  void finish_data_parallel()
  {
    for (auto& b : buckets_) {
      b.work->wait(w_.timeout);
      b.flat.div_(double(w_.replicas));
      std::int64_t off = 0;
      for (auto& p : b.params) {
        auto g = b.flat.narrow(0, off, p.numel()).view_as(p);
        if (p.grad().defined()) p.mutable_grad().copy_(g);
        else p.mutable_grad() = g.clone();
        off += p.numel();
      }
    }
    buckets_.clear();
  }

  /// Sum of squares of this rank's gradients.
  double local_grad_sq() const
  {
    std::vector<at::Tensor> norms;  // fp32 norms, squared and summed in double; one host sync for all
    for (int s = 0; s < N; ++s)
      if (mine_[std::size_t(s)])
        for (auto& p : params_[std::size_t(s)])
          if (p.grad().defined()) norms.push_back(p.grad().norm());
    return norms.empty() ? 0.0 : torch::stack(norms).to(at::kDouble).pow(2).sum().template item<double>();
  }

  /// Scales every gradient so that the global norm is at most `clip_norm` (when clipping is on).
  void clip(double norm)
  {
    if (o_.clip_norm <= 0 || norm <= o_.clip_norm) return;
    const double c = o_.clip_norm / (norm + 1e-6);
    for (int s = 0; s < N; ++s)
      if (mine_[std::size_t(s)])
        for (auto& p : params_[std::size_t(s)])
          if (p.grad().defined()) p.mutable_grad().mul_(c);
  }

  World& w_;
  InputFn input_;
  LossFn loss_;
  TrainOptions o_;
  Modules modules_;
  std::vector<bool> mine_;
  std::vector<std::vector<at::Tensor>> params_;
  std::vector<std::unique_ptr<torch::optim::Optimizer>> optimizers_;
  std::vector<std::vector<std::string>> names_;  // field names of each stage's input boundary
  std::vector<std::string> boundaries_;           // and its type's name
  std::vector<Action> actions_;
  std::vector<MicroState> state_;
  std::unique_ptr<Receiver> receiver_ = packing() ? nullptr : std::make_unique<Receiver>(w_.pp, w_.timeout);  // after state_: stops first
  std::vector<Event> events_;
  std::map<std::pair<int, int>, ChannelSize> sent_, received_;  // per (peer slot, channel): the room for packed payloads
  clock::duration wait_{};  // the running action's wait for received data (run() adds, step() reads)
  bool split_ = false;  // this rank's schedule splits backward into I and W (ZB-H1)
  double expected_bubble_ = 0;
  long step_ = 0;
  StepStats last_;
};

}  // namespace mpx
