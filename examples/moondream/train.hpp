// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file examples/moondream/train.hpp
/// What `moondream_train` does, shared by its layouts: options, data, deterministic initialisation,
/// evaluation (greedy answers on held-out questions), metrics, the loss-curve plot, and `train<P>` — one
/// pipeline type trained across ranks with mpx — next to `train_single`, the same training in one process
/// with plain LibTorch (the parity reference).

#include "data.hpp"       // moondream::ShapesVqa, JsonlVqa, collate
#include "layouts.hpp"    // MOONDREAM_MICROBATCHES
#include "model.hpp"      // moondream::Vision, Text, Moondream
#include "tokenizer.hpp"  // moondream::Tokenizer
#include "weights.hpp"    // moondream::read_weights, write_weights

#include <mpx/mpx.hpp>

#include <fmt/format.h>  // fmt::format
#include <torch/torch.h>

#include <chrono>      // std::chrono
#include <filesystem>  // std::filesystem
#include <fstream>     // std::ofstream
#include <iostream>    // std::cout
#include <map>         // std::map
#include <memory>      // std::unique_ptr
#include <string>      // std::string
#include <thread>      // std::this_thread
#include <vector>      // std::vector


namespace moondream
{

struct Options
{
  std::string config = "tiny", weights, tokenizer = MOONDREAM_TOKENIZER_DIR;
  std::string data = "generated", eval_data;
  std::string layout = "2";      ///< 1 (one process, no mpx), 2 (vision | text), 4 (vision | text ×3), 2x2 (2 replicas × 2 stages)
  std::string schedule = "1f1b"; ///< gpipe, 1f1b, zbh1
  int microbatch_size = 8;       ///< samples per micro-batch; a step is MOONDREAM_MICROBATCHES micro-batches per replica
  long steps = 450;  // the demo: about 4 minutes of training on 2 cores (~60 samples/s)
  double epochs = 0;             ///< if > 0: steps = epochs × train samples / global batch
  double lr = 0;                 ///< 0: the recipe's (3e-6 fine-tuning with --weights), 5e-4 from scratch
  double warmup = 0.1;           ///< fraction of the steps
  double vision_lr_scale = 1;    ///< the vision stage's learning rate is lr × this
  double weight_decay = 0.01, clip = 1.0;
  std::string optimizer = "adamw8bit";
  std::string precision = "fp32";
  bool checkpoint = false;        ///< activation checkpointing of every stage
  bool checkpoint_blocks = false; ///< activation checkpointing of every block of every stage
  std::string freeze_vision = "auto";  ///< auto: frozen when fine-tuning (--weights), trained from scratch
  std::string save, resume;
  long save_every = 0;
  long eval_samples = 200, train_samples = 20000;
  int image_size = 0;             ///< generated images: 0 = the config's crop size
  std::uint64_t seed = 1;
  std::string metrics, plot;      ///< default: <save>/metrics.jsonl, <save>/loss.svg
  int timeout_s = 120;
  long log_every = 10;
  bool quiet = false;
  int emulate_replicas = 1;       ///< layout 1 only: compute a data-parallel run's global batch (its parity reference)

  int microbatches() const { return MOONDREAM_MICROBATCHES; }
  bool train_vision() const { return freeze_vision == "off" || (freeze_vision == "auto" && weights.empty()); }
  double peak_lr() const { return lr > 0 ? lr : weights.empty() ? 5e-4 : 3e-6; }
};

/// The training and held-out sets.
struct Data
{
  std::unique_ptr<Dataset> train, eval;
};

inline Data make_data(const Options& o, const Config& c)
{
  Data d;
  if (o.data == "generated") {
    const int size = o.image_size > 0 ? o.image_size : c.vision.crop_size;
    d.train = std::make_unique<ShapesVqa>(std::size_t(o.train_samples), o.seed, size);
    d.eval = std::make_unique<ShapesVqa>(std::size_t(o.eval_samples), o.seed + 1000003, size);  // another seed: disjoint
  } else {
    d.train = std::make_unique<JsonlVqa>(o.data);
    if (!o.eval_data.empty()) d.eval = std::make_unique<JsonlVqa>(o.eval_data);
  }
  return d;
}

/// A 2-D sine-cosine table for a (grid x grid) patch grid, (1, grid², dim): the first half of the dims
/// encodes the row, the second the column, each as sin and cos at geometric frequencies (as MAE's fixed
/// position embedding). A from-scratch ViT then knows where each patch is from its first step.
inline at::Tensor sincos_2d(int64_t grid, int64_t dim)
{
  const int64_t quarter = dim / 4;
  auto omega = torch::pow(10000.0, -torch::arange(quarter, torch::kDouble) / double(std::max<int64_t>(1, quarter)));  // (dim/4)
  auto pos = torch::arange(grid, torch::kDouble);
  auto y = pos.repeat_interleave(grid).unsqueeze(1) * omega.unsqueeze(0), x = pos.repeat({grid}).unsqueeze(1) * omega.unsqueeze(0);
  auto t = torch::cat({y.sin(), y.cos(), x.sin(), x.cos()}, 1);                                       // (grid², 4·(dim/4))
  return torch::nn::functional::pad(t, torch::nn::functional::PadFuncOptions({0, dim - t.size(1)})).unsqueeze(0).to(torch::kFloat);
}

/// Deterministic initialisation by global parameter name, so any split of the model starts from the same
/// weights: Linear weights and embeddings N(0, 0.02), biases 0, LayerNorm 1 and 0, and the vision
/// position embedding a 2-D sine-cosine table (scaled by 0.5; still trained).
inline void init_weights(const std::map<std::string, at::Tensor>& w, std::uint64_t seed)
{
  torch::NoGradGuard ng;
  for (auto& [n, p] : w) {
    const bool ln = n.find("ln") != std::string::npos;  // ln, ln1, ln2, post_ln
    if (n == "vision.pos_emb" && p.dim() == 3) {
      const auto g = int64_t(std::lround(std::sqrt(double(p.size(1)))));
      if (g * g == p.size(1)) { p.copy_(sincos_2d(g, p.size(2)) * 0.5); continue; }
    }
    if (n.ends_with(".bias")) p.zero_();
    else if (ln) p.fill_(1.0);
    else {
      auto g = at::make_generator<at::CPUGeneratorImpl>(seed ^ std::hash<std::string>{}(n));
      p.copy_(torch::randn(p.sizes(), g) * 0.02);
    }
  }
}

/// The global batch's samples of `step` for this replica, as `m` micro-batches of `mb` samples.
inline std::vector<std::vector<std::size_t>> step_indices(std::size_t n, long step, int m, int mb, int replicas, int replica, std::uint64_t seed)
{
  mpx::DistributedSampler s{n, replicas, replica, true, seed};
  const std::size_t per_step = std::size_t(m) * std::size_t(mb), per_epoch = s.per_replica();
  std::vector<std::vector<std::size_t>> out(static_cast<std::size_t>(m));
  std::size_t k = std::size_t(step) * per_step;
  std::vector<std::size_t> idx;
  std::uint64_t epoch = ~0ull;
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < mb; ++j, ++k) {
      if (k / per_epoch != epoch) epoch = k / per_epoch, idx = s.indices(epoch);
      out[std::size_t(i)].push_back(idx[k % per_epoch]);
    }
  return out;
}

inline std::vector<Batch> make_microbatches(const Dataset& d, const std::vector<std::vector<std::size_t>>& idx, const Tokenizer& tok, const Config& c)
{
  std::vector<Batch> out;
  for (auto& mb : idx) {
    std::vector<Sample> s;
    for (auto i : mb) s.push_back(d.get(i));
    out.push_back(collate(s, tok, c));
  }
  return out;
}

/// Held-out accuracy: greedy answers (up to 16 tokens) compared with the reference after trimming.
struct Accuracy
{
  double overall = 0, chance = 0;
  std::map<std::string, std::pair<int, int>> by_kind;  // kind → (correct, total)
  long n = 0;
};

inline std::string trim(std::string s)
{
  const auto b = s.find_first_not_of(" \n\t"), e = s.find_last_not_of(" \n\t");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

inline Accuracy evaluate(Moondream& m, const Dataset& d, const Tokenizer& tok, long n)
{
  Accuracy a;
  m->eval();
  std::map<std::string, std::map<std::string, int>> answers;  // kind → answer → count (for the chance level)
  n = std::min<long>(n, long(d.size()));
  for (long i = 0; i < n; ++i) {
    auto s = d.get(std::size_t(i));
    auto b = collate({s}, tok, m->cfg);
    auto cache = m->encode_image(b.crops, b.tiling);
    auto p = prompt_ids(tok, s.question);
    auto out = m->generate(std::move(cache), std::vector<int64_t>(p.begin(), p.end()), 16);
    auto got = trim(tok.decode(std::vector<int>(out.begin(), out.end())));
    const bool ok = got == trim(s.answer);
    auto& k = a.by_kind[s.kind];
    k.first += ok, k.second += 1;
    a.overall += ok;
    ++answers[s.kind][trim(s.answer)];
  }
  a.n = n;
  a.overall /= double(std::max(1L, n));
  for (auto& [kind, counts] : answers) {  // the best constant answer per question kind
    int best = 0;
    for (auto& [ans, c] : counts) best = std::max(best, c);
    a.chance += double(best) / double(std::max(1L, n));
  }
  return a;
}

inline std::string describe(const Accuracy& a)
{
  std::string s = fmt::format("{:.1f}% of {} (best constant answer per question kind: {:.1f}%)", 100 * a.overall, a.n, 100 * a.chance);
  for (auto& [k, v] : a.by_kind)
    if (!k.empty()) s += fmt::format("; {} {}/{}", k, v.first, v.second);
  return s;
}

/// One line of metrics and the progress line.
struct Progress
{
  std::ofstream metrics;
  std::vector<double> losses;
  std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
  long first_step = 0;

  void open(const std::string& path, bool append)
  {
    if (path.empty()) return;
    std::filesystem::create_directories(std::filesystem::path(path).parent_path().empty() ? "." : std::filesystem::path(path).parent_path());
    metrics.open(path, append ? std::ios::app : std::ios::trunc);
  }
  void record(long step, long total, double loss, double lr, double grad_norm, double seconds, long samples, long tokens, bool skipped, bool print)
  {
    losses.push_back(loss);
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double per_step = elapsed / double(step + 1 - first_step);
    if (metrics.is_open())
      metrics << fmt::format(R"({{"step": {}, "loss": {:.8g}, "lr": {:.6g}, "grad_norm": {:.6g}, "seconds": {:.4f}, "samples_per_s": {:.3f}, "tokens_per_s": {:.2f}, "skipped": {}}})",
                             step, loss, lr, grad_norm, seconds, samples / seconds, tokens / seconds, skipped ? "true" : "false")
              << "\n" << std::flush;
    if (print) {
      const long eta = long(per_step * double(total - step - 1));
      std::cout << fmt::format("step {:>5}/{}  loss {:.4f}  lr {:.2e}  {:.1f} samples/s  {:.0f} tokens/s  ETA {}m{:02}s{}\n", step + 1, total, loss, lr,
                               samples / seconds, tokens / seconds, eta / 60, eta % 60, skipped ? "  (skipped: inf/NaN)" : "")
                << std::flush;
    }
  }
};

/// A small SVG of the loss per step.
inline void write_plot(const std::string& path, const std::vector<double>& losses, long first_step)
{
  if (path.empty() || losses.empty()) return;
  const double W = 640, H = 360, pad = 40;
  double lo = losses[0], hi = losses[0];
  for (double l : losses) lo = std::min(lo, l), hi = std::max(hi, l);
  if (hi - lo < 1e-9) hi = lo + 1;
  std::string pts;
  for (std::size_t i = 0; i < losses.size(); ++i) {
    const double x = pad + (W - 2 * pad) * double(i) / double(std::max<std::size_t>(1, losses.size() - 1));
    const double y = H - pad - (H - 2 * pad) * (losses[i] - lo) / (hi - lo);
    pts += fmt::format("{:.1f},{:.1f} ", x, y);
  }
  std::ofstream f(path);
  f << fmt::format(R"(<svg xmlns="http://www.w3.org/2000/svg" width="{0}" height="{1}" font-family="sans-serif" font-size="12">
<rect width="{0}" height="{1}" fill="white"/>
<line x1="{2}" y1="{3}" x2="{4}" y2="{3}" stroke="black"/><line x1="{2}" y1="{2}" x2="{2}" y2="{3}" stroke="black"/>
<text x="{2}" y="{5}">loss {6:.3f}</text><text x="{2}" y="{7}">{8:.3f}</text>
<text x="{4}" y="{9}" text-anchor="end">step {10}</text><text x="{2}" y="{9}">step {11}</text>
<polyline fill="none" stroke="steelblue" stroke-width="1.5" points="{12}"/>
</svg>
)",
                   W, H, pad, H - pad, W - pad, pad - 8, hi, H - pad + 14, lo, H - pad + 28, first_step + long(losses.size()), first_step + 1, pts);
}

/// Tokens the decoder processes in these micro-batches: batch × (image prefix + text tokens).
inline long count_tokens(const std::vector<Batch>& mbs, const Config& c)
{
  long n = 0;
  for (auto& b : mbs) n += long(b.tokens.size(0)) * (c.prefix() + long(b.tokens.size(1)));
  return n;
}

inline long resolve_steps(const Options& o, const Data& d, int replicas)
{
  if (o.epochs <= 0) return o.steps;
  const double per_step = double(o.microbatch_size) * o.microbatches() * replicas;
  return std::max(1L, long(o.epochs * double(d.train->size()) / per_step));
}

inline mpx::WarmupCosine schedule_of(const Options& o, long steps)
{
  return mpx::WarmupCosine{o.peak_lr(), long(o.warmup * double(steps)), steps, 0.1};
}

inline std::unique_ptr<torch::optim::Optimizer> make_optimizer(const Options& o, const std::vector<at::Tensor>& params)
{
  auto opts = torch::optim::AdamWOptions(o.peak_lr()).betas({0.9, 0.95}).eps(1e-6).weight_decay(o.weight_decay);
  if (o.optimizer == "adamw") return std::make_unique<torch::optim::AdamW>(params, opts);
  if (o.optimizer == "adamw8bit") return std::make_unique<mpx::AdamW8bitOptimizer>(params, opts);
  throw mpx::config_error("moondream_train: --optimizer " + o.optimizer + " is not known; use adamw8bit (the recipe) or adamw");
}

}  // namespace moondream

namespace moondream
{

/// Balanced layer ranges of the decoder over `parts` stages.
inline std::vector<std::pair<int, int>> split_layers(int layers, int parts)
{
  if (layers < parts)
    throw mpx::config_error(fmt::format("moondream_train: the decoder has {} layers, too few for {} text stages; choose a smaller layout", layers, parts));
  std::vector<std::pair<int, int>> r;
  for (int i = 0; i < parts; ++i) r.emplace_back(layers * i / parts, layers * (i + 1) / parts);
  return r;
}

/// From scratch, the output bias starts at the log-frequency of the answer tokens (and EOS) of the first
/// 2000 training samples, every other token at a floor far below: the decoder then knows the answer
/// vocabulary from step 1 instead of spending its first hundred steps learning it through a 51,200-way
/// softmax (measured: loss 1.4 instead of 8.8 after 25 steps). Every rank computes the same values.
inline void init_answer_prior(const std::map<std::string, at::Tensor>& w, const Dataset& train, const Tokenizer& tok, const Config& c)
{
  auto it = w.find("text.lm_head.bias");
  if (it == w.end()) return;
  torch::NoGradGuard ng;
  auto counts = torch::zeros({c.text.vocab_size}, torch::kDouble);
  auto acc = counts.accessor<double, 1>();
  for (std::size_t i = 0; i < std::min<std::size_t>(2000, train.size()); ++i) {
    auto ids = tok.encode(" " + train.answer(i));
    ids.push_back(c.tokenizer.eos_id);
    for (int id : ids)
      if (id >= 0 && id < c.text.vocab_size) acc[id] += 1;
  }
  const double floor = 1e-3;
  it->second.copy_(((counts + floor) / (counts.sum() + floor * double(c.text.vocab_size))).log().to(it->second.dtype()));
}

/// Puts `w` (global names) into the modules' parameters: from --weights, or the deterministic init
/// (with the answer prior on the output bias).
inline void initialise(const Options& o, const Config& c, const std::map<std::string, at::Tensor>& w, const Dataset& train, const Tokenizer& tok)
{
  if (o.weights.empty()) init_weights(w, o.seed), init_answer_prior(w, train, tok, c);
  else assign(read_weights(o.weights, c), w);
}

/// A rendezvous through the store that may wait long (evaluation on rank 0): every rank sets its key,
/// then waits for all of them.
inline void store_barrier(mpx::World& w, std::string tag, std::chrono::milliseconds timeout)
{
  static long count = 0;  // every rank passes the same barriers in the same order: keys are never reused
  tag += "#" + std::to_string(count++);
  w.store->set("moondream/" + tag + "/" + std::to_string(w.env.rank), std::vector<uint8_t>{1});
  std::vector<std::string> keys;
  for (int r = 0; r < w.env.world_size; ++r) keys.push_back("moondream/" + tag + "/" + std::to_string(r));
  w.store->wait(keys, timeout);
}

/// Trains pipeline type P (stage 0 the vision encoder, stages 1.. text ranges) on this rank.
template <class P>
int train_pipeline(const Options& o)
{
  using namespace std::chrono_literals;
  const auto env = mpx::read_env();
  const bool lead = env.rank == 0;
  const Config c = load_config(o.config);
  mpx::check_blas();
  mpx::WorldOptions wo;
  wo.timeout = std::chrono::milliseconds(long(o.timeout_s) * 1000);
  wo.allow_cpu = true;
  auto world = mpx::make_world<P>(env, wo);
  const auto tok = Tokenizer::load(o.tokenizer);
  Data data = make_data(o, c);
  const long total = resolve_steps(o, data, world.replicas);
  const auto ranges = split_layers(c.text.n_layers, P::num_stages - 1);
  if (lead) {
    std::cout << fmt::format("moondream_train: config {} ({} vision + {} text layers), layout {}, {} ranks, {} on {}\n", c.name,
                             c.vision.enc_n_layers, c.text.n_layers, o.layout, env.world_size, P::schedule::name,
                             world.device.is_cuda() ? "CUDA" : "CPU (no CUDA here: this example opts into running GPU<i> stages on CPU ranks)");
    std::cout << mpx::print<P>;
    for (int i = 1; i < P::num_stages; ++i) std::cout << fmt::format("  stage {}: text layers [{}, {})\n", i, ranges[i - 1].first, ranges[i - 1].second);
    std::cout << fmt::format("  vision: {}; optimizer {}; precision {}; activation checkpointing {}; global batch {} = {} micro-batches x {} samples x {} replicas\n",
                             o.train_vision() ? "trained" : "frozen", o.optimizer, o.precision, o.checkpoint ? "stages" : o.checkpoint_blocks ? "blocks" : "off",
                             o.microbatches() * o.microbatch_size * world.replicas, o.microbatches(), o.microbatch_size, world.replicas);
  }
  auto make = [&](auto stage) {
    constexpr int I = decltype(stage)::value;
    if constexpr (I == 0) {
      Vision v(c);
      initialise(o, c, v->named_weights(), *data.train, tok);
      if (!o.train_vision())
        for (auto& p : v->parameters()) p.requires_grad_(false);
      return v;
    } else {
      Text t(c, ranges[I - 1].first, ranges[I - 1].second);
      initialise(o, c, t->named_weights(), *data.train, tok);
      return t;
    }
  };
  mpx::TrainOptions to;
  to.lr = schedule_of(o, total);
  to.weight_decay = o.weight_decay, to.beta1 = 0.9, to.beta2 = 0.95, to.eps = 1e-6;
  to.clip_norm = o.clip;
  to.lr_scale = {o.vision_lr_scale};  // stage 0 is the vision tower in every layout
  to.checkpoint_all = o.checkpoint;
  to.checkpoint_blocks = o.checkpoint_blocks;
  if (o.checkpoint && o.checkpoint_blocks)
    throw mpx::config_error("moondream_train: --checkpoint (whole stages) and --checkpoint-blocks exclude each other; keep one");
  if (o.precision == "bf16") to.autocast = at::kBFloat16;
  else if (o.precision != "fp32") throw mpx::config_error("moondream_train: --precision " + o.precision + " on CPU: use fp32 or bf16");
  if (o.optimizer != "adamw8bit")  // the stages declare the recipe's Optimizer<AdamW8bit>; --optimizer adamw replaces it
    to.make_optimizer = [&o](int, const std::vector<at::Tensor>& params) { return make_optimizer(o, params); };
  auto input = [](const Batch& b) { return b.crops; };
  mpx::Trainer<P, Batch> trainer(world, make, input, answer_loss, to);

  const std::string save = o.save;
  const std::string scratch = save.empty() ? (std::filesystem::temp_directory_path() / ("moondream_eval_" + std::to_string(env.master_port))).string() : save;
  auto export_model = [&](const std::string& dir) {  // each stage of replica 0 writes its weights under global names
    if (lead) std::filesystem::create_directories(dir);
    store_barrier(world, "mkdir/" + dir, wo.timeout);
    if (world.replica == 0)
      [&]<std::size_t... I>(std::index_sequence<I...>) {
        ((trainer.holds(int(I)) ? (write_weights(dir + "/stage" + std::to_string(I) + ".safetensors", trainer.template module<int(I)>()->named_weights()), 0) : 0), ...);
      }(std::make_index_sequence<P::num_stages>{});
    store_barrier(world, "export/" + dir, wo.timeout);
  };
  auto eval = [&](const char* when) {
    if (!data.eval || o.eval_samples <= 0) return;
    const std::string dir = scratch + "/model";
    export_model(dir);
    if (lead) {
      Moondream full(c);
      assign(read_weights(dir, c), full->named_weights());
      std::cout << "held-out accuracy " << when << ": " << describe(evaluate(full, *data.eval, tok, o.eval_samples)) << "\n" << std::flush;
    }
    store_barrier(world, std::string("eval/") + when + std::to_string(trainer.steps_done()), std::chrono::hours(2));
  };
  if (!o.resume.empty()) {
    trainer.load(o.resume + "/checkpoint");
    if (lead) std::cout << "resumed from " << o.resume << "/checkpoint at step " << trainer.steps_done() << "\n";
  }
  const long start = trainer.steps_done();
  if (start == 0) eval("before training");
  Progress prog;
  prog.first_step = start;
  const std::string metrics = !o.metrics.empty() ? o.metrics : save.empty() ? "" : save + "/metrics.jsonl";
  if (lead) prog.open(metrics, start > 0);
  auto checkpoint = [&] {
    if (save.empty()) return;
    trainer.save(save + "/checkpoint");
    export_model(save + "/model");
    if (lead) std::cout << "saved " << save << "/checkpoint and " << save << "/model at step " << trainer.steps_done() << "\n";
  };
  for (long step = start; step < total; ++step) {
    auto idx = step_indices(data.train->size(), step, o.microbatches(), o.microbatch_size, world.replicas, world.replica, o.seed);
    auto mbs = make_microbatches(*data.train, idx, tok, c);
    const auto st = trainer.step(mbs);
    if (std::getenv("MOONDREAM_PROFILE"))
      std::cerr << fmt::format("rank {} step {}: {:.3f} s, compute {:.3f} s, waits {:.3f} s, schedule {:.3f} s, optimizer {:.3f} s\n", env.rank,
                               step, st.seconds, st.compute_seconds, st.wait_seconds, st.schedule_seconds, st.optimizer_seconds);
    if (lead) {
      const long samples = long(o.microbatches()) * o.microbatch_size * world.replicas;
      prog.record(step, total, st.loss, st.lr, st.grad_norm, st.seconds, samples, count_tokens(mbs, c) * world.replicas, st.skipped,
                  !o.quiet && (step % o.log_every == 0 || step + 1 == total));
    }
    if (o.save_every > 0 && (step + 1) % o.save_every == 0 && step + 1 < total) checkpoint();
  }
  checkpoint();
  eval("after training");
  if (lead) {
    const std::string plot = !o.plot.empty() ? o.plot : save.empty() ? "" : save + "/loss.svg";
    write_plot(plot, prog.losses, start);
    if (!plot.empty()) std::cout << "loss curve: " << plot << (metrics.empty() ? "" : ", metrics: " + metrics) << "\n";
  }
  return 0;
}

/// The same training in one process with plain LibTorch: the parity reference (layout 1).
inline int train_single(const Options& o)
{
  const Config c = load_config(o.config);
  mpx::check_blas();
  mpx::keep_host_memory();  // as make_world does for the pipeline ranks
  const auto tok = Tokenizer::load(o.tokenizer);
  Data data = make_data(o, c);
  const long total = resolve_steps(o, data, o.emulate_replicas);
  Moondream m(c);
  initialise(o, c, m->named_weights(), *data.train, tok);
  std::vector<at::Tensor> trainable;
  for (auto& [n, p] : m->named_weights()) {
    if (n.rfind("vision.", 0) == 0 && !o.train_vision()) p.requires_grad_(false);
    if (p.requires_grad()) trainable.push_back(p);
  }
  // one optimizer per stage, as the pipeline has: vision, then text (AdamW's state is per tensor either way)
  std::vector<at::Tensor> vis, txt;
  for (auto& [n, p] : m->vision->named_weights())
    if (p.requires_grad()) vis.push_back(p);
  for (auto& [n, p] : m->text->named_weights()) txt.push_back(p);
  std::vector<std::unique_ptr<torch::optim::Optimizer>> opts;
  if (!vis.empty()) opts.push_back(make_optimizer(o, vis));
  opts.push_back(make_optimizer(o, txt));
  std::optional<mpx::AutocastGuard> autocast;
  if (o.precision == "bf16") autocast.emplace(c10::DeviceType::CPU, true, at::kBFloat16);
  const auto lr = schedule_of(o, total);
  std::cout << fmt::format("moondream_train: config {}, layout 1 (one process, plain LibTorch), {} steps\n", c.name, total);
  if (data.eval && o.eval_samples > 0) std::cout << "held-out accuracy before training: " << describe(evaluate(m, *data.eval, tok, o.eval_samples)) << "\n";
  m->train();
  Progress prog;
  const std::string metrics = !o.metrics.empty() ? o.metrics : o.save.empty() ? "" : o.save + "/metrics.jsonl";
  prog.open(metrics, false);
  const int M = o.microbatches();
  for (long step = 0; step < total; ++step) {
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
    if (std::getenv("MOONDREAM_PROFILE"))
      std::cerr << fmt::format("data {:.3f} s, forward+backward {:.3f} s, optimizer {:.3f} s\n", std::chrono::duration<double>(t1 - t0).count(),
                               std::chrono::duration<double>(t2 - t1).count(), std::chrono::duration<double>(std::chrono::steady_clock::now() - t2).count());
    for (auto& p : trainable)
      if (p.grad().defined()) p.mutable_grad().zero_();
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    prog.record(step, total, loss_sum, lr(step), norm, secs, long(M) * o.microbatch_size * R, count_tokens(mbs, c), false,
                !o.quiet && (step % o.log_every == 0 || step + 1 == total));
  }
  if (!o.save.empty()) {
    std::filesystem::create_directories(o.save + "/model");
    write_weights(o.save + "/model/model.safetensors", m->named_weights());
  }
  if (data.eval && o.eval_samples > 0) std::cout << "held-out accuracy after training: " << describe(evaluate(m, *data.eval, tok, o.eval_samples)) << "\n";
  return 0;
}

}  // namespace moondream
