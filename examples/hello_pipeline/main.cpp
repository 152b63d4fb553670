// SPDX-License-Identifier: Apache-2.0
// hello_pipeline: a two-stage model declared as one mpx::Pipeline type, trained on two CPU ranks.
//
// Started without RANK, it launches its own two local ranks (mpx::relaunch_self); under mpxrun or
// torchrun it is one rank. Rank 0 prints the pipeline, the loss every few steps and the measured bubble,
// and writes a Chrome trace of the last step (open it in Perfetto).
//   hello_pipeline [steps] [trace.json]
#include <mpx/mpx.hpp>

#include <torch/torch.h>

#include <cstdio>
#include <iostream>

// ---- The model: ordinary single-device LibTorch modules ---------------------------------------
// Shape legend: B batch, I input features, H hidden, C classes.
struct EncoderImpl : torch::nn::Module
{
  EncoderImpl()
      : fc1(register_module("fc1", torch::nn::Linear(16, 64))), fc2(register_module("fc2", torch::nn::Linear(64, 64)))
  {
  }
  torch::Tensor forward(torch::Tensor x_BI) { return torch::gelu(fc2(torch::gelu(fc1(x_BI)))); }  // (B,H)
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Encoder);

struct HeadImpl : torch::nn::Module
{
  HeadImpl() : fc1(register_module("fc1", torch::nn::Linear(64, 64))), fc2(register_module("fc2", torch::nn::Linear(64, 4))) {}
  torch::Tensor forward(torch::Tensor h_BH) { return fc2(torch::gelu(fc1(h_BH))); }  // (B,C)
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Head);

/// One batch: features and class labels.
struct Batch
{
  BOOST_HANA_DEFINE_STRUCT(Batch, (torch::Tensor, x), (torch::Tensor, y));
};

// ---- Where everything runs: one type ---------------------------------------------------------
using Model = mpx::Pipeline<mpx::Stage<Encoder, mpx::CPU<0>, mpx::Optimizer<mpx::AdamW>>,
                            mpx::Stage<Head, mpx::CPU<1>, mpx::Optimizer<mpx::AdamW>, mpx::Reads<"y">>,
                            mpx::Batch<Batch>, mpx::Schedule<mpx::OneFOneB>, mpx::Microbatches<4>>;

/// A learnable synthetic task: the class is the quadrant of two projections of x.
Batch make_batch(long step, int rows)
{
  auto g = at::make_generator<at::CPUGeneratorImpl>(step);
  auto x = torch::randn({rows, 16}, g);
  auto y = (x.narrow(1, 0, 1).squeeze(1) > 0).to(torch::kLong) * 2 + (x.narrow(1, 1, 1).squeeze(1) > 0).to(torch::kLong);
  return {x, y};
}

int main(int argc, char** argv)
{
  if (const int status = mpx::relaunch_self(Model::num_slots, argc, argv); status >= 0) return status;
  const long steps = argc > 1 ? std::atol(argv[1]) : 60;
  const std::string trace = argc > 2 ? argv[2] : "hello_pipeline_trace.json";
  try {
    const auto env = mpx::read_env();
    if (env.rank == 0) {
      std::cout << "hello_pipeline: " << env.world_size << " CPU ranks (this example opts into CPU)\n";
      std::cout << mpx::print<Model>;
    }
    mpx::check_blas();
    auto world = mpx::make_world<Model>(env);
    mpx::TrainOptions o;
    o.lr = mpx::WarmupCosine{1e-2, 5, steps, 0.1};
    o.clip_norm = 1.0;
    o.trace = true;
    auto make = [](auto stage) {
      torch::manual_seed(decltype(stage)::value);
      if constexpr (decltype(stage)::value == 0) return Encoder();
      else return Head();
    };
    auto input = [](const Batch& b) { return b.x; };
    auto loss = [](const torch::Tensor& logits, const Batch& b) { return torch::nn::functional::cross_entropy(logits, b.y); };
    mpx::Trainer<Model, Batch> trainer(world, make, input, loss, o);
    double first = 0, last = 0;
    for (long step = 0; step < steps; ++step) {
      auto batch = make_batch(step * world.replicas + world.replica, 64);
      const auto st = trainer.step(mpx::slice_microbatches(batch, Model::num_microbatches));
      if (step == 0) first = st.loss;
      last = st.loss;
      if (env.rank == 0 && (step % 10 == 0 || step + 1 == steps))
        std::printf("step %3ld  loss %.4f  lr %.2e  grad-norm %.3f  %.1f ms\n", step, st.loss, st.lr, st.grad_norm, st.seconds * 1e3);
    }
    trainer.write_trace(trace);
    if (env.rank == 0) {
      std::printf("loss %.4f -> %.4f\n", first, last);
      if (!(last < 0.5 * first)) {
        std::printf("hello_pipeline: the loss did not halve\n");
        return 1;
      }
      std::printf("hello_pipeline: ok\n");
    }
    return 0;
  } catch (const std::exception& e) {
    std::cerr << e.what() << "\n";
    return 1;
  }
}
