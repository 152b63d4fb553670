// SPDX-License-Identifier: Apache-2.0
#pragma once
/// A small decoder-only transformer, written as ordinary single-device LibTorch code, that can be built
/// as any range of its layers (the embedding lives in range 0, the head in the last range). Used by the
/// runtime's parity tests. Shape legend: B batch, T tokens, D model dim, H heads, V vocabulary.

#include <boost/hana/define_struct.hpp>  // BOOST_HANA_DEFINE_STRUCT
#include <mpx/runtime/activation_checkpoint.hpp>    // mpx::checkpoint_block
#include <torch/torch.h>                 // torch::nn

#include <cmath>    // std::sqrt
#include <limits>  // std::numeric_limits

namespace tiny
{

struct Config
{
  int vocab = 32, dim = 16, heads = 2, layers = 6, seq = 8;
  bool mark_blocks = true;  ///< each block marked for block checkpointing (false: plain calls, a module that marks no blocks)
};

/// One batch: token ids and next-token labels, both (B, T) int64.
struct Batch
{
  BOOST_HANA_DEFINE_STRUCT(Batch, (torch::Tensor, tokens), (torch::Tensor, labels));
};

struct BlockImpl : torch::nn::Module
{
  BlockImpl(const Config& c)
      : heads(c.heads),
        ln1(register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.dim})))),
        ln2(register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.dim})))),
        qkv(register_module("qkv", torch::nn::Linear(c.dim, 3 * c.dim))),
        proj(register_module("proj", torch::nn::Linear(c.dim, c.dim))),
        fc1(register_module("fc1", torch::nn::Linear(c.dim, 4 * c.dim))),
        fc2(register_module("fc2", torch::nn::Linear(4 * c.dim, c.dim)))
  {
  }
  torch::Tensor forward(torch::Tensor x_BTD)
  {
    const auto B = x_BTD.size(0), T = x_BTD.size(1), D = x_BTD.size(2), hd = D / heads;
    auto qkv_BT3D = qkv(ln1(x_BTD));
    auto parts = qkv_BT3D.chunk(3, -1);
    auto split = [&](const torch::Tensor& t) { return t.view({B, T, heads, hd}).transpose(1, 2); };  // (B,H,T,hd)
    auto q = split(parts[0]), k = split(parts[1]), v = split(parts[2]);
    auto att = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(double(hd));                     // (B,H,T,T)
    auto causal = torch::ones({T, T}, x_BTD.options().dtype(torch::kBool)).triu(1);
    att = torch::softmax(att.masked_fill(causal, -std::numeric_limits<float>::infinity()), -1);  // -inf: fits fp16 too
    auto y_BTD = torch::matmul(att, v).transpose(1, 2).reshape({B, T, D});
    x_BTD = x_BTD + proj(y_BTD);
    return x_BTD + fc2(torch::gelu(fc1(ln2(x_BTD))));
  }
  int heads;
  torch::nn::LayerNorm ln1, ln2;
  torch::nn::Linear qkv, proj, fc1, fc2;
};
TORCH_MODULE(Block);

/// Layers [begin, end) of the model; the embedding comes with layer 0, the head with the last layer.
struct ModelImpl : torch::nn::Module
{
  using input_type = torch::Tensor;   // token ids (B, T)
  using hidden_type = torch::Tensor;  // (B, T, D)
  using output_type = torch::Tensor;  // logits (B, T, V)
  static constexpr int num_heads = 2;

  ModelImpl(const Config& c, int begin, int end) : first(begin == 0), last(end == c.layers), mark(c.mark_blocks)
  {
    if (first) {
      tok = register_module("tok", torch::nn::Embedding(c.vocab, c.dim));
      pos = register_module("pos", torch::nn::Embedding(c.seq, c.dim));
    }
    for (int i = begin; i < end; ++i) blocks->push_back(Block(c));
    register_module("blocks", blocks);
    if (last) {
      ln = register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.dim})));
      head = register_module("head", torch::nn::Linear(c.dim, c.vocab));
    }
  }
  torch::Tensor forward(torch::Tensor x)
  {
    if (first) x = tok(x) + pos(torch::arange(x.size(1), x.options().dtype(torch::kLong)));
    // each block checkpointable (a no-op unless the stage is CheckpointBlocks); Config::mark_blocks false:
    // plain calls, a module that marks no blocks (ZB-H1 then runs a whole backward in I)
    for (auto& b : *blocks) {
      auto* blk = b->as<BlockImpl>();
      x = mark ? mpx::checkpoint_block(*blk, [blk](const torch::Tensor& t) { return blk->forward(t); }, x) : blk->forward(x);
    }
    if (last) x = head(ln(x));
    return x;
  }
  bool first, last, mark;
  torch::nn::Embedding tok{nullptr}, pos{nullptr};
  torch::nn::ModuleList blocks;
  torch::nn::LayerNorm ln{nullptr};
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(Model);

/// The deterministic batch of step `step` for replica `replica` (rows of a global batch).
inline Batch make_batch(const Config& c, int rows, long step, int replica, int replicas)
{
  auto g = at::make_generator<at::CPUGeneratorImpl>(1000 + step);
  auto tokens = torch::randint(c.vocab, {rows * replicas, c.seq + 1}, g, torch::kLong);
  auto mine = tokens.narrow(0, replica * rows, rows);
  return {mine.narrow(1, 0, c.seq).contiguous(), mine.narrow(1, 1, c.seq).contiguous()};
}

inline torch::Tensor loss(const torch::Tensor& logits_BTV, const Batch& b)
{
  return torch::nn::functional::cross_entropy(logits_BTV.reshape({-1, logits_BTV.size(-1)}), b.labels.reshape(-1));
}

}  // namespace tiny
