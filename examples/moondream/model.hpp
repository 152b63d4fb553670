// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file examples/moondream/model.hpp
/// The moondream model as ordinary single-device LibTorch modules (moondream-spec.md §1–3):
/// - `Vision`: crops → patches → ViT blocks (sequential pre-norm) → global crop ⊕ stitched, pooled local
///   crops → projection MLP: (B, grid², text dim) image embeddings. One pipeline stage.
/// - `Text`: a range [begin, end) of the Phi-style decoder (parallel attention + MLP, one LayerNorm,
///   partial rotary, bidirectional prefix then causal): range 0 embeds [BOS, image, tokens], the last
///   range applies post_ln + lm_head (with bias, untied). Any range is one pipeline stage.
/// - `Moondream`: both, whole, for one process (the parity reference, evaluation and `moondream_query`),
///   with a key/value cache for decoding.
/// The projections are written with mpx's tensor-parallel blocks (docs/07): built in a group of one they are
/// plain linear layers; a `Text` stage built under `mpx::TensorParallel<N>` splits its attention by heads
/// (query and key/value heads alike), its MLP by columns then rows, and its embedding and head by
/// vocabulary (the loss is `mpx::tp::cross_entropy`: the full logits are never gathered).
/// Parameter names follow the "new" (state-dict) naming scheme of the reference: `vision.blocks.3.attn.qkv.weight`,
/// `text.blocks.7.mlp.fc1.bias`, ... (`named_weights()` gives them with global block indices).
/// Shape legend: B batch, N crops, C channels, S crop side, G grid (patches per side), P = G² patches,
/// E vision width, D text width, T sequence, L text tokens, H heads, K kv heads, h head dim, V vocabulary.

#include "config.hpp"  // moondream::Config
#include "image.hpp"   // moondream::patchify, reconstruct, pool_tokens

#include <boost/hana/define_struct.hpp>  // BOOST_HANA_DEFINE_STRUCT
#include <mpx/runtime/activation_checkpoint.hpp>    // mpx::checkpoint_block (a plain call unless a stage checkpoints blocks)
#include <mpx/torch/shaped.hpp>          // mpx::Ranked: a boundary's declared rank
#include <mpx/tp.hpp>                    // mpx::tp::ColumnLinear, RowLinear, vocab_embedding, cross_entropy
#include <torch/torch.h>                 // torch::nn

#include <algorithm>  // std::none_of
#include <cmath>   // std::sqrt, std::pow
#include <map>     // std::map
#include <string>  // std::string
#include <vector>  // std::vector

namespace moondream
{

/// One (micro-)batch of visual questions; every field has the batch first. Padding: crops beyond a
/// sample's 1 + rows·cols are zero; tokens are right-padded with EOS; targets are -100 where no loss is taken.
struct Batch
{
  BOOST_HANA_DEFINE_STRUCT(Batch,
                           (torch::Tensor, crops),    // (B, N, C, S, S) float in [-1, 1]
                           (torch::Tensor, tiling),   // (B, 2) int64: rows, cols of the local crops
                           (torch::Tensor, tokens),   // (B, L) int64: prompt then answer (+ EOS)
                           (torch::Tensor, targets)); // (B, L) int64: tokens[i] where i is an answer token, else -100
};

inline constexpr int64_t ignore_index = -100;

namespace detail
{
inline torch::Tensor gelu(const torch::Tensor& x) { return torch::gelu(x, "tanh"); }
inline torch::nn::LayerNorm layer_norm(int d) { return torch::nn::LayerNorm(torch::nn::LayerNormOptions({d}).eps(1e-5)); }

/// A parameter's global name: `prefix` + its name in the module, with "blocks.i." renumbered from `first_block`.
inline std::string global_name(std::string k, const std::string& prefix, int first_block)
{
  if (k.rfind("blocks.", 0) == 0) {
    const auto dot = k.find('.', 7);
    k = "blocks." + std::to_string(first_block + std::stoi(k.substr(7, dot - 7))) + k.substr(dot);
  }
  return prefix + k;
}

/// Every parameter of `m` under its global name.
inline std::map<std::string, torch::Tensor> named_weights(const torch::nn::Module& m, const std::string& prefix, int first_block)
{
  std::map<std::string, torch::Tensor> out;
  for (auto& p : m.named_parameters()) out[global_name(p.key(), prefix, first_block)] = p.value();
  return out;
}

/// How each tensor-parallel parameter of `m` is cut, under its global name (empty in a group of one).
inline std::map<std::string, mpx::tp::Cut> named_cuts(const torch::nn::Module& m, const std::string& prefix, int first_block)
{
  std::map<std::string, mpx::tp::Cut> out;
  for (auto& [n, s] : mpx::tp::cut_parameters(m)) out[global_name(n, prefix, first_block)] = s;
  return out;
}
}  // namespace detail

/// fc1 → GELU(tanh) → fc2; under tensor parallelism fc1 is split by columns, fc2 by rows.
struct MlpImpl : torch::nn::Module
{
  MlpImpl(int in, int hidden, int out)
      : fc1(register_module("fc1", mpx::tp::ColumnLinear(in, hidden))), fc2(register_module("fc2", mpx::tp::RowLinear(hidden, out)))
  {
  }
  torch::Tensor forward(const torch::Tensor& x) { return fc2(detail::gelu(fc1(x))); }
  mpx::tp::ColumnLinear fc1;
  mpx::tp::RowLinear fc2;
};
TORCH_MODULE(Mlp);

/// Fused qkv (the widths of Q, K and V, each split by heads under tensor parallelism; key/value heads
/// fewer than the ranks are shared) and the output projection (split by rows); the attention itself is
/// computed by the block.
struct AttnImpl : torch::nn::Module
{
  AttnImpl(int dim, int head_dim, int heads, int kv_heads)
      : qkv(register_module("qkv", mpx::tp::ColumnLinear(mpx::tp::ColumnLinearOptions(dim, int64_t(heads + 2 * kv_heads) * head_dim)
                                                             .parts({int64_t(heads) * head_dim, int64_t(kv_heads) * head_dim, int64_t(kv_heads) * head_dim})
                                                             .units({heads, kv_heads, kv_heads})))),
        proj(register_module("proj", mpx::tp::RowLinear(dim, dim)))
  {
  }
  mpx::tp::ColumnLinear qkv;
  mpx::tp::RowLinear proj;
};
TORCH_MODULE(Attn);

/// softmax(q kᵀ / √h, masked) v; q (B,H,T,h), k and v (B,H,Tk,h); mask (T,Tk) bool, true = may attend.
inline torch::Tensor attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, const torch::Tensor& mask = {})
{
  auto s = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(double(q.size(-1)));
  if (mask.defined()) s = s.masked_fill(mask.logical_not(), -std::numeric_limits<float>::infinity());
  return torch::matmul(torch::softmax(s, -1), v);
}

// ---- Vision ----------------------------------------------------------------------------------------

struct VisionBlockImpl : torch::nn::Module
{
  explicit VisionBlockImpl(const VisionConfig& c)
      : heads(c.enc_n_heads),
        ln1(register_module("ln1", detail::layer_norm(c.enc_dim))),
        attn(register_module("attn", Attn(c.enc_dim, c.enc_dim / c.enc_n_heads, c.enc_n_heads, c.enc_n_heads))),
        ln2(register_module("ln2", detail::layer_norm(c.enc_dim))),
        mlp(register_module("mlp", Mlp(c.enc_dim, c.enc_ff_dim, c.enc_dim)))
  {
  }
  torch::Tensor forward(torch::Tensor x_NPE)
  {
    const auto N = x_NPE.size(0), P = x_NPE.size(1), h = x_NPE.size(2) / heads;
    auto qkv = attn->qkv(ln1(x_NPE)).chunk(3, -1);  // [q | k | v], each head-major (this rank's heads)
    auto split = [&](const torch::Tensor& t) { return t.view({N, P, -1, h}).transpose(1, 2); };
    auto y = attention(split(qkv[0]), split(qkv[1]), split(qkv[2])).transpose(1, 2).reshape({N, P, -1});
    x_NPE = x_NPE + attn->proj(y);
    return x_NPE + mlp(ln2(x_NPE));
  }
  int heads;
  torch::nn::LayerNorm ln1;
  Attn attn;
  torch::nn::LayerNorm ln2;
  Mlp mlp;
};
TORCH_MODULE(VisionBlock);

/// The vision encoder and projection: one pipeline stage.
struct VisionImpl : torch::nn::Module
{
  using input_type = torch::Tensor;   // crops (B, N, C, S, S)
  using output_type = mpx::Ranked<3>;  // image embeddings (B, P, D): the receiving stage checks the rank
  static constexpr std::string_view name = "moondream::Vision";
  static constexpr bool tp_blocks = true;  // written with mpx::tp blocks; its sizes are run-time config, checked when built

  explicit VisionImpl(const Config& c) : VisionImpl(c, 0, c.vision.enc_n_layers) {}
  /// Blocks [begin, end) only (a balanced layout's piece of the encoder, costs.hpp): the first range also
  /// embeds the patches, the last also normalises, stitches and projects.
  VisionImpl(const Config& c, int begin_layer, int end_layer)
      : cfg((check_cuts(c.vision, mpx::tp::current()->size), c.vision)), begin(begin_layer), end(end_layer)
  {
    TORCH_CHECK(0 <= begin && begin < end && end <= c.vision.enc_n_layers, "moondream::Vision: layer range [", begin, ", ", end,
                ") is not inside [0, ", c.vision.enc_n_layers, ")");
    if (first()) {
      patch_emb = register_module("patch_emb", torch::nn::Linear(c.vision.patch_features(), c.vision.enc_dim));
      pos_emb = register_parameter("pos_emb", torch::randn({1, c.vision.tokens(), c.vision.enc_dim}) * 0.02);
    }
    for (int i = begin; i < end; ++i) blocks->push_back(VisionBlock(c.vision));
    register_module("blocks", blocks);
    if (last()) {
      post_ln = register_module("post_ln", detail::layer_norm(c.vision.enc_dim));
      proj_mlp = register_module("proj_mlp", Mlp(2 * c.vision.enc_dim, c.vision.proj_inner_dim, c.vision.proj_out_dim));
    }
  }
  bool first() const { return begin == 0; }
  bool last() const { return end == cfg.enc_n_layers; }

  /// A tensor-parallel degree must divide every cut size of the vision config: heads, MLP widths (a
  /// run-time check: the sizes come from the JSON config).
  static void check_cuts(const VisionConfig& v, int n)
  {
    if (n == 1) return;
    auto need = [&](long size, const char* what) {
      if (size % n != 0)
        throw mpx::config_error("moondream::Vision: vision tensor parallelism over " + std::to_string(n) + " ranks cuts " + what + " (" +
                                std::to_string(size) + ") " + std::to_string(n) + " ways: choose --vision-tp among its divisors");
    };
    need(v.enc_n_heads, "the attention heads enc_n_heads");
    need(v.enc_ff_dim, "the MLP width enc_ff_dim");
    need(v.proj_inner_dim, "the projection's width proj_inner_dim");
  }

  /// Features of a stack of crops: (N, C, S, S) → (N, P, E) (from the patches in the first range; a later
  /// range continues from the previous range's features).
  torch::Tensor encode(const torch::Tensor& in)
  {
    auto x = first() ? patch_emb(patchify(in, cfg)) + pos_emb : in;
    for (auto& b : *blocks) {  // each block checkpointable (mpx::CheckpointBlocks / --checkpoint blocks)
      auto* blk = b->as<VisionBlockImpl>();
      x = mpx::checkpoint_block(*blk, [blk](const torch::Tensor& t) { return blk->forward(t); }, x);
    }
    return last() ? post_ln(x) : x;
  }

  /// Image embeddings of a batch: each sample's global crop features next to its stitched and pooled
  /// local crops' features, projected to the text width. A range of blocks takes the used crops (first
  /// range) or their features, and hands on the features (N, P, E) until the last range stitches them.
  torch::Tensor forward(const torch::Tensor& in, const Batch& b)
  {
    const auto tiling = tilings(b);
    auto f = encode(first() ? used_crops(in, tiling) : in);  // all crops of the batch at once
    return last() ? project(f, tiling) : f;
  }

  /// Each sample's (rows, cols).
  static std::vector<std::pair<int, int>> tilings(const Batch& b)
  {
    auto t = b.tiling.to(torch::kCPU);
    std::vector<std::pair<int, int>> out;
    for (int64_t i = 0; i < t.size(0); ++i) out.emplace_back(int(t[i][0].item<int64_t>()), int(t[i][1].item<int64_t>()));
    return out;
  }
  /// The crops each sample uses (its global crop and rows x cols local ones), concatenated: (N, C, S, S).
  static torch::Tensor used_crops(const torch::Tensor& crops_BNCSS, const std::vector<std::pair<int, int>>& tiling)
  {
    std::vector<torch::Tensor> used;
    for (std::size_t i = 0; i < tiling.size(); ++i) {
      const auto [rows, cols] = tiling[i];
      const int n = 1 + rows * cols;
      TORCH_CHECK(n <= crops_BNCSS.size(1), "moondream::Vision: sample ", i, " has tiling ", rows, "x", cols, " but only ",
                  crops_BNCSS.size(1), " crops");
      used.push_back(crops_BNCSS[int64_t(i)].narrow(0, 0, n));
    }
    return torch::cat(used);
  }
  /// (N, P, E) features → (B, P, D) image embeddings.
  torch::Tensor project(const torch::Tensor& f, const std::vector<std::pair<int, int>>& tiling)
  {
    const int G = cfg.grid();
    std::vector<torch::Tensor> tokens;
    int64_t off = 0;
    for (const auto& [rows, cols] : tiling) {
      const int n = 1 + rows * cols;
      auto global = f[off];
      auto local = f.narrow(0, off + 1, n - 1).reshape({n - 1, G, G, -1});
      tokens.push_back(torch::cat({global, pool_tokens(reconstruct(local, rows, cols, cfg), cfg)}, -1));  // (P, 2E)
      off += n;
    }
    return proj_mlp(torch::stack(tokens));  // (B, P, D)
  }

  /// Parameters under their global names (`vision.…`): this rank's shards of cut ones.
  std::map<std::string, torch::Tensor> named_weights() { return detail::named_weights(*this, "vision.", begin); }
  std::map<std::string, mpx::tp::Cut> named_cuts() const { return detail::named_cuts(*this, "vision.", begin); }

  VisionConfig cfg;
  int begin, end;
  mpx::tp::GroupPtr tp_group = mpx::tp::current();  ///< the group its cut parameters are sharded over
  torch::nn::Linear patch_emb{nullptr};
  torch::Tensor pos_emb;
  torch::nn::ModuleList blocks;
  torch::nn::LayerNorm post_ln{nullptr};
  Mlp proj_mlp{nullptr};
};
TORCH_MODULE(Vision);

// ---- Text ------------------------------------------------------------------------------------------

/// Partial rotary embedding, rotate-half pairing, on the first `rot` dims of each head: (x_d, x_{d+rot/2})
/// rotate by pos·θ_d with θ_d = base^(−2d/rot); the other dims pass through unchanged (§3.4).
struct Rotary
{
  torch::Tensor cos, sin;  // (max_context, rot/2) fp32
  int rot = 32;
  Rotary() = default;
  Rotary(const TextConfig& c) : rot(c.rot_dim)
  {
    auto inv = torch::pow(c.rope_theta, -torch::arange(0, rot, 2, torch::kDouble) / rot);  // (rot/2)
    auto ang = torch::arange(0, c.max_context, torch::kDouble).unsqueeze(1) * inv.unsqueeze(0);
    cos = ang.cos().to(torch::kFloat), sin = ang.sin().to(torch::kFloat);
  }
  /// x (B, H, T, h) at absolute positions [pos0, pos0 + T).
  torch::Tensor apply(const torch::Tensor& x, int64_t pos0) const
  {
    const int64_t T = x.size(2), half = rot / 2;
    auto c = cos.narrow(0, pos0, T).to(x.device()).to(x.scalar_type()), s = sin.narrow(0, pos0, T).to(x.device()).to(x.scalar_type());
    auto x1 = x.narrow(-1, 0, half), x2 = x.narrow(-1, half, half), pass = x.narrow(-1, rot, x.size(-1) - rot);
    return torch::cat({x1 * c - x2 * s, x1 * s + x2 * c, pass}, -1);
  }
};

/// Attention mask (T new positions after `past` cached ones): causal, except that the first `prefix`
/// positions see each other. True = may attend. (T, past + T) bool.
inline torch::Tensor text_mask(int64_t T, int64_t past, int64_t prefix, torch::Device dev = torch::kCPU)
{
  auto q = torch::arange(past, past + T, torch::TensorOptions().dtype(torch::kLong).device(dev)).unsqueeze(1);
  auto k = torch::arange(0, past + T, torch::TensorOptions().dtype(torch::kLong).device(dev)).unsqueeze(0);
  return (k <= q).logical_or((q < prefix).logical_and(k < prefix));
}

/// Per-layer keys and values of the positions seen so far (decoding).
struct KvCache
{
  std::vector<torch::Tensor> k, v;  // per layer (B, K, past, h)
  int64_t length() const { return k.empty() || !k[0].defined() ? 0 : k[0].size(2); }
};

struct TextBlockImpl : torch::nn::Module
{
  /// Under tensor parallelism (N ranks) it holds heads/N query and kv_heads/N key/value heads (one, shared
  /// with N/kv_heads - 1 neighbours, when there are fewer key/value heads than ranks).
  explicit TextBlockImpl(const TextConfig& c)
      : heads(c.n_heads / mpx::tp::current()->size), kv_heads(std::max(1, c.n_kv_heads / mpx::tp::current()->size)), head_dim(c.head_dim()),
        ln(register_module("ln", detail::layer_norm(c.dim))),
        attn(register_module("attn", Attn(c.dim, head_dim, c.n_heads, c.n_kv_heads))),
        mlp(register_module("mlp", Mlp(c.dim, c.ff_dim, c.dim)))
  {
  }
  /// x (B, T, D) at positions [pos0, pos0 + T); with a cache, appends this chunk's keys/values to it.
  torch::Tensor forward(const torch::Tensor& x, const Rotary& rope, int64_t pos0, const torch::Tensor& mask, torch::Tensor* k_cache = nullptr,
                        torch::Tensor* v_cache = nullptr)
  {
    const auto B = x.size(0), T = x.size(1);
    auto h = ln(x);
    auto qkv = attn->qkv(h);  // [Q (H·h) | K (K·h) | V (K·h)], head-major
    auto q = qkv.narrow(-1, 0, heads * head_dim).view({B, T, heads, head_dim}).transpose(1, 2);
    auto k = qkv.narrow(-1, heads * head_dim, kv_heads * head_dim).view({B, T, kv_heads, head_dim}).transpose(1, 2);
    auto v = qkv.narrow(-1, (heads + kv_heads) * head_dim, kv_heads * head_dim).view({B, T, kv_heads, head_dim}).transpose(1, 2);
    q = rope.apply(q, pos0), k = rope.apply(k, pos0);
    if (k_cache) {
      if (k_cache->defined()) k = torch::cat({*k_cache, k}, 2), v = torch::cat({*v_cache, v}, 2);
      *k_cache = k, *v_cache = v;
    }
    if (kv_heads != heads) {  // query head i reads kv head i / (H/K)
      k = k.repeat_interleave(heads / kv_heads, 1);
      v = v.repeat_interleave(heads / kv_heads, 1);
    }
    auto y = attention(q, k, v, mask).transpose(1, 2).reshape({B, T, heads * head_dim});
    return x + attn->proj(y) + mlp(h);  // parallel attention and MLP
  }
  int heads, kv_heads, head_dim;  // this rank's
  torch::nn::LayerNorm ln;
  Attn attn;
  Mlp mlp;
};
TORCH_MODULE(TextBlock);

/// Text decoder layers [begin, end): a pipeline stage (or, with [0, n_layers), the whole decoder). Its
/// token table `wte` is split by vocabulary under tensor parallelism (a raw parameter, so Text itself is
/// the `CutModule` that says so).
struct TextImpl : torch::nn::Module, mpx::tp::CutModule
{
  using input_type = mpx::Ranked<3>;   // range 0: image embeddings (B, P, D); later ranges: hidden (B, T, D)
  using hidden_type = mpx::Ranked<3>;  // (B, T, D) with T = 1 + P + L
  using output_type = torch::Tensor;  // last range: logits (B, L, V) at the positions that predict tokens[0..L)
  static constexpr std::string_view name = "moondream::Text";
  static constexpr bool tp_blocks = true;  // written with mpx::tp blocks; its sizes are run-time config, checked when built

  TextImpl(const Config& c, int begin_layer, int end_layer)
      : cfg(c), begin(begin_layer), end(end_layer), rope(c.text)
  {
    TORCH_CHECK(0 <= begin && begin < end && end <= c.text.n_layers, "moondream::Text: layer range [", begin, ", ", end,
                ") is not inside [0, ", c.text.n_layers, ")");
    check_cuts(c.text, tp_group->size);
    if (first()) wte = register_parameter("wte", mpx::tp::shard(torch::randn({c.text.vocab_size, c.text.dim}) * 0.02, {"wte", 0, {}}, *tp_group));
    for (int i = begin; i < end; ++i) blocks->push_back(TextBlock(c.text));
    register_module("blocks", blocks);
    if (last()) {
      post_ln = register_module("post_ln", detail::layer_norm(c.text.dim));
      lm_head = register_module("lm_head", mpx::tp::ColumnLinear(c.text.dim, c.text.vocab_size));
    }
  }
  explicit TextImpl(const Config& c) : TextImpl(c, 0, c.text.n_layers) {}
  bool first() const { return begin == 0; }
  bool last() const { return end == cfg.text.n_layers; }

  /// A tensor-parallel degree must divide every cut size of the config (a run-time check: the sizes come
  /// from the JSON config).
  static void check_cuts(const TextConfig& t, int n)
  {
    if (n == 1) return;
    auto need = [&](long size, const char* what, const char* fix) {
      if (size % n != 0)
        throw mpx::config_error("moondream::Text: text tensor parallelism over " + std::to_string(n) + " ranks cuts " + what + " (" +
                                std::to_string(size) + ") " + std::to_string(n) + " ways: " + fix);
    };
    need(t.n_heads, "the attention heads", "choose --tp among the divisors of n_heads");
    if (t.n_kv_heads % n != 0 && n % t.n_kv_heads != 0)
      throw mpx::config_error("moondream::Text: text tensor parallelism over " + std::to_string(n) + " ranks cuts the key/value heads (" +
                              std::to_string(t.n_kv_heads) + ") " + std::to_string(n) + " ways, or shares each of them among " +
                              "--tp / n_kv_heads ranks: choose --tp among the divisors or the multiples of n_kv_heads");
    need(t.ff_dim, "the MLP width ff_dim", "choose --tp among the divisors of ff_dim");
    need(t.vocab_size, "the vocabulary", "pad vocab_size to a multiple of --tp");
  }

  /// [BOS, image, tokens] embedded: (B, 1 + P + L, D); BOS and the tokens in one lookup.
  torch::Tensor embed(const torch::Tensor& img_BPD, const torch::Tensor& tokens_BL)
  {
    const auto B = img_BPD.size(0), L = tokens_BL.size(1);
    auto e = embed_tokens(torch::cat({torch::full({B, 1}, cfg.tokenizer.bos_id, tokens_BL.options().dtype(torch::kLong)), tokens_BL.to(torch::kLong)}, 1));
    return torch::cat({e.narrow(1, 0, 1), img_BPD, e.narrow(1, 1, L)}, 1);
  }
  torch::Tensor embed_tokens(const torch::Tensor& tokens_BL) { return mpx::tp::vocab_embedding(wte, tokens_BL.to(wte.device()), tp_group); }

  /// Runs this range's blocks on x (B, T, D) at positions [pos0, pos0 + T).
  torch::Tensor run_blocks(torch::Tensor x, int64_t pos0 = 0, KvCache* cache = nullptr)
  {
    const int64_t past = cache ? cache->length() : 0;
    auto mask = text_mask(x.size(1), past, cfg.prefix(), x.device());
    if (cache && cache->k.empty()) cache->k.resize(blocks->size()), cache->v.resize(blocks->size());
    for (std::size_t i = 0; i < blocks->size(); ++i) {
      auto* blk = (*blocks)[i]->as<TextBlockImpl>();
      if (cache) {  // decoding: no gradients, nothing to checkpoint
        x = blk->forward(x, rope, pos0, mask, &cache->k[i], &cache->v[i]);
        continue;
      }
      // checkpointable; the closure outlives this call (it reruns in backward): everything by value
      x = mpx::checkpoint_block(
          *blk, [blk, rope = rope, pos0, mask](const torch::Tensor& t) { return blk->forward(t, rope, pos0, mask, nullptr, nullptr); }, x);
    }
    return x;
  }
  /// Logits (this rank's vocabulary share under tensor parallelism).
  torch::Tensor head(const torch::Tensor& h) { return lm_head(post_ln(h)); }

  /// The pipeline stage: range 0 embeds, every range runs its blocks, the last returns the logits of the
  /// positions that predict a supervised token (targets ≠ -100), row-major: (K, V). Position prefix-1+i
  /// predicts tokens[i]. Computing the head only there gives the same loss at a fraction of the cost.
  torch::Tensor forward(const torch::Tensor& x, const Batch& b)
  {
    auto h = run_blocks(first() ? embed(x, b.tokens) : x);
    if (!last()) return h;
    const auto L = b.tokens.size(1);
    auto sup = (b.targets != ignore_index).to(h.device());  // (B, L)
    return head(h.narrow(1, cfg.prefix() - 1, L).index({sup}));
  }
  /// Logits of all L token positions: (B, L, V).
  torch::Tensor all_logits(const torch::Tensor& h, const Batch& b) { return head(h.narrow(1, cfg.prefix() - 1, b.tokens.size(1))); }

  /// Parameters under their global names (`text.wte`, `text.blocks.{begin + i}.…`, `text.lm_head.…`): this
  /// rank's shards of split ones.
  std::map<std::string, torch::Tensor> named_weights() { return detail::named_weights(*this, "text.", begin); }
  std::map<std::string, mpx::tp::Cut> named_cuts() const { return detail::named_cuts(*this, "text.", begin); }

  // mpx::tp::CutModule: the raw table
  std::vector<mpx::tp::Cut> cuts() const override { return first() ? std::vector<mpx::tp::Cut>{{"wte", 0, {}}} : std::vector<mpx::tp::Cut>{}; }
  const mpx::tp::GroupPtr& group() const override { return tp_group; }

  mpx::tp::GroupPtr tp_group = mpx::tp::current();  ///< the group its cut parameters are sharded over
  Config cfg;
  int begin, end;
  Rotary rope;
  torch::Tensor wte;
  torch::nn::ModuleList blocks;
  torch::nn::LayerNorm post_ln{nullptr};
  mpx::tp::ColumnLinear lm_head{nullptr};
};
TORCH_MODULE(Text);

/// Pieces [begin, end) of the whole model in one stage, the pieces being the vision blocks (0 .. V-1) and
/// then the decoder's layers (V .. V+n-1): what a balanced layout (`--layout 2b`, `4b`; costs.hpp) puts on
/// one device — part of the encoder, the encoder and the first text layers, or text layers alone. It hands
/// on what its last piece makes: crop features (N, P, E) inside the encoder, image embeddings (B, P, D)
/// after it, hidden states (B, T, D) inside the decoder, the supervised positions' logits at the end.
/// A frozen encoder (its parameters need no gradient) runs under no-grad: nothing of it is kept.
struct VisionTextImpl : torch::nn::Module
{
  using input_type = torch::Tensor;    // crops (B, N, C, S, S), or the previous stage's output
  using output_type = torch::Tensor;  // as the file comment says
  static constexpr std::string_view name = "moondream::VisionText";

  VisionTextImpl(const Config& c, int begin_piece, int end_piece) : begin(begin_piece), end(end_piece), V(c.vision.enc_n_layers)
  {
    const int n = c.text.n_layers;
    TORCH_CHECK(0 <= begin && begin < end && end <= V + n, "moondream::VisionText: pieces [", begin, ", ", end, ") are not inside [0, ", V + n,
                ") (", V, " vision blocks, then ", n, " text layers)");
    if (begin < V) vision = register_module("vision", Vision(c, begin, std::min(end, V)));
    if (end > V) text = register_module("text", Text(c, std::max(begin, V) - V, end - V));
  }
  torch::Tensor forward(const torch::Tensor& x, const Batch& b)
  {
    auto h = vision ? encode(x, b) : x;
    return text ? text->forward(h, b) : h;
  }
  torch::Tensor encode(const torch::Tensor& x, const Batch& b)
  {
    const auto params = vision->parameters();
    const bool frozen = std::none_of(params.begin(), params.end(), [](const torch::Tensor& p) { return p.requires_grad(); });
    if (!frozen) return vision->forward(x, b);
    torch::NoGradGuard ng;
    return vision->forward(x, b);
  }
  std::map<std::string, torch::Tensor> named_weights()
  {
    std::map<std::string, torch::Tensor> out;
    if (vision) out.merge(vision->named_weights());
    if (text) out.merge(text->named_weights());
    return out;
  }
  std::map<std::string, mpx::tp::Cut> named_cuts() const
  {
    std::map<std::string, mpx::tp::Cut> out;
    if (vision) out.merge(vision->named_cuts());
    if (text) out.merge(text->named_cuts());
    return out;
  }

  int begin, end, V;
  mpx::tp::GroupPtr tp_group = mpx::tp::current();  ///< a group of one: balanced layouts are not tensor-parallel
  Vision vision{nullptr};
  Text text{nullptr};
};
TORCH_MODULE(VisionText);

/// Answer-only next-token cross-entropy: mean over the supervised tokens of the batch (§8). Takes the
/// logits of the supervised positions (K, V), as `Text::forward` returns them (K, V/N under tensor
/// parallelism: the loss is reduced over the group without gathering them).
inline torch::Tensor answer_loss(const torch::Tensor& logits_KV, const Batch& b)
{
  auto t = b.targets.to(logits_KV.device());
  return mpx::tp::cross_entropy(logits_KV, t.index({t != ignore_index}));
}

// ---- The whole model, in one process ---------------------------------------------------------------

struct MoondreamImpl : torch::nn::Module
{
  explicit MoondreamImpl(const Config& c) : cfg(c), vision(register_module("vision", Vision(c))), text(register_module("text", Text(c))) {}

  torch::Tensor forward(const Batch& b) { return text->forward(vision->forward(b.crops, b), b); }

  std::map<std::string, torch::Tensor> named_weights()
  {
    auto out = vision->named_weights();
    out.merge(text->named_weights());
    return out;
  }

  /// The image prefix (BOS + image tokens) run once through the decoder: its cache is reused by every
  /// question about the image.
  KvCache encode_image(const torch::Tensor& crops_1NCSS, const torch::Tensor& tiling_12)
  {
    torch::NoGradGuard ng;
    Batch b{crops_1NCSS, tiling_12, torch::empty({1, 0}, torch::kLong), torch::empty({1, 0}, torch::kLong)};
    auto img = vision->forward(crops_1NCSS, b);
    auto bos = text->embed_tokens(torch::full({1, 1}, cfg.tokenizer.bos_id, torch::kLong));
    KvCache cache;
    text->run_blocks(torch::cat({bos, img}, 1), 0, &cache);
    return cache;
  }

  /// Greedy decoding of up to `max_tokens` after `prompt` on a copy of the image cache; stops at EOS.
  std::vector<int64_t> generate(KvCache cache, const std::vector<int64_t>& prompt, int max_tokens)
  {
    torch::NoGradGuard ng;
    std::vector<int64_t> out;
    auto ids = torch::tensor(prompt, torch::kLong).unsqueeze(0);
    for (int i = 0; i < max_tokens && cache.length() < cfg.text.max_context; ++i) {
      const auto pos0 = cache.length();
      auto h = text->run_blocks(text->embed_tokens(ids), pos0, &cache);
      const int64_t next = text->head(h.select(1, h.size(1) - 1)).argmax(-1).item<int64_t>();
      if (next == cfg.tokenizer.eos_id) break;
      out.push_back(next);
      ids = torch::tensor({next}, torch::kLong).unsqueeze(0);
    }
    return out;
  }

  Config cfg;
  Vision vision;
  Text text;
};
TORCH_MODULE(Moondream);

}  // namespace moondream
