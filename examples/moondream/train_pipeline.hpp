// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file examples/moondream/train_pipeline.hpp
/// The pipeline driver: `train_pipeline<P>` trains one pipeline type (stage 0 the vision encoder and stages
/// 1.. text ranges, or every stage a `VisionText` range of pieces: the layout's plan, costs.hpp) on this
/// rank with mpx — world, stages, trainer, resume, checkpoints, the exported model and the held-out
/// evaluation on rank 0.

#include "costs.hpp"       // moondream::Plan, plan_of, workload_of
#include "memory_report.hpp"  // moondream::MemoryReport
#include "evaluation.hpp"  // moondream::evaluate, describe
#include "lora.hpp"        // moondream::apply_lora, export_weights
#include "quantize.hpp"    // moondream::apply_quantization, write_quantized, load_weights
#include "metrics.hpp"     // moondream::Progress, write_plot
#include "recipe.hpp"      // moondream::Options, make_data, initialise, step_indices, ...
#include "speeds.hpp"      // moondream::Speeds, resolve_speeds, watch_of

#include <mpx/mpx.hpp>

#include <fmt/format.h>  // fmt::format
#include <torch/torch.h>

#include <chrono>      // std::chrono
#include <filesystem>  // std::filesystem
#include <iostream>    // std::cout
#include <optional>    // std::optional
#include <set>     // std::set
#include <string>      // std::string
#include <vector>      // std::vector

namespace moondream
{

/// " (text tensor-parallel over 2 ranks)", " (vision and text tensor-parallel over 2 ranks each)", ...
inline std::string tp_description(const Options& o)
{
  if (o.tp == 1 && o.vision_tp == 1) return "";
  if (o.tp == o.vision_tp) return fmt::format(" (vision and text tensor-parallel over {} ranks each)", o.tp);
  if (o.vision_tp == 1) return fmt::format(" (text tensor-parallel over {} ranks)", o.tp);
  return fmt::format(" (vision tensor-parallel over {} ranks, text over {})", o.vision_tp, o.tp);
}

/// A rendezvous through the store that may wait long (evaluation on rank 0): every rank sets its key,
/// then waits for all of them.
inline void store_barrier(mpx::World& w, const std::string& tag, std::chrono::milliseconds timeout)
{
  const std::string key = w.next_key("moondream/" + tag);  // every rank passes the same barriers in the same order
  w.store->set(key + std::to_string(w.env.rank), std::vector<uint8_t>{1});
  std::vector<std::string> keys;
  for (int r = 0; r < w.env.world_size; ++r) keys.push_back(key + std::to_string(r));
  w.store->wait(keys, timeout);
}


/// The shape of the first step's micro-batches: the same on every rank (replica 0's samples, whatever the
/// replicas).
inline std::vector<Batch> first_microbatches(const Options& o, const Config& c, const Data& data, const Tokenizer& tok)
{
  const auto idx = step_indices(data.train->size(), 0, o.microbatches(), o.microbatch_size, 1, 0, o.seed);
  return make_microbatches(*data.train, idx, tok, c);
}
inline Workload workload_for(const Options& o, const Config& c, const Data& data, const Tokenizer& tok)
{
  return workload_of(first_microbatches(o, c, data, tok));
}
/// What a driver settled before choosing the pipeline type (a balanced layout's cut depends on the speeds):
/// the store it joined to exchange them, and the speeds.
struct Prepared
{
  c10::intrusive_ptr<c10d::Store> store;
  std::optional<Speeds> speeds;
};

/// Trains pipeline type P on this rank.
template <class P>
int train_pipeline(const Options& o, const Prepared& pre = {})
{
  using namespace std::chrono_literals;
  const auto env = mpx::read_env();
  const bool lead = env.rank == 0;
  const Config c = load_config(o.config);
  mpx::check_blas();
  mpx::WorldOptions wo;
  wo.timeout = std::chrono::milliseconds(long(o.timeout_s) * 1000);
  wo.allow_cpu = true;
  wo.settings = run_settings(o);
  wo.store = pre.store;
  auto world = mpx::make_world<P>(env, wo);
  const auto tok = Tokenizer::load(o.tokenizer);
  tok.check_fits(c.text.vocab_size);
  Data data = make_data(o, c);
  std::vector<int> slot_of;
  for (int r = 0; r < env.world_size; ++r) slot_of.push_back(world.slot_of(r));
  const Speeds speeds = pre.speeds ? *pre.speeds
                                   : resolve_speeds(o, env, *world.store, slot_of, P::num_slots, !resume_from(o, env).empty(), c,
                                                    first_microbatches(o, c, data, tok).front());
  const long total = resolve_steps(o, data, world.replicas);
  constexpr bool balanced = std::is_same_v<typename P::template stage<0>::module, VisionText>;  // every stage a range of pieces
  const Plan plan = plan_for(o, c, workload_for(o, c, data, tok), speeds);
  if (plan.slots != P::num_stages || plan.frozen_slots != P::forward_only_stages || (!balanced && !plan.vision_alone()))
    throw std::logic_error(fmt::format("moondream_train: layout {}'s plan ({} slots, {} forward only) does not fit pipeline type {}", o.layout,
                                       plan.slots, plan.frozen_slots, mpx::detail::type_name<P>()));
  if (lead) {
    std::cout << fmt::format("moondream_train: config {} ({} vision + {} text layers), layout {}{}, {} ranks, {} on {}\n", c.name,
                             c.vision.enc_n_layers, c.text.n_layers, o.layout, tp_description(o),
                             env.world_size, P::schedule::name,
                             world.device.is_cuda() ? "CUDA" : "CPU (no CUDA here: this example opts into running GPU<i> stages on CPU ranks)");
    std::cout << mpx::print<P>;
    if (!balanced)
      for (int i = 1; i < P::num_stages; ++i) std::cout << fmt::format("  stage {}: text layers [{}, {})\n", i, plan.text_range(i).first, plan.text_range(i).second);
    std::cout << "  costs from the config (FLOPs): " << describe(plan) << "\n";
    if (!speeds.per_slot.empty()) std::cout << "  devices' speeds " << speeds_text(speeds.per_slot) << ": " << speeds.source << "\n";
    if (!speeds.scale_source.empty())
      std::cout << fmt::format("  encoder's time per FLOP {:.2f}x (forward), {:.2f}x (backward) the decoder's: {}\n", speeds.scale.vision_forward,
                               speeds.scale.vision_backward, speeds.scale_source);
    std::cout << fmt::format("  vision: {}; optimizer {}; precision {}; activation checkpointing {}; global batch {} = {} micro-batches x {} samples x {} replicas\n",
                             o.train_vision() ? fmt::format("trained at {} x the rate", o.vision_lr_scale) : "frozen", o.optimizer, o.precision, o.checkpoint ? "stages" : o.checkpoint_blocks ? "blocks" : "off",
                             o.microbatches() * o.microbatch_size * world.replicas, o.microbatches(), o.microbatch_size, world.replicas);
  }
  std::set<const c10::TensorImpl*> vision_params;  // a balanced stage's encoder blocks: their own rate (make_optimizer)
  auto make = [&](auto stage) {
    constexpr int I = decltype(stage)::value;
    if constexpr (balanced) {
      VisionText vt(c, plan.pieces(I).first, plan.pieces(I).second);
      initialise(o, c, *vt, *data.train, tok);
      if (vt->vision)
        for (auto& p : vt->vision->parameters()) {
          if (!o.train_vision()) p.requires_grad_(false);
          vision_params.insert(p.unsafeGetTensorImpl());
        }
      apply_lora(o, *vt);
      apply_quantization(o, *vt);
      return vt;
    } else if constexpr (I == 0) {
      Vision v(c);
      initialise(o, c, *v, *data.train, tok);
      if (!o.train_vision())
        for (auto& p : v->parameters()) p.requires_grad_(false);
      apply_lora(o, *v);
      apply_quantization(o, *v);
      return v;
    } else {
      Text t(c, plan.text_range(I).first, plan.text_range(I).second);
      initialise(o, c, *t, *data.train, tok);  // a text stage under --tp: this rank's shards of layout 1's weights
      apply_lora(o, *t);                       // --lora: adapters drawn whole by global name, cut as their linears
      apply_quantization(o, *t);               // --base-precision: the frozen base packed; --qat: quantization-aware
      return t;
    }
  };
  mpx::TrainOptions to;
  to.lr = schedule_of(o, total);
  to.weight_decay = o.weight_decay, to.beta1 = 0.9, to.beta2 = 0.95, to.eps = 1e-6;
  to.clip_norm = o.clip;
  // the encoder's rate: a stage of encoder blocks only at lr x --vision-lr-scale (stage 0 of layouts 2 and 4);
  // a balanced stage that holds encoder blocks beside decoder layers gives them a parameter group of their own
  to.lr_scale.assign(std::size_t(P::num_stages), 1.0);
  for (int i = 0; i < P::num_stages; ++i)
    if (plan.encoder_only(i)) to.lr_scale[std::size_t(i)] = o.vision_lr_scale;
  to.checkpoint_all = o.checkpoint;
  to.sharding = o.shard;  // each replica steps 1/2 of every trained stage (a sharded stage's make_optimizer gets its pieces); 3: keeps 1/2 of its weights
  to.checkpoint_blocks = o.checkpoint_blocks;
  to.checkpoints.checksums = o.checkpoint_checksums == "on";
  to.checkpoints.trainable_only = o.lora > 0;  // the adapters and their state; the base is rebuilt as it started
  to.trace = !o.trace.empty();
  if (o.checkpoint && o.checkpoint_blocks)
    throw mpx::config_error("moondream_train: --checkpoint (whole stages) and --checkpoint-blocks exclude each other; keep one");
  if (o.precision == "bf16") to.autocast = at::kBFloat16;
  else if (o.precision != "fp32") throw mpx::config_error("moondream_train: --precision " + o.precision + " on CPU: use fp32 or bf16");
  // the stages declare the recipe's Optimizer<AdamW8bit>; --optimizer adamw replaces it, and a balanced stage
  // that mixes encoder and decoder gets the recipe's optimizer with the encoder in a group of its own
  to.make_optimizer = [&](int s, const std::vector<at::Tensor>& params) -> std::unique_ptr<torch::optim::Optimizer> {
    if (o.optimizer == "adamw8bit" && !plan.mixes(s)) return nullptr;
    return make_optimizer(o, params, vision_params);
  };
  MemoryReport mem;
  if (o.memory_report) to.before_optimizer = [&](int, long, const std::vector<at::Tensor>&) { mem.at_optimizer(); };
  auto input = [](const Batch& b) { return b.crops; };
  mem.before_build();
  mpx::Trainer<P, Batch> trainer(world, make, input, answer_loss, to);
  mem.built();

  const std::string save = o.save;
  const std::string scratch = save.empty() ? (std::filesystem::temp_directory_path() / ("moondream_eval_" + std::to_string(env.master_port))).string() : save;
  // each stage of replica 0 writes its weights whole under global names (a tensor-parallel stage's ranks
  // gather their shards; its first rank writes them)
  // (--lora: the merged weights, and the adapters alone under adapters/)
  auto export_stage = [&](const std::string& dir, int i, auto& module) {
    std::map<std::string, at::Tensor> adapters;
    mpx::quant::Unpacked unpacked(module);  // --base-precision: the base as the adapters saw it
    const auto whole = export_weights(o, whole_weights(module), adapters);
    if (module.tp_group->rank != 0) return;
    write_weights(dir + "/stage" + std::to_string(i) + ".safetensors", whole);
    if (!adapters.empty()) write_weights(dir + "/adapters/stage" + std::to_string(i) + ".safetensors", adapters, at::kFloat, false, adapter_metadata(o));
    if (!o.qat.empty()) write_quantized(o, dir + "/quantized/stage" + std::to_string(i) + ".safetensors", whole, quantization_aware(module));
  };
  auto export_model = [&](const std::string& dir) {
    trainer.gather_parameters();  // --shard 3: every replica's part, so that replica 0 holds the whole weights
    if (lead) std::filesystem::create_directories(dir + (o.lora > 0 ? "/adapters" : ""));
    store_barrier(world, "mkdir/" + dir, wo.timeout);
    if (world.replica == 0)
      [&]<std::size_t... I>(std::index_sequence<I...>) {
        ((trainer.holds(int(I)) ? (export_stage(dir, int(I), *trainer.template module<int(I)>()), 0) : 0), ...);
      }(std::make_index_sequence<P::num_stages>{});
    store_barrier(world, "export/" + dir, wo.timeout);
  };
  std::vector<std::string> accuracy;  // the plot's notes (lead only)
  auto eval = [&](const char* when) {
    if (!data.eval || o.eval_samples <= 0) return;
    const std::string dir = scratch + "/model";
    export_model(dir);
    if (lead) {
      Moondream full(c);
      load_weights(o.qat.empty() ? dir : dir + "/quantized", c, *full);  // --qat: the quantized model
      accuracy.push_back(std::string("held-out accuracy ") + when + ": " + describe(evaluate(full, *data.eval, tok, o.eval_samples)));
      std::cout << accuracy.back() << "\n" << std::flush;
    }
    store_barrier(world, std::string("eval/") + when + std::to_string(trainer.steps_done()), std::chrono::hours(2));
  };
  if (const std::string from = resume_from(o, env); !from.empty()) {
    store_barrier(world, "load", wo.timeout);  // the time below is the load's, not the ranks' start-up skew
    const auto t0 = std::chrono::steady_clock::now();
    trainer.load(from);
    if (lead)
      std::cout << "resumed from " << from << " at step " << trainer.steps_done()
                << (env.restart_count > 0 ? fmt::format(" (restart {} of {})", env.restart_count, o.max_restarts) : "")
                << fmt::format(" in {:.3f} s", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()) << "\n";
  }
  const long start = trainer.steps_done();
  if (start == 0) eval("before training");
  Progress prog;
  prog.first_step = start;
  const std::string metrics = !o.metrics.empty() ? o.metrics : save.empty() ? "" : save + "/metrics.jsonl";
  if (lead) prog.open(metrics, start > 0);
  auto checkpoint = [&] {
    if (save.empty()) return;
    const auto t0 = std::chrono::steady_clock::now();
    trainer.save(save + "/checkpoint");
    if (lead)
      std::cout << fmt::format("checkpoint {}/checkpoint/step-{:08} written in {:.3f} s\n", save, trainer.steps_done(),
                               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    export_model(save + "/model");
    if (lead) std::cout << fmt::format("saved {}/checkpoint/step-{:08} and {}/model at step {}\n", save, trainer.steps_done(), save, trainer.steps_done());
  };
  std::optional<mpx::SpeedWatch> watch;  // --rebalance: each slot's compute against the plan (speeds.hpp)
  if (o.rebalance != "off") watch.emplace(watch_of(plan, speeds));
  // a device confirmed behind on `step`: named; under --rebalance on, true when the run should start again on a new cut
  auto behind = [&](long step) {
    report_straggler(*watch, world, step);
    if (o.rebalance != "on" || step + 1 == total) return false;
    const Replan r = replan_of(o, c, plan, *watch);
    if (lead) std::cout << r.text << std::flush;
    if (!r.worth) return false;
    checkpoint();
    if (lead) write_speeds_file(o, r.measured, trainer.steps_done(), watch->describe());
    store_barrier(world, "replan", wo.timeout);
    return true;
  };
  for (long step = start; step < total; ++step) {
    auto idx = step_indices(data.train->size(), step, o.microbatches(), o.microbatch_size, world.replicas, world.replica, o.seed);
    auto mbs = make_microbatches(*data.train, idx, tok, c);
    const auto st = trainer.step(mbs);
    if (o.profile)
      std::cerr << fmt::format("rank {} step {}: {:.3f} s, compute {:.3f} s, waits {:.3f} s, schedule {:.3f} s, optimizer {:.3f} s\n", env.rank,
                               step, st.seconds, st.compute_seconds, st.wait_seconds, st.schedule_seconds, st.optimizer_seconds);
    if (lead) {
      const long samples = long(o.microbatches()) * o.microbatch_size * world.replicas;
      prog.record(step, total, st.loss, st.lr, st.grad_norm, st.seconds, samples, count_tokens(mbs, c) * world.replicas, st.skipped,
                  !o.quiet && (step % o.log_every == 0 || step + 1 == total));
    }
    mem.step_returned();
    mbs = {};
    mem.batch_dropped();
    if (watch && watch->observe(mpx::slot_seconds(world, st.compute_seconds)) && behind(step)) return mpx::replan_exit_status;
    if (o.save_every > 0 && (step + 1) % o.save_every == 0 && step + 1 < total) checkpoint();
  }
  if (o.memory_report) std::cout << report_memory<P>(trainer, mem, env.rank, o.optimizer == "adamw8bit", o.shard == 3) << std::flush;
  checkpoint();
  if (!o.trace.empty() && total > start) trainer.write_trace(o.trace);  // every rank: a collective
  eval("after training");
  if (lead) {
    const std::string plot = !o.plot.empty() ? o.plot : save.empty() ? "" : save + "/loss.svg";
    write_plot(plot, prog.losses, start, accuracy);
    if (!plot.empty()) std::cout << "loss curve: " << plot << (metrics.empty() ? "" : ", metrics: " + metrics) << "\n";
  }
  return 0;
}

}  // namespace moondream
