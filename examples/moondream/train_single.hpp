// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file examples/moondream/train_single.hpp
/// The single-process reference: `train_single` is the same training in one process with plain LibTorch
/// (layout 1), the parity reference of every pipeline layout (tests/train_checks.sh).

#include "evaluation.hpp"  // moondream::evaluate, describe
#include "lora.hpp"        // moondream::lora_options, export_weights
#include "quantize.hpp"    // moondream::apply_quantization, write_quantized
#include "metrics.hpp"     // moondream::Progress
#include "recipe.hpp"      // moondream::Options, make_data, initialise, step_indices, ...

#include <mpx/mpx.hpp>

#include <fmt/format.h>  // fmt::format
#include <torch/torch.h>

#include <chrono>      // std::chrono::steady_clock
#include <cmath>       // std::sqrt
#include <filesystem>  // std::filesystem
#include <iostream>    // std::cout
#include <memory>      // std::unique_ptr
#include <optional>    // std::optional
#include <string>      // std::string
#include <vector>      // std::vector

namespace moondream
{

/// The same training in one process with plain LibTorch: the parity reference (layout 1).
inline int train_single(const Options& o)
{
  const Config c = load_config(o.config);
  mpx::check_blas();
  const mpx::Env env = mpx::read_env();  // (one process: MPX_KEEP_HOST_MEMORY and MPX_FAULT count as a rank's)
  if (env.keep_host_memory) mpx::keep_host_memory();  // as make_world does for the pipeline ranks
  const auto tok = Tokenizer::load(o.tokenizer);
  tok.check_fits(c.text.vocab_size);
  Data data = make_data(o, c);
  const long total = resolve_steps(o, data, o.emulate_replicas);
  Moondream m(c);
  initialise_weights(o, c, m->named_weights(), *data.train, tok);
  if (o.lora > 0) mpx::lora::apply(*m, lora_options(o), m->named_weights());  // (its names are the global ones)
  std::vector<at::Tensor> trainable;
  for (auto& [n, p] : m->named_weights()) {
    if (n.rfind("vision.", 0) == 0 && !o.train_vision()) p.requires_grad_(false);
    if (p.requires_grad()) trainable.push_back(p);
  }
  apply_quantization(o, *m);  // --base-precision: the frozen linears packed; --qat: the trained ones quantization-aware
  // one optimizer per stage, as the pipeline has: vision, then text (AdamW's state is per tensor either way)
  std::vector<at::Tensor> vis, txt;
  for (auto& [n, p] : m->vision->named_weights())
    if (p.requires_grad()) vis.push_back(p);
  for (auto& [n, p] : m->text->named_weights())
    if (p.requires_grad()) txt.push_back(p);
  std::vector<std::unique_ptr<torch::optim::Optimizer>> opts;
  if (!vis.empty()) opts.push_back(make_optimizer(o, vis));
  opts.push_back(make_optimizer(o, txt));
  std::optional<mpx::AutocastGuard> autocast;
  if (o.precision == "bf16") autocast.emplace(c10::DeviceType::CPU, true, at::kBFloat16);
  const auto lr = schedule_of(o, total);
  std::cout << fmt::format("moondream_train: config {}, layout 1 (one process, plain LibTorch), {} steps\n", c.name, total);
  if (data.eval && o.eval_samples > 0) std::cout << "held-out accuracy before training: " << describe(evaluate(m, *data.eval, tok, o.eval_samples)) << "\n";
  m->train();
  // the checkpoint's parts are the pipeline's stages (vision, then text) under the same global names, so a
  // checkpoint of any layout resumes here and this one's in any layout (mpx::save_local_checkpoint)
  std::vector<mpx::LocalPart> parts{{m->vision->named_weights(), vis.empty() ? nullptr : opts.front().get()},
                                    {m->text->named_weights(), opts.back().get()}};
  mpx::CheckpointOptions co;
  co.checksums = o.checkpoint_checksums == "on";
  co.trainable_only = o.lora > 0;  // the adapters and their state (the pipeline's choice too)
  long start = 0;
  if (const std::string from = resume_from(o, mpx::Env{}); !from.empty()) {
    const auto t0 = std::chrono::steady_clock::now();
    start = mpx::load_local_checkpoint(from, parts, {}, co).step;
    std::cout << "resumed from " << from << " at step " << start
              << fmt::format(" in {:.3f} s", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()) << "\n";
  }
  auto checkpoint = [&](long steps_done) {
    if (o.save.empty()) return;
    mpx::TrainingState t;
    t.step = steps_done;
    mpx::save_local_checkpoint(o.save + "/checkpoint", parts, t, co);
    std::cout << fmt::format("saved {}/checkpoint/step-{:08} at step {}\n", o.save, steps_done, steps_done);
  };
  Progress prog;
  prog.first_step = start;
  const std::string metrics = !o.metrics.empty() ? o.metrics : o.save.empty() ? "" : o.save + "/metrics.jsonl";
  prog.open(metrics, start > 0);
  const int M = o.microbatches();
  for (long step = start; step < total; ++step) {
    mpx::inject_fault(env, mpx::FaultPoint::step, step);  // MPX_FAULT, as a pipeline rank's (tests of resuming)
    const auto t0 = std::chrono::steady_clock::now();
    const int R = o.emulate_replicas;  // a data-parallel run's replicas, one after the other: the same samples and mean
    std::vector<Batch> mbs;
    for (int r = 0; r < R; ++r) {
      auto part = make_microbatches(*data.train, step_indices(data.train->size(), step, M, o.microbatch_size, R, r, o.seed), tok, c);
      mbs.insert(mbs.end(), part.begin(), part.end());
    }
    const auto t1 = std::chrono::steady_clock::now();
    double loss_sum = 0;
    for (auto& b : mbs) {
      auto loss = answer_loss(m->forward(b), b) / double(M * R);
      loss_sum += loss.item<double>();
      loss.backward();
    }
    double sq = 0;
    for (auto& p : trainable)
      if (p.grad().defined()) {
        const double n = p.grad().norm().item<double>();
        sq += n * n;
      }
    const double norm = std::sqrt(sq);
    if (o.clip > 0 && norm > o.clip)
      for (auto& p : trainable)
        if (p.grad().defined()) p.mutable_grad().mul_(o.clip / (norm + 1e-6));
    const auto t2 = std::chrono::steady_clock::now();
    for (std::size_t k = 0; k < opts.size(); ++k) {  // the vision optimizer first, when there is one
      const double scale = k == 0 && !vis.empty() ? o.vision_lr_scale : 1.0;
      for (auto& g : opts[k]->param_groups()) g.options().set_lr(lr(step) * scale);
      opts[k]->step();
    }
    if (o.profile)
      std::cerr << fmt::format("data {:.3f} s, forward+backward {:.3f} s, optimizer {:.3f} s\n", std::chrono::duration<double>(t1 - t0).count(),
                               std::chrono::duration<double>(t2 - t1).count(), std::chrono::duration<double>(std::chrono::steady_clock::now() - t2).count());
    for (auto& p : trainable)
      if (p.grad().defined()) p.mutable_grad().zero_();
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    prog.record(step, total, loss_sum, lr(step), norm, secs, long(M) * o.microbatch_size * R, count_tokens(mbs, c), false,
                !o.quiet && (step % o.log_every == 0 || step + 1 == total));
    if (o.save_every > 0 && (step + 1) % o.save_every == 0 && step + 1 < total) checkpoint(step + 1);
  }
  checkpoint(total);
  if (!o.save.empty()) {  // (--lora: the merged weights, and the adapters alone under adapters/; --qat: model/quantized/)
    std::map<std::string, at::Tensor> adapters;
    mpx::quant::Unpacked whole(*m);  // --base-precision: the base as the adapters saw it
    std::filesystem::create_directories(o.save + (o.lora > 0 ? "/model/adapters" : "/model"));
    write_weights(o.save + "/model/model.safetensors", export_weights(o, m->named_weights(), adapters));
    if (!adapters.empty()) write_weights(o.save + "/model/adapters/model.safetensors", adapters, at::kFloat, false, adapter_metadata(o));
    if (!o.qat.empty()) write_quantized(o, o.save + "/model/quantized/model.safetensors", m->named_weights(), quantization_aware(*m));
  }
  if (data.eval && o.eval_samples > 0) std::cout << "held-out accuracy after training: " << describe(evaluate(m, *data.eval, tok, o.eval_samples)) << "\n";
  return 0;
}

}  // namespace moondream
