// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/tp/*.hpp: the operators and blocks on N real processes over loopback (tp_rank.cpp), and
// the tiny transformer written with the blocks trained under TP = 2 and TP = 4 (with and without sequence
// parallelism): every step's loss and gradient norm, and every parameter made whole at the end, within
// 1e-5 of the same model trained in one process. In one process (a group of one) the blocks are their plain
// LibTorch counterparts: the TP model is tiny::Model, parameter for parameter and loss for loss.
// The optimizer is SGD with momentum: a split matmul sums its partial products in another order, so
// gradients agree to fp32 rounding (~1e-7), and SGD keeps the parameters as close. AdamW would divide
// that rounding by the gradient's own tiny size where a gradient is zero by symmetry (the key bias:
// softmax ignores a constant added to every key), so its parameters drift by noise, in any two
// implementations that round differently.
#include "support/catch_torch.hpp"
#include "support/spawn.hpp"
#include "support/tiny_tp_transformer.hpp"

#include <filesystem>
#include <sstream>

namespace
{
const tiny::Config config{32, 16, 4, 6, 8};  // 4 heads: TP = 4 splits them one per rank
constexpr int steps = 5, rows = 8;

struct Run
{
  std::vector<double> losses, norms;
  std::vector<at::Tensor> params;
};

/// The reference: the same model, data and optimizer in one process (with LoRA adapters: `lora`).
Run reference(const std::string& mode)
{
  torch::manual_seed(100);
  tiny_tp::Model model(config, 0, config.layers);
  tiny_tp::prepare(*model, mode);
  std::vector<at::Tensor> trainable;
  for (auto& p : model->parameters())
    if (p.requires_grad()) trainable.push_back(p);
  torch::optim::SGD opt(trainable, torch::optim::SGDOptions(0.1).momentum(0.9));  // (tp.test.cpp: why not AdamW)
  Run run;
  for (long step = 0; step < steps; ++step) {
    auto b = tiny::make_batch(config, rows, step, 0, 1);
    opt.zero_grad();
    auto loss = tiny_tp::loss(model(b.tokens), b);
    loss.backward();
    double sq = 0;
    for (auto& p : trainable) sq += p.grad().to(at::kDouble).pow(2).sum().item<double>();
    opt.step();
    run.losses.push_back(loss.item<double>());
    run.norms.push_back(std::sqrt(sq));
  }
  mpx::quant::Unpacked unpacked(*model);
  for (auto& p : model->parameters()) run.params.push_back(p.detach().clone());
  return run;
}

using test::all_output;
using test::values_of;

double rel(double a, double b) { return std::abs(a - b) / std::max(std::abs(b), 1e-12); }

void check_training(int n, const std::string& mode)
{
  const auto ref = reference(mode.ends_with("-sp") ? mode.substr(0, mode.size() - 3) : mode);
  const std::string dir = "/tmp/mpx-tp-" + mode + "-" + std::to_string(n) + "-" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  auto res = test::spawn(n, {MPX_TP_RANK_EXE, mode, dir}, std::chrono::seconds(180));
  INFO(all_output(res));
  for (auto& r : res) REQUIRE(r.code == 0);
  const auto losses = values_of(res[0].output, "loss"), norms = values_of(res[0].output, "norm");
  REQUIRE(losses.size() == std::size_t(steps));
  REQUIRE(norms.size() == std::size_t(steps));
  for (int i = 0; i < steps; ++i) {
    CAPTURE(i, losses[std::size_t(i)], ref.losses[std::size_t(i)], norms[std::size_t(i)], ref.norms[std::size_t(i)]);
    CHECK(rel(losses[std::size_t(i)], ref.losses[std::size_t(i)]) < 1e-5);
    CHECK(rel(norms[std::size_t(i)], ref.norms[std::size_t(i)]) < 1e-5);  // replicated parameters counted once, not N times
  }
  std::vector<at::Tensor> got;
  torch::load(got, dir + "/params.pt");
  REQUIRE(got.size() == ref.params.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    CAPTURE(i);
    REQUIRE(got[i].sizes() == ref.params[i].sizes());
    const double scale = ref.params[i].abs().max().item<double>(), diff = (got[i] - ref.params[i]).abs().max().item<double>();
    CAPTURE(diff, scale);
    CHECK(diff <= 1e-5 * std::max(scale, 1e-3));
  }
  std::filesystem::remove_all(dir);
}
/// tp_rank's `mode` on 2 and 4 ranks: every rank ends well and rank 0 says "<mode> ok".
void check_on_ranks(const std::string& mode)
{
  for (int n : {2, 4}) {
    CAPTURE(n);
    auto res = test::spawn(n, {MPX_TP_RANK_EXE, mode, "/tmp"}, std::chrono::seconds(120));
    INFO(all_output(res));
    for (auto& r : res) CHECK(r.code == 0);
    CHECK(res[0].output.find(mode + " ok") != std::string::npos);
  }
}
}  // namespace

TEST_CASE("In one process the blocks are their plain counterparts: the TP model is tiny::Model", "[tp]")
{
  torch::manual_seed(100);
  tiny::Model plain(config, 0, config.layers);
  torch::manual_seed(100);
  tiny_tp::Model split(config, 0, config.layers);
  const auto a = plain->named_parameters(), b = split->named_parameters();
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    CAPTURE(a[i].key());
    CHECK(a[i].key() == b[i].key());  // the same names: checkpoints move between degrees by name
    CHECK(torch::equal(a[i].value(), b[i].value()));  // the same draws
  }
  auto batch = tiny::make_batch(config, rows, 0, 0, 1);
  CHECK(torch::allclose(tiny::loss(plain(batch.tokens), batch), tiny_tp::loss(split(batch.tokens), batch), 1e-6, 1e-7));
  CHECK(mpx::tp::cut_parameters(*split).empty());  // nothing is split in a group of one
}

TEST_CASE("Each operator and block matches the single-process arithmetic on 2 and 4 ranks, forward and backward", "[tp][ops]")
{
  check_on_ranks("ops");
}

TEST_CASE("The tiny transformer under TP = 2 trains like one process: losses, gradient norms, parameters", "[tp][parity]")
{
  check_training(2, "train");
}

TEST_CASE("The tiny transformer under TP = 4 trains like one process", "[tp][parity]") { check_training(4, "train"); }

TEST_CASE("With sequence parallelism, TP = 2 and TP = 4 train like one process", "[tp][parity]")
{
  check_training(2, "train-sp");
  check_training(4, "train-sp");
}

TEST_CASE("LoRA adapters on every linear train under TP = 2 and 4, with and without sequence parallelism, like one process", "[tp][parity][lora]")
{
  // column-parallel linears: A whole, B's rows cut (per fused q, k, v part); row-parallel: A's columns cut,
  // B whole; the base frozen, so only the adapters move (checked: every parameter, adapters and base)
  check_training(2, "lora");
  check_training(4, "lora");
  check_training(2, "lora-sp");
}

TEST_CASE("Dropout draws per rank in a split region and alike on every rank outside one, and a recompute repeats it", "[tp][dropout]")
{
  check_on_ranks("dropout");
  // in a group of one it is plain dropout from the default generator: the model runs uncut, unchanged
  torch::manual_seed(3);
  const auto a = mpx::tp::dropout(torch::ones({50}), 0.5, true, mpx::tp::Region::sharded);
  torch::manual_seed(3);
  CHECK(torch::equal(a, torch::dropout(torch::ones({50}), 0.5, true)));
}

TEST_CASE("QLoRA: adapters on an nf4 base train under TP = 2 and 4 (and sequence parallel) like one process, the dequantized base equal", "[tp][parity][quant]")
{
  // a row-parallel linear's rank quantizes its slice of each row with the whole row's statistics (an
  // all-reduce at build), so every degree holds the base one process holds
  check_training(2, "qlora");
  check_training(4, "qlora");
  check_training(2, "qlora-sp");
}

TEST_CASE("Quantization-aware training (int8 per channel, int4 per group) under TP = 2 and 4 trains like one process", "[tp][parity][quant]")
{
  // int8 per channel: a row-parallel linear's row maxima all-reduced in every forward
  check_training(2, "qat");
  check_training(4, "qat");
  check_training(4, "qat4");
  check_training(2, "qat4-sp");
}
