// SPDX-License-Identifier: Apache-2.0
// One rank of the tensor-parallel tests (tp.test.cpp starts N of them on loopback; all N form one group):
//   mpx.tests.tp_rank ops <out-dir>          each operator and block against the single-process arithmetic; "ops ok"
//   mpx.tests.tp_rank train|train-sp <out>   the tiny TP transformer, 5 AdamW steps; rank 0 prints
//                                            "loss <step> <value>" and "norm <step> <value>" and saves every
//                                            parameter, made whole again, to <out>/params.pt
//   mpx.tests.tp_rank lora|lora-sp <out>    the same with LoRA adapters on every linear (base frozen,
//                                            B drawn nonzero so that A trains from the first step)
//   mpx.tests.tp_rank qlora|qlora-sp|qat|qat4|qat4-sp <out>   the same on an nf4 base, or quantization-aware
//                                            (tiny_tp::prepare); the saved weights are the dequantized ones
//   mpx.tests.tp_rank dropout <out-dir>      sharded-region masks differ across ranks, replicated ones agree,
//                                            a checkpointed recompute repeats them; "dropout ok"
#include "support/tiny_tp_transformer.hpp"

#include <mpx/mpx.hpp>

#include <cstdio>
#include <iostream>

namespace
{
namespace tp = mpx::tp;
using P1 = mpx::Pipeline<mpx::Stage<tiny_tp::Model, mpx::CPU<0>, mpx::Layers<0, 6>>, mpx::Microbatches<1>, mpx::Batch<tiny::Batch>>;

const tiny::Config config{32, 16, 4, 6, 8};  // 4 heads: TP = 4 splits them one per rank
constexpr int steps = 5, rows = 8;

/// The group of all ranks of this test.
tp::GroupPtr make_group(mpx::World& w)
{
  auto g = c10::make_intrusive<tp::Group>();
  g->pg = w.world;
  g->rank = w.env.rank;
  g->size = w.env.world_size;
  g->timeout = w.timeout;
  g->name = "test's tensor-parallel group";
  return g;
}

int failures = 0;
void expect(bool ok, const std::string& what)
{
  if (!ok) {
    std::cerr << "rank " << tp::current()->rank << ": " << what << " is wrong\n";
    ++failures;
  }
}
bool close(const at::Tensor& a, const at::Tensor& b) { return a.sizes() == b.sizes() && torch::allclose(a, b, 1e-5, 1e-6); }

/// Each operator's forward and backward against what the single-process arithmetic gives, rank by rank.
int ops(const tp::GroupPtr& g)
{
  const int r = g->rank, n = g->size;
  auto full = torch::arange(4.0 * n * 3).reshape({4, 3 * n});  // replicated (4, 3N); rank r's columns [3r, 3r + 3)
  auto w = torch::arange(12.0).reshape({4, 3}) + r;           // a different upstream gradient on every rank
  {  // copy_to: identity forward; backward the sum of every rank's gradient
    auto x = full.narrow(1, 0, 3).clone().requires_grad_(true);
    auto y = tp::copy_to(x, g);
    expect(close(y, x), "copy_to forward");
    (y * w).sum().backward();
    auto want = torch::zeros({4, 3});
    for (int q = 0; q < n; ++q) want += torch::arange(12.0).reshape({4, 3}) + q;
    expect(close(x.grad(), want), "copy_to backward");
  }
  {  // reduce_from: the sum forward; identity backward
    auto x = (full.narrow(1, 3 * r, 3) * 1.0).requires_grad_(true);
    auto y = tp::reduce_from(x, g);
    auto want = torch::zeros({4, 3});
    for (int q = 0; q < n; ++q) want += full.narrow(1, 3 * q, 3);
    expect(close(y, want), "reduce_from forward");
    (y * w).sum().backward();
    expect(close(x.grad(), w), "reduce_from backward");
  }
  {  // gather_from / scatter_to along the last dim; gather_sequence / reduce_scatter_sequence along dim 0
    auto x = full.narrow(1, 3 * r, 3).clone().requires_grad_(true);
    auto y = tp::gather_from(x, -1, g);
    expect(close(y, full), "gather_from forward");
    auto up = torch::arange(double(4 * 3 * n)).reshape({4, 3 * n}) * (r + 1);
    (y * up).sum().backward();
    expect(close(x.grad(), up.narrow(1, 3 * r, 3)), "gather_from backward");
    auto z = full.clone().requires_grad_(true);
    auto s = tp::scatter_to(z, -1, g);
    expect(close(s, full.narrow(1, 3 * r, 3)), "scatter_to forward");
    (s * w).sum().backward();
    auto want = torch::zeros({4, 3 * n});
    for (int q = 0; q < n; ++q) want.narrow(1, 3 * q, 3).copy_(torch::arange(12.0).reshape({4, 3}) + q);
    expect(close(z.grad(), want), "scatter_to backward");
    auto seq = (torch::arange(6.0).reshape({2, 3}) + 10 * r).requires_grad_(true);  // this rank's rows of a (2N, 3) tensor
    auto whole = tp::gather_sequence(seq, 0, g);
    auto whole_want = torch::cat([&] { std::vector<at::Tensor> v; for (int q = 0; q < n; ++q) v.push_back(torch::arange(6.0).reshape({2, 3}) + 10 * q); return v; }(), 0);
    expect(close(whole, whole_want), "gather_sequence forward");
    auto up2 = torch::ones({2 * n, 3}) * (r + 1);
    (whole * up2).sum().backward();
    expect(close(seq.grad(), torch::ones({2, 3}) * (n * (n + 1) / 2.0)), "gather_sequence backward (the reduce-scatter)");
    auto part = (torch::ones({2 * n, 3}) * (r + 1)).requires_grad_(true);
    auto rs = tp::reduce_scatter_sequence(part, 0, g);
    expect(close(rs, torch::ones({2, 3}) * (n * (n + 1) / 2.0)), "reduce_scatter_sequence forward");
    (rs * (torch::ones({2, 3}) * (r + 1))).sum().backward();
    auto want_rs = torch::cat([&] { std::vector<at::Tensor> v; for (int q = 0; q < n; ++q) v.push_back(torch::ones({2, 3}) * (q + 1)); return v; }(), 0);
    expect(close(part.grad(), want_rs), "reduce_scatter_sequence backward (the all-gather)");
  }
  {  // cross_entropy over vocabulary-split logits: the value and the gradient of the whole
    torch::manual_seed(7);
    auto logits = torch::randn({6, 4 * n}, torch::kDouble);
    auto targets = torch::tensor({0L, 4L * n - 1, 3L, -100L, 2L * n, 1L});
    auto whole = logits.clone().requires_grad_(true);
    auto want = torch::nn::functional::cross_entropy(whole, targets);
    want.backward();
    auto mine = logits.narrow(1, 4 * r, 4).clone().requires_grad_(true);
    auto got = tp::cross_entropy(mine, targets, -100, g);
    expect(close(got, want.detach()), "cross_entropy value");
    got.backward();
    expect(close(mine.grad(), whole.grad().narrow(1, 4 * r, 4)), "cross_entropy gradient");
  }
  {  // a fused column split per part, and back
    auto w_full = torch::arange(double(6 * n * 2)).reshape({6 * n, 2});
    const tp::Cut s{"weight", 0, {2 * n, 2 * n, 2 * n}};
    auto local = tp::shard(w_full, s, *g);
    expect(local.size(0) == 6, "shard's size");
    expect(close(local.narrow(0, 0, 2), w_full.narrow(0, 2 * r, 2)), "shard of the first part");
    expect(close(local.narrow(0, 2, 2), w_full.narrow(0, 2 * n + 2 * r, 2)), "shard of the second part");
    expect(close(tp::unshard(local, s, *g), w_full), "unshard");
  }
  {  // gathered_linear: linear(gather_sequence(x)) in value and every gradient, keeping only the shard
    torch::manual_seed(5);  // the same weights on every rank
    const auto w0 = torch::randn({4, 3}, torch::kDouble), b0 = torch::randn({4}, torch::kDouble);
    const auto x0 = torch::arange(6.0, torch::kDouble).reshape({1, 2, 3}) + r;  // this rank's 2 positions
    std::vector<at::Tensor> a{x0.clone(), w0.clone(), b0.clone()}, b{x0.clone(), w0.clone(), b0.clone()};
    for (auto& t : a) t.requires_grad_(true);
    for (auto& t : b) t.requires_grad_(true);
    auto ya = torch::nn::functional::linear(tp::gather_sequence(a[0], 1, g), a[1], a[2]);
    auto yb = tp::gathered_linear(b[0], b[1], b[2], 1, g);
    expect(close(ya, yb), "gathered_linear forward");
    auto up = torch::arange(double(2 * n * 4), torch::kDouble).reshape({1, 2 * n, 4}) * (r + 1);
    (ya * up).sum().backward();
    (yb * up).sum().backward();
    for (int i = 0; i < 3; ++i) expect(close(a[std::size_t(i)].grad(), b[std::size_t(i)].grad()), "gathered_linear gradient " + std::to_string(i));
  }
  {  // grouped-query key/value heads fewer than ranks: a shared part (tp::Cut::shares)
    const int64_t kv = std::max(1, n / 2), hd = 2;  // kv key/value heads of width 2, each held by n / kv ranks
    const tp::Cut s{"weight", 0, {hd * n, hd * kv}, {1, n / kv}};
    auto w_full = torch::arange(double(hd * (n + kv) * 3)).reshape({hd * (n + kv), 3});
    auto local = tp::shard(w_full, s, *g);
    expect(local.size(0) == 2 * hd, "a shared shard's size");
    expect(close(local.narrow(0, hd, hd), w_full.narrow(0, hd * n + hd * (r / (n / kv)), hd)), "the shared piece a rank holds");
    expect(close(tp::unshard(local, s, *g), w_full), "unshard of a shared split");
    // a ColumnLinear of n query heads and kv shared ones: weights the whole draw's, gradients the whole's
    torch::manual_seed(3);
    torch::nn::Linear whole(3, hd * (n + kv));
    torch::manual_seed(3);
    tp::Scope scope(g);
    tp::ColumnLinear lin(tp::ColumnLinearOptions(3, hd * (n + kv)).parts({hd * n, hd * kv}).units({n, kv}));
    expect(close(tp::unshard(lin->weight, lin->cuts()[0], *g), whole->weight.detach()), "a shared ColumnLinear's draw");
    auto x = torch::arange(12.0).reshape({4, 3}) / 10;
    auto up = [&](int q) { return torch::arange(double(4 * 2 * hd)).reshape({4, 2 * hd}) + q; };  // rank q's upstream gradient
    (lin(x) * up(r)).sum().backward();
    tp::sum_shared_gradients(*lin, g);
    // the whole: query columns of rank q see q's gradient, a key/value head the sum of its holders'
    auto full_up = torch::zeros({4, hd * (n + kv)});
    for (int q = 0; q < n; ++q) {
      full_up.narrow(1, hd * q, hd).copy_(up(q).narrow(1, 0, hd));
      full_up.narrow(1, hd * n + hd * (q / (n / kv)), hd) += up(q).narrow(1, hd, hd);
    }
    (whole(x) * full_up).sum().backward();
    expect(close(tp::unshard(lin->weight.grad(), lin->cuts()[0], *g), whole->weight.grad()), "a shared ColumnLinear's weight gradient");
    expect(close(tp::unshard(lin->bias.grad(), lin->cuts()[1], *g), whole->bias.grad()), "a shared ColumnLinear's bias gradient");
    auto sq = torch::full({1}, tp::local_gradient_sq(*lin, g), torch::kDouble);
    tp::all_reduce(*g, sq);
    const double want_sq = (whole->weight.grad().to(at::kDouble).pow(2).sum() + whole->bias.grad().to(at::kDouble).pow(2).sum()).item<double>();
    if (std::abs(sq.item<double>() - want_sq) > 1e-5 * want_sq) std::cerr << "squared norm " << sq.item<double>() << ", want " << want_sq << "\n";
    expect(std::abs(sq.item<double>() - want_sq) <= 1e-5 * want_sq, "the squared gradient norm of a shared split (each piece once)");
  }
  {  // 16-bit floats (bf16 autocast on CPU ranks): Gloo has no such type, they travel as float
    auto x = (torch::arange(6.0) + r).to(at::kBFloat16);
    tp::all_reduce(*g, x, "a bf16 all-reduce");
    auto want = torch::zeros({6});
    for (int q = 0; q < n; ++q) want += torch::arange(6.0) + q;
    expect(x.scalar_type() == at::kBFloat16 && close(x.to(at::kFloat), want.to(at::kBFloat16).to(at::kFloat)), "a bf16 all-reduce");
    auto parts = tp::all_gather(*g, (torch::ones({2}) * r).to(at::kHalf), "a half all-gather");
    expect(parts.size() == std::size_t(n) && parts.back().scalar_type() == at::kHalf && parts.back()[0].item<double>() == n - 1, "a half all-gather");
  }
  if (r == 0 && failures == 0) std::printf("ops ok\n");
  return failures == 0 ? 0 : 1;
}

int train(const tp::GroupPtr& g, const std::string& mode, const std::string& out)
{
  torch::manual_seed(100);
  tiny_tp::Model model(config, 0, config.layers, mode.ends_with("-sp"));
  tiny_tp::prepare(*model, mode);
  const bool sp = mode.ends_with("-sp");
  std::vector<at::Tensor> trainable;
  for (auto& p : model->parameters())
    if (p.requires_grad()) trainable.push_back(p);
  torch::optim::SGD opt(trainable, torch::optim::SGDOptions(0.1).momentum(0.9));  // (tp.test.cpp: why not AdamW)
  for (long step = 0; step < steps; ++step) {
    auto b = tiny::make_batch(config, rows, step, 0, 1);
    opt.zero_grad();
    auto loss = tiny_tp::loss(model(b.tokens), b);
    loss.backward();
    if (sp) tp::sum_replicated_gradients(*model, g);
    auto sq = torch::full({1}, tp::local_gradient_sq(*model, g), torch::kDouble);
    tp::all_reduce(*g, sq);
    opt.step();
    if (g->rank == 0) std::printf("loss %ld %.17g\nnorm %ld %.17g\n", step, loss.item<double>(), step, std::sqrt(sq.item<double>()));
  }
  std::vector<at::Tensor> whole;
  mpx::quant::Unpacked unpacked(*model);  // a quantized base: its dequantized weights, compared too
  const auto splits = tp::cut_parameters(*model);
  for (const auto& p : model->named_parameters()) {
    auto it = std::find_if(splits.begin(), splits.end(), [&](auto& s) { return s.first == p.key(); });
    whole.push_back(it == splits.end() ? p.value().detach().clone() : tp::unshard(p.value(), it->second, *g));
  }
  if (g->rank == 0) torch::save(whole, out + "/params.pt");
  std::fflush(stdout);
  return 0;
}
}  // namespace

/// Dropout (tp/dropout.hpp): a split region's masks differ from rank to rank, a replicated region's are
/// equal on every rank, and an activation-checkpointed region gives the gradient of the plain run.
int dropout(const tp::GroupPtr& g)
{
  torch::manual_seed(7);  // every rank alike, as a run's seed
  tp::seed_sharded_regions(7, g->rank);
  const auto ones = torch::ones({64, 32});
  const auto split = tp::dropout(ones, 0.5, true, tp::Region::sharded, g);
  const auto replicated = tp::dropout(ones, 0.5, true, tp::Region::replicated, g);
  const auto splits = tp::all_gather(*g, split.contiguous()), replicas = tp::all_gather(*g, replicated.contiguous());
  for (int q = 1; q < g->size; ++q) {
    expect(!torch::equal(splits[0], splits[std::size_t(q)]), "a split region's mask on rank " + std::to_string(q) + " (the same as rank 0's)");
    expect(torch::equal(replicas[0], replicas[std::size_t(q)]), "a replicated region's mask on rank " + std::to_string(q) + " (not rank 0's)");
  }
  const double kept = split.gt(0).to(at::kDouble).mean().item<double>();
  expect(kept > 0.4 && kept < 0.6, "the share a sharded-region dropout keeps (" + std::to_string(kept) + ")");
  expect(torch::equal(tp::dropout(ones, 0.5, false, tp::Region::sharded, g), ones), "dropout outside training");
  // the same region plain and checkpointed: the recompute repeats the split generator's draws
  auto region = [&](const std::vector<at::Tensor>& in) {
    return std::vector<at::Tensor>{tp::dropout(in[0] * 2, 0.3, true, tp::Region::sharded, g) + tp::dropout(in[0], 0.3, true, tp::Region::replicated, g)};
  };
  auto x1 = torch::randn({16, 8}).requires_grad_(true);
  auto x2 = x1.detach().clone().requires_grad_(true);
  {
    std::vector<at::Generator> gens{at::detail::getDefaultCPUGenerator(), tp::sharded_region_generator()};
    std::vector<at::Tensor> states;
    for (auto& gen : gens) {
      std::lock_guard<std::mutex> l(gen.mutex());
      states.push_back(gen.get_state());
    }
    region({x1})[0].pow(2).sum().backward();
    for (std::size_t i = 0; i < gens.size(); ++i) {
      std::lock_guard<std::mutex> l(gens[i].mutex());
      gens[i].set_state(states[i]);
    }
    mpx::checkpoint(region, {x2}, {})[0].pow(2).sum().backward();
  }
  expect(torch::equal(x1.grad(), x2.grad()), "the gradient of a checkpointed region with sharded-region dropout");
  if (failures == 0 && g->rank == 0) std::cout << "dropout ok\n";
  return failures == 0 ? 0 : 1;
}

int main(int argc, char** argv)
{
  if (argc < 3) {
    std::cerr << "usage: " << argv[0] << " ops|train|train-sp|lora|lora-sp|qlora|qlora-sp|qat|qat4|qat4-sp|dropout <out-dir>\n";
    return 2;
  }
  try {
    auto world = mpx::make_world<P1>(mpx::read_env(), mpx::WorldOptions{std::chrono::seconds(30)});
    auto g = make_group(world);
    tp::Scope scope(g);
    const std::string mode = argv[1];
    if (mode == "ops") return ops(g);
    if (mode == "dropout") return dropout(g);
    for (const char* m : {"train", "train-sp", "lora", "lora-sp", "qlora", "qlora-sp", "qat", "qat4", "qat4-sp"})
      if (mode == m) return train(g, mode, argv[2]);
    std::cerr << "unknown mode " << mode << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << e.what() << "\n";
    return 1;
  }
}
