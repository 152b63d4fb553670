// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file examples/moondream/recipe.hpp
/// The recipe of `moondream_train`, shared by its layouts: the options (`Options`, the flags of
/// train.cpp), the data sets, deterministic initialisation by global parameter name (so every split starts
/// from the same weights) with the answer prior, which samples each step trains on, the learning-rate
/// schedule and the optimizer.

#include "data.hpp"       // moondream::JsonlVqa, collate
#include "shapes.hpp"     // moondream::ShapesVqa, kind_weights
#include "layouts.hpp"    // MOONDREAM_MICROBATCHES
#include "model.hpp"      // moondream::Config, Batch
#include "tokenizer.hpp"  // moondream::Tokenizer
#include "weights.hpp"    // moondream::read_weights, assign

#include <mpx/mpx.hpp>

#include <fmt/format.h>  // fmt::format
#include <torch/torch.h>

#include <cmath>       // std::sqrt, std::lround
#include <filesystem>  // std::filesystem
#include <map>      // std::map
#include <memory>   // std::unique_ptr
#include <set>      // std::set
#include <string>   // std::string
#include <vector>   // std::vector

namespace moondream
{

/// --lora-targets' default: every linear of the text decoder's blocks.
inline constexpr const char* default_lora_targets = R"(text\.blocks\.[0-9]+\.(attn\.(qkv|proj)|mlp\.(fc1|fc2)))";

struct Options
{
  std::string config = "tiny", weights, tokenizer = MOONDREAM_TOKENIZER_DIR;
  std::string data = "generated", eval_data;
  std::string layout = "2";      ///< 1 (one process, no mpx), 2 (vision | text), 4 (vision | text ×3), 2x2 (2 replicas × 2 stages),
                                 ///< 2b / 4b (2 / 4 slots balanced by the config's costs: costs.hpp)
                                 ///< with --tp 2, layouts 2 and 2x2 split the text stage over 2 ranks
  std::string schedule = "1f1b"; ///< gpipe, 1f1b, zbh1
  int microbatch_size = 8;       ///< samples per micro-batch; a step is MOONDREAM_MICROBATCHES micro-batches per replica
  long steps = 450;  // the demo: about 4 minutes of training on 2 cores (~60 samples/s)
  double epochs = 0;             ///< if > 0: steps = epochs × train samples / global batch
  double lr = 0;                 ///< 0: the recipe's (3e-6 fine-tuning with --weights), 5e-4 from scratch
  double warmup = 0.1;           ///< fraction of the steps
  double vision_lr_scale = 0.1;  ///< the vision encoder learns at lr × this (from scratch: at the full rate it loses the side of a shape)
  double weight_decay = 0.01, clip = 1.0;
  std::string optimizer = "adamw8bit";
  std::string precision = "fp32";
  bool checkpoint = false;        ///< activation checkpointing of every stage
  bool checkpoint_blocks = false; ///< activation checkpointing of every block of every stage
  std::string freeze_vision = "auto";  ///< auto: frozen when fine-tuning (--weights), trained from scratch
  std::string vision_forward_only = "on";  ///< a frozen vision stage is mpx::Frozen (forward only); off: it runs a backward (benchmarks)
  std::string save, resume;
  long save_every = 0;
  int max_restarts = 0;  ///< the launcher restarts the ranks after a failure; they resume from --save
  std::string checkpoint_checksums = "on";  ///< XXH3-64 of every checkpoint file, verified on load
  long eval_samples = 200, train_samples = 20000;
  int image_size = 0;             ///< generated images: 0 = the config's crop size
  std::string kinds = "color,shape,position,describe,count";  ///< generated questions: kinds asked, each optionally =weight
  std::uint64_t seed = 1;
  std::string metrics, plot;      ///< default: <save>/metrics.jsonl, <save>/loss.svg
  int timeout_s = 120;
  long log_every = 10;
  bool quiet = false;
  bool memory_report = false;     ///< each pipeline rank prints what it holds (memory_report.hpp)
  int emulate_replicas = 1;       ///< layout 1 only: compute a data-parallel run's global batch (its parity reference)
  int tp = 1;                     ///< tensor-parallel degree of the text stage (layouts 2 and 2x2)
  int vision_tp = 1;              ///< tensor-parallel degree of the vision stage (layouts 2 and 2x2)
  int shard = 0;                  ///< ZeRO level over the replicas (layout 2x2): 0 none, 1 optimizer state, 2 and gradients, 3 and weights
  std::string trace;              ///< a Chrome trace of the last step's actions on every rank (pipeline layouts)
  bool plan = false;              ///< print where layouts 2, 2b, 4 and 4b put the pieces and their predicted steps, then stop
  bool profile = false;           ///< every step's times on stderr (every rank)
  int lora = 0;                   ///< LoRA adapters of this rank instead of training every weight (lora.hpp); 0: off
  double lora_alpha = 0;          ///< the adapters' scale is alpha / rank; 0: alpha = rank
  double lora_dropout = 0;
  std::string lora_targets = default_lora_targets;
  std::string base_precision = "fp32";  ///< --lora: the frozen base's linears held as fp32 | bf16 | int8 | nf4 (quantize.hpp)
  std::string qat;                      ///< quantization-aware training of every trained linear: int4[/gN] | int8; empty: off
  std::string device_speeds;            ///< each device's relative speed for the plan: "1,0.5", "probe"; empty: equal (speeds.hpp)
  std::string rebalance = "off";        ///< off | report (name a device slower than planned) | on (and re-plan: 2b, 4b; speeds.hpp)
  std::string costs = "flops";          ///< the pieces' costs: flops (from the config) | measured (the encoder's time per FLOP timed; speeds.hpp)

  int microbatches() const { return MOONDREAM_MICROBATCHES; }
  bool train_vision() const { return freeze_vision == "off" || (freeze_vision == "auto" && weights.empty() && lora == 0); }
  double peak_lr() const { return lr > 0 ? lr : weights.empty() ? 5e-4 : lora > 0 ? 1e-4 : 3e-6; }
};

/// A file as the ranks compare it: its path, size and modification time ("-" when there is none).
inline std::string file_identity(const std::string& path)
{
  namespace fs = std::filesystem;
  std::error_code ec;
  if (path.empty()) return "-";
  if (!fs::is_regular_file(path, ec)) return path;
  const auto size = fs::file_size(path, ec);
  const auto when = fs::last_write_time(path, ec).time_since_epoch().count();
  return fmt::format("{} ({} bytes, modified {})", path, size, when);
}

/// What every rank must agree on before the first step (mpx::WorldOptions::settings): a rank started
/// with another flag or file stops every rank, naming the setting and both values.
inline mpx::RunSettings run_settings(const Options& o)
{
  const std::string data = o.data == "generated"
                               ? fmt::format("generated: {} samples, {} held out, image size {}, kinds {}", o.train_samples, o.eval_samples, o.image_size, o.kinds)
                               : file_identity(o.data);
  return {{"config", file_identity(o.config)}, {"weights", file_identity(o.weights)}, {"tokenizer", o.tokenizer},
          {"data", data}, {"eval-data", file_identity(o.eval_data)}, {"microbatch-size", std::to_string(o.microbatch_size)},
          {"seed", std::to_string(o.seed)}, {"steps", std::to_string(o.steps)}, {"epochs", fmt::format("{}", o.epochs)},
          {"lr", fmt::format("{}", o.lr)}, {"vision-lr-scale", fmt::format("{}", o.vision_lr_scale)}, {"warmup", fmt::format("{}", o.warmup)},
          {"weight-decay", fmt::format("{}", o.weight_decay)}, {"clip", fmt::format("{}", o.clip)}, {"optimizer", o.optimizer},
          {"precision", o.precision}, {"checkpoint", fmt::format("{} {}", o.checkpoint, o.checkpoint_blocks)},
          {"freeze-vision", o.freeze_vision}, {"resume", o.resume}, {"shard", std::to_string(o.shard)},
          {"lora", fmt::format("rank {} alpha {} dropout {} targets {}", o.lora, o.lora_alpha, o.lora_dropout, o.lora_targets)},
          {"base-precision", o.base_precision}, {"qat", o.qat}, {"device-speeds", o.device_speeds}, {"rebalance", o.rebalance}, {"costs", o.costs}};
}

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
    const auto weights = kind_weights(o.kinds);
    d.train = std::make_unique<ShapesVqa>(std::size_t(o.train_samples), o.seed, size, weights);
    d.eval = std::make_unique<ShapesVqa>(std::size_t(o.eval_samples), o.seed + 1000003, size, weights);  // another seed: disjoint
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

/// The recipe's optimizer over `params`. Those of them in `vision`, when others are not, form a second
/// parameter group at --vision-lr-scale × the first's rate (a balanced layout's stage that holds encoder
/// blocks beside decoder layers; mpx keeps a group's share of the rate: stage_optimizers.hpp).
inline std::unique_ptr<torch::optim::Optimizer> make_optimizer(const Options& o, const std::vector<at::Tensor>& params,
                                                               const std::set<const c10::TensorImpl*>& vision = {})
{
  std::vector<at::Tensor> first, second;
  for (auto& p : params) (vision.count(p.unsafeGetTensorImpl()) ? second : first).push_back(p);
  if (first.empty()) std::swap(first, second);  // one kind of parameter: one group (the stage's scale applies)
  std::unique_ptr<torch::optim::Optimizer> opt;
  auto adamw = [&](double lr) { return torch::optim::AdamWOptions(lr).betas({0.9, 0.95}).eps(1e-6).weight_decay(o.weight_decay); };
  auto sgd = [&](double lr) { return torch::optim::SGDOptions(lr).momentum(0.9).weight_decay(o.weight_decay); };
  if (o.optimizer == "adamw") opt = std::make_unique<mpx::FusedAdamW>(first, adamw(o.peak_lr()));
  else if (o.optimizer == "adamw8bit") opt = std::make_unique<mpx::AdamW8bitOptimizer>(first, adamw(o.peak_lr()));
  else if (o.optimizer == "sgd")  // for parity checks: rounding differences stay at their size (AdamW scales each to a full step)
    opt = std::make_unique<torch::optim::SGD>(first, sgd(o.peak_lr()));
  else throw mpx::config_error("moondream_train: --optimizer " + o.optimizer + " is not known; use adamw8bit (the recipe), adamw or sgd");
  const double lr = o.peak_lr() * o.vision_lr_scale;
  if (!second.empty())
    opt->add_param_group(o.optimizer == "sgd" ? torch::optim::OptimizerParamGroup(second, std::make_unique<torch::optim::SGDOptions>(sgd(lr)))
                                              : torch::optim::OptimizerParamGroup(second, std::make_unique<torch::optim::AdamWOptions>(adamw(lr))));
  return opt;
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
    auto ids = tok.encode(std::string(1, ' ').append(train.answer(i)));  // not " " + string: GCC 12 -Wstringop-overflow
    ids.push_back(c.tokenizer.eos_id);
    for (int id : ids)
      if (id >= 0 && id < c.text.vocab_size) acc[id] += 1;
  }
  const double floor = 1e-3;
  it->second.copy_(((counts + floor) / (counts.sum() + floor * double(c.text.vocab_size))).log().to(it->second.dtype()));
}

/// Puts `w` (global names) into the modules' parameters: from --weights, or the deterministic init
/// (with the answer prior on the output bias).
inline void initialise_weights(const Options& o, const Config& c, const std::map<std::string, at::Tensor>& w, const Dataset& train, const Tokenizer& tok)
{
  if (o.weights.empty()) init_weights(w, o.seed), init_answer_prior(w, train, tok, c);
  else assign(read_weights(o.weights, c), w);
}

/// `initialise_weights` of a module that may be tensor-parallel (Vision, Text): each split parameter is set whole,
/// then cut to this rank's shard, so every degree starts from layout 1's weights.
template <class M>
void initialise(const Options& o, const Config& c, M& m, const Dataset& train, const Tokenizer& tok)
{
  auto local = m.named_weights();
  const auto cuts = m.named_cuts();
  auto whole = local;
  for (auto& [n, s] : cuts) whole[n] = torch::empty(mpx::tp::whole_sizes(local[n], s, *m.tp_group), local[n].options());
  initialise_weights(o, c, whole, train, tok);
  torch::NoGradGuard ng;
  for (auto& [n, s] : cuts) local[n].copy_(mpx::tp::shard(whole[n], s, *m.tp_group));
}

/// A module's weights whole, under global names: cut ones gathered over its tensor-parallel group (a
/// collective over that group: each of its ranks calls it).
template <class M>
std::map<std::string, at::Tensor> whole_weights(M& m)
{
  auto w = m.named_weights();
  for (auto& [n, s] : m.named_cuts()) w[n] = mpx::tp::unshard(w[n], s, *m.tp_group);
  return w;
}

/// The checkpoint to start from: after a restart (the launcher's TORCHELASTIC_RESTART_COUNT) the newest one
/// under --save when there is one, else --resume's (`<dir>/checkpoint` when it exists, else `<dir>` itself:
/// a checkpoint root or one step's directory), else none.
inline std::string resume_from(const Options& o, const mpx::Env& env)
{
  namespace fs = std::filesystem;
  if (env.restart_count > 0 && !o.save.empty() && fs::exists(o.save + "/checkpoint/latest")) return o.save + "/checkpoint";
  if (o.resume.empty()) return {};
  return fs::exists(o.resume + "/checkpoint") ? o.resume + "/checkpoint" : o.resume;
}

}  // namespace moondream
