// SPDX-License-Identifier: Apache-2.0
// The runtime on this machine's device: CUDA device 0 when there is one (collectives on NCCL), else CPU
// (on Gloo). One rank, so it runs on a single GPU: a one-stage pipeline trains like plain LibTorch,
// checkpoints and resumes, skips a step on an inf under the loss scaler; activation checkpointing repeats
// dropout masks (the device's generator is restored); autocast; 8-bit AdamW matches its CPU arithmetic.
// On a GPU machine: `scripts/gpu_check.sh` builds and runs this file against a CUDA LibTorch 2.x.
#include "support/catch_torch.hpp"
#include "support/one_rank_world.hpp"
#include "support/reference.hpp"
#include "support/scratch_dir.hpp"
#include "support/tiny_transformer.hpp"

#include <mpx/mpx.hpp>

#include <filesystem>
#include <iostream>
#include <limits>

namespace
{
torch::Device device() { return torch::cuda::is_available() ? torch::Device(torch::kCUDA, 0) : torch::Device(torch::kCPU); }

using P1 = mpx::Pipeline<mpx::Stage<tiny::Model, mpx::GPU<0>, mpx::Layers<0, 6>, mpx::Optimizer<mpx::SGD>>, mpx::Microbatches<4>,
                         mpx::Batch<tiny::Batch>>;
using P1Adam = mpx::Pipeline<mpx::Stage<tiny::Model, mpx::GPU<0>, mpx::Layers<0, 6>>, mpx::Microbatches<4>, mpx::Batch<tiny::Batch>>;

const tiny::Config config{};
constexpr int rows = 12;

mpx::TrainOptions options()
{
  mpx::TrainOptions o;
  o.lr = mpx::WarmupCosine{1e-2, 2, 5, 0.1};
  o.momentum = 0.9;
  o.clip_norm = 1.0;
  return o;
}

mpx::World one_rank_world() { return test::one_rank_world<P1>(); }

tiny::Model make_model()
{
  torch::manual_seed(100);
  return tiny::Model(config, 0, config.layers);
}

template <class P>
mpx::Trainer<P, tiny::Batch> make_trainer(mpx::World& w, mpx::TrainOptions o = options())
{
  return mpx::Trainer<P, tiny::Batch>(w, [](auto) { return make_model(); }, [](const tiny::Batch& b) { return b.tokens; }, tiny::loss, o);
}

double rel(double a, double b) { return std::abs(a - b) / std::max(std::abs(b), 1e-12); }
}  // namespace

TEST_CASE("a one-stage pipeline on the device trains like plain LibTorch on CPU", "[device]")
{
  std::cout << "device: " << device() << "\n";
  auto w = one_rank_world();
  CHECK(w.device == device());
  auto t = make_trainer<P1>(w);
  // reference: the same model, data and SGD on CPU, one process (support/reference.hpp)
  std::vector<tiny::Model> ref{make_model()};
  const auto o = options();
  std::vector<std::unique_ptr<torch::optim::Optimizer>> sgd;
  sgd.push_back(std::make_unique<torch::optim::SGD>(ref[0]->parameters(), torch::optim::SGDOptions(o.lr.peak).momentum(o.momentum)));
  test::ReferenceOptions ro;
  ro.lr = o.lr;
  ro.clip_norm = o.clip_norm;
  ro.rows = rows;
  const auto expected = test::train_reference(ref, sgd, ro, config);
  for (long step = 0; step < 5; ++step) {
    const auto st = t.step(mpx::slice_microbatches(tiny::make_batch(config, rows, step, 0, 1), 4));
    const double total = expected.losses[std::size_t(step)], norm = expected.grad_norms[std::size_t(step)];
    INFO("step " << step << ": device loss " << st.loss << ", CPU loss " << total);
    CHECK(rel(st.loss, total) < (w.device.is_cpu() ? 1e-6 : 1e-5));
    CHECK(rel(st.grad_norm, norm) < (w.device.is_cpu() ? 1e-5 : 1e-4));
  }
  auto mine = t.parameters(0);
  auto theirs = ref[0]->parameters();
  REQUIRE(mine.size() == theirs.size());
  for (std::size_t i = 0; i < mine.size(); ++i) {
    CHECK(mine[i].device() == device());
    const double d = (mine[i].cpu() - theirs[i]).abs().max().item<double>();
    INFO("parameter " << i << " differs by " << d);
    CHECK(d < 1e-5);
  }
  // the data-parallel group works on the device's tensors (NCCL on CUDA)
  std::cout << "data-parallel backend: " << w.dp->getBackendName() << ", pipeline backend: " << w.pp->getBackendName() << "\n";
  std::vector<at::Tensor> v{torch::full({4}, 3.0, torch::TensorOptions().device(w.device))};
  w.dp->allreduce(v)->wait(w.timeout);
  CHECK(v[0].sum().item<double>() == 12.0);
}

TEST_CASE("a device run saved after 3 steps and loaded continues with the same losses", "[device]")
{
  namespace fs = std::filesystem;
  const std::string dir = test::scratch_dir("mpx-device") + "/checkpoint";
  auto w = one_rank_world();
  auto o = options();
  auto a = make_trainer<P1Adam>(w, o);
  for (long step = 0; step < 3; ++step) a.step(mpx::slice_microbatches(tiny::make_batch(config, rows, step, 0, 1), 4));
  a.save(dir);
  auto b = make_trainer<P1Adam>(w, o);
  b.load(dir);
  for (long step = 3; step < 5; ++step) {
    auto batch = tiny::make_batch(config, rows, step, 0, 1);
    const double la = a.step(mpx::slice_microbatches(batch, 4)).loss, lb = b.step(mpx::slice_microbatches(batch, 4)).loss;
    CHECK(la == lb);
  }
  auto pa = a.parameters(0), pb = b.parameters(0);
  for (std::size_t i = 0; i < pa.size(); ++i) CHECK(torch::equal(pa[i], pb[i]));
  fs::remove_all(fs::path(dir).parent_path());
}

TEST_CASE("an inf under the loss scaler skips the step on the device, halves the scale, and training goes on", "[device]")
{
  auto w = one_rank_world();
  auto o = options();
  o.scaler.enabled = true;
  o.scaler.init = 1024;
  o.autocast = w.device.is_cuda() ? at::kHalf : at::kBFloat16;  // fp16 where it exists
  o.before_optimizer = [](int, long step, const std::vector<at::Tensor>& params) {
    if (step == 1) params.front().mutable_grad().view(-1)[0] = std::numeric_limits<float>::infinity();
  };
  auto t = make_trainer<P1>(w, o);
  t.step(mpx::slice_microbatches(tiny::make_batch(config, rows, 0, 0, 1), 4));
  std::vector<at::Tensor> before;
  for (auto& p : t.parameters(0)) before.push_back(p.detach().clone());
  const auto st = t.step(mpx::slice_microbatches(tiny::make_batch(config, rows, 1, 0, 1), 4));
  CHECK(st.skipped);
  CHECK(st.loss_scale == 1024);
  auto after = t.parameters(0);
  for (std::size_t i = 0; i < after.size(); ++i) CHECK(torch::equal(before[i], after[i]));
  const auto next = t.step(mpx::slice_microbatches(tiny::make_batch(config, rows, 2, 0, 1), 4));
  CHECK_FALSE(next.skipped);
  CHECK(next.loss_scale == 512);
  CHECK(std::isfinite(next.loss));
}

TEST_CASE("checkpointing on the device repeats dropout masks: gradients equal the plain run's", "[device]")
{
  const auto dev = device();
  torch::manual_seed(3);
  auto lin = torch::nn::Linear(32, 32);
  lin->to(dev);
  auto x = torch::randn({8, 32}, torch::TensorOptions().device(dev)).requires_grad_(true);
  auto f = [&](const std::vector<at::Tensor>& in) {
    return std::vector<at::Tensor>{torch::dropout(torch::gelu(lin(in[0])), 0.5, /*train=*/true).sum(1)};
  };
  torch::manual_seed(11);
  f({x})[0].pow(2).sum().backward();
  auto gx = x.grad().clone(), gw = lin->weight.grad().clone();
  x.mutable_grad() = at::Tensor();
  lin->weight.mutable_grad() = at::Tensor();
  lin->bias.mutable_grad() = at::Tensor();
  torch::manual_seed(11);
  auto y = mpx::checkpoint(f, {x}, lin->parameters());
  torch::randn({1000}, torch::TensorOptions().device(dev));  // draw between forward and backward: must not matter
  y[0].pow(2).sum().backward();
  CHECK((x.grad() - gx).abs().max().item<double>() <= 1e-6 * gx.abs().max().item<double>());
  CHECK((lin->weight.grad() - gw).abs().max().item<double>() <= 1e-6 * gw.abs().max().item<double>());
}

TEST_CASE("autocast on the device: bf16, fp16 on CUDA, and back to fp32 after the region", "[device]")
{
  const auto dev = device();
  auto a = torch::randn({16, 16}, torch::TensorOptions().device(dev)), b = torch::randn({16, 16}, torch::TensorOptions().device(dev));
  {
    mpx::AutocastGuard g(dev.type(), true, at::kBFloat16);
    CHECK(torch::matmul(a, b).scalar_type() == at::kBFloat16);
  }
  if (dev.is_cuda()) {
    mpx::AutocastGuard g(dev.type(), true, at::kHalf);
    CHECK(torch::matmul(a, b).scalar_type() == at::kHalf);
  }
  CHECK(torch::matmul(a, b).scalar_type() == at::kFloat);
}

TEST_CASE("8-bit AdamW on the device follows its CPU arithmetic and round-trips its state", "[device]")
{
  const auto dev = device();
  auto make = [](torch::Device d) {
    torch::manual_seed(5);
    return std::vector<at::Tensor>{torch::randn({5000}).to(d).requires_grad_(true), torch::randn({100}).to(d).requires_grad_(true)};
  };
  auto opts = torch::optim::AdamWOptions(1e-3).weight_decay(0.01);
  auto pc = make(torch::kCPU), pd = make(dev);
  mpx::AdamW8bitOptimizer oc(pc, opts), od(pd, opts);
  for (int step = 0; step < 20; ++step) {
    auto g = at::make_generator<at::CPUGeneratorImpl>(step);
    for (std::size_t i = 0; i < pc.size(); ++i) {
      auto grad = torch::randn(pc[i].sizes(), g);
      pc[i].mutable_grad() = grad;
      pd[i].mutable_grad() = grad.to(dev);
    }
    oc.step();
    od.step();
  }
  for (std::size_t i = 0; i < pc.size(); ++i) {
    const double d = (pd[i].detach().cpu() - pc[i].detach()).abs().max().item<double>();
    INFO("parameter " << i << " differs by " << d);
    CHECK(d < 1e-4);
  }
  // save on the device, load into a fresh optimizer, one more equal step
  std::stringstream buf;
  {
    torch::serialize::OutputArchive ar;
    od.save(ar);
    ar.save_to(buf);
  }
  auto pe = std::vector<at::Tensor>{pd[0].detach().clone().requires_grad_(true), pd[1].detach().clone().requires_grad_(true)};
  mpx::AdamW8bitOptimizer oe(pe, opts);
  {
    torch::serialize::InputArchive ar;
    ar.load_from(buf);
    oe.load(ar);
  }
  for (std::size_t i = 0; i < pd.size(); ++i) {
    auto grad = torch::ones(pd[i].sizes(), torch::TensorOptions().device(dev));
    pd[i].mutable_grad() = grad;
    pe[i].mutable_grad() = grad.clone();
  }
  od.step();
  oe.step();
  for (std::size_t i = 0; i < pd.size(); ++i) CHECK(torch::equal(pd[i], pe[i]));
}
