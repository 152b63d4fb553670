// SPDX-License-Identifier: Apache-2.0
#pragma once
/// The tiny transformer of tiny_transformer.hpp written with mpx's tensor-parallel blocks: attention split
/// by heads (a fused qkv column-parallel in three parts, the output projection row-parallel), the MLP by
/// columns then rows, the embedding and the head split by vocabulary. It is single-device code: in a
/// group of one it is exactly tiny::Model (same parameters, same draws, same arithmetic); built under a
/// tp::Scope of N ranks, each rank holds 1/N of every split parameter. With `sequence_parallel`, the
/// LayerNorm / residual regions hold 1/N of the sequence (then call tp::sum_replicated_gradients after
/// backward). Shape legend as tiny_transformer.hpp; Hl, Dl:
/// this rank's heads and their width.

#include "tiny_transformer.hpp"  // tiny::Config, tiny::Batch, tiny::make_batch

#include <mpx/lora/adapters.hpp>  // mpx::lora::apply
#include <mpx/quant/model.hpp>    // mpx::quant::quantize_frozen, fake_quantize
#include <mpx/tp.hpp>  // mpx::tp::ColumnLinear, RowLinear, VocabEmbedding, cross_entropy

namespace tiny_tp
{
using tiny::Config;
namespace tp = mpx::tp;

struct BlockImpl : torch::nn::Module
{
  BlockImpl(const Config& c, bool sp)
      : heads(c.heads), sp(sp),
        ln1(register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.dim})))),
        ln2(register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.dim})))),
        qkv(register_module("qkv", tp::ColumnLinear(tp::ColumnLinearOptions(c.dim, 3 * c.dim).parts({c.dim, c.dim, c.dim}).sequence_parallel(sp)))),
        proj(register_module("proj", tp::RowLinear(tp::RowLinearOptions(c.dim, c.dim).sequence_parallel(sp)))),
        fc1(register_module("fc1", tp::ColumnLinear(tp::ColumnLinearOptions(c.dim, 4 * c.dim).sequence_parallel(sp)))),
        fc2(register_module("fc2", tp::RowLinear(tp::RowLinearOptions(4 * c.dim, c.dim).sequence_parallel(sp))))
  {
  }
  torch::Tensor forward(torch::Tensor x_BTD)  // with sequence parallelism: (B, T/N, D)
  {
    const auto D = x_BTD.size(2), hd = D / heads;
    auto qkv_BTDl3 = qkv(ln1(x_BTD));  // (B, T, 3 Dl): the sequence is whole inside the split region
    const auto B = qkv_BTDl3.size(0), T = qkv_BTDl3.size(1);
    auto parts = qkv_BTDl3.chunk(3, -1);
    auto split = [&](const torch::Tensor& t) { return t.view({B, T, -1, hd}).transpose(1, 2); };  // (B,Hl,T,hd)
    auto q = split(parts[0]), k = split(parts[1]), v = split(parts[2]);
    auto att = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(double(hd));
    auto causal = torch::ones({T, T}, x_BTD.options().dtype(torch::kBool)).triu(1);
    att = torch::softmax(att.masked_fill(causal, -std::numeric_limits<float>::infinity()), -1);
    auto y_BTDl = torch::matmul(att, v).transpose(1, 2).reshape({B, T, -1});
    x_BTD = x_BTD + proj(y_BTDl);
    return x_BTD + fc2(torch::gelu(fc1(ln2(x_BTD))));
  }
  int heads;
  bool sp;
  torch::nn::LayerNorm ln1, ln2;
  tp::ColumnLinear qkv;
  tp::RowLinear proj;
  tp::ColumnLinear fc1;
  tp::RowLinear fc2;
};
TORCH_MODULE(Block);

/// Layers [begin, end), as tiny::Model; the head's logits are vocabulary-split (use `loss`).
struct ModelImpl : torch::nn::Module
{
  using input_type = torch::Tensor;   // token ids (B, T)
  using hidden_type = torch::Tensor;  // (B, T, D) (sequence parallel: the full sequence at stage boundaries)
  using output_type = torch::Tensor;  // logits (B, T, V/N)
  static constexpr int num_heads = 4;  // the TP tests build it with 4 heads
  static constexpr bool tp_blocks = true;  // written with mpx::tp blocks: it cuts itself under TensorParallel<N>

  ModelImpl(const Config& c, int begin, int end, bool sp = false) : first(begin == 0), last(end == c.layers), sp(sp)
  {
    if (first) {
      tok = register_module("tok", tp::VocabEmbedding(torch::nn::Embedding(c.vocab, c.dim)->weight.detach(), sp));
      pos = register_module("pos", torch::nn::Embedding(c.seq, c.dim));
    }
    for (int i = begin; i < end; ++i) blocks->push_back(Block(c, sp));
    register_module("blocks", blocks);
    if (last) {
      ln = register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.dim})));
      head = register_module("head", tp::ColumnLinear(tp::ColumnLinearOptions(c.dim, c.vocab).sequence_parallel(sp)));
    }
  }
  torch::Tensor forward(torch::Tensor x)
  {
    if (first) {
      auto p = pos(torch::arange(x.size(1), x.options().dtype(torch::kLong)));
      x = tok(x) + (sp ? tp::slice_of(p, 0) : p);  // sequence parallel: this rank's positions (their gradient summed later)
    } else if (sp) {
      x = tp::scatter_to(x, 1);  // a stage boundary carries the whole sequence
    }
    for (auto& b : *blocks) {
      auto* blk = b->as<BlockImpl>();
      x = mpx::checkpoint_block(*blk, [blk](const torch::Tensor& t) { return blk->forward(t); }, x);
    }
    if (last) return head(ln(x));
    return sp ? tp::gather_from(x, 1) : x;
  }
  bool first, last, sp;
  tp::VocabEmbedding tok{nullptr};
  torch::nn::Embedding pos{nullptr};
  torch::nn::ModuleList blocks;
  torch::nn::LayerNorm ln{nullptr};
  tp::ColumnLinear head{nullptr};
};
TORCH_MODULE(Model);

/// LoRA adapters (rank 4, alpha 8) on every linear of `m`, the base frozen; each B then drawn nonzero, whole
/// and cut as the adapter cuts it (seeded by name: the same at every degree), so that A's gradient is not
/// zero at the first step and both factors train from it.
inline void add_adapters(ModelImpl& m)
{
  mpx::lora::Options o;
  o.rank = 4, o.alpha = 8, o.seed = 11;
  mpx::lora::apply(m, o);
  torch::NoGradGuard ng;
  const auto cuts = tp::cut_parameters(m);
  for (auto& p : m.named_parameters()) {
    if (!p.key().ends_with("lora_b")) continue;
    const tp::Cut* c = tp::cut_of(cuts, p.key());
    auto g = at::make_generator<at::CPUGeneratorImpl>(std::hash<std::string>{}(p.key()));
    const auto sizes = c ? tp::whole_sizes(p.value(), *c, *tp::current()) : p.value().sizes().vec();
    const auto whole = torch::randn(sizes, g) * 0.05;
    p.value().copy_(c ? tp::shard(whole, *c, *tp::current()) : whole);
  }
}

/// A test mode's model: "lora…" adapters (add_adapters); "qlora…" adapters on an nf4 base (blocks of 4: a
/// row-parallel linear's slice at TP = 4 is a whole number of blocks); "qat…" every linear trained
/// quantization-aware in int8 per channel (row statistics over the group), "qat4…" in int4 groups of 4.
/// A "-sp" suffix (sequence parallelism) changes nothing here.
inline void prepare(ModelImpl& m, const std::string& mode)
{
  if (mode.starts_with("lora") || mode.starts_with("qlora")) add_adapters(m);
  if (mode.starts_with("qlora")) mpx::quant::quantize_frozen(m, mpx::quant::parse("nf4/g4"));
  if (mode.starts_with("qat4")) mpx::quant::fake_quantize(m, mpx::quant::parse("int4/g4"));
  else if (mode.starts_with("qat")) mpx::quant::fake_quantize(m, mpx::quant::parse("int8"));
}

/// The same, sequence-parallel.
struct SeqModelImpl : ModelImpl
{
  SeqModelImpl(const Config& c, int begin, int end) : ModelImpl(c, begin, end, true) {}
};
TORCH_MODULE(SeqModel);

inline torch::Tensor loss(const torch::Tensor& local_logits_BTV, const tiny::Batch& b) { return tp::cross_entropy(local_logits_BTV, b.labels); }

}  // namespace tiny_tp
