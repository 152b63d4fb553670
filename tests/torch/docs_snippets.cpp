// SPDX-License-Identifier: Apache-2.0
// The docs' snippets compile from <mpx/mpx.hpp> alone (built as part of the header check).
#include <mpx/mpx.hpp>

namespace snippets
{
struct VisionOut  // docs/01_devices_and_stages.md, "Boundaries"
{
  BOOST_HANA_DEFINE_STRUCT(VisionOut, (torch::Tensor, embeds), (torch::Tensor, mask));
};
static_assert(mpx::Boundary<VisionOut>);
struct Batch  // docs/05_running.md, "The public API"
{
  BOOST_HANA_DEFINE_STRUCT(Batch, (torch::Tensor, tokens), (torch::Tensor, labels));
};
inline void run(mpx::World& world, const Batch& batch)
{
  using Model = mpx::Pipeline<mpx::Stage<torch::nn::Linear, mpx::CPU<0>>, mpx::Microbatches<2>, mpx::Batch<Batch>>;
  mpx::TrainOptions options;
  options.lr = mpx::WarmupCosine{1e-3, 10, 100, 0.1};
  mpx::Trainer<Model, Batch> trainer(
      world, [](auto) { return torch::nn::Linear(4, 4); }, [](const Batch& b) { return b.tokens; },
      [](const at::Tensor& out, const Batch& b) { return torch::mse_loss(out, b.labels); }, options);
  const mpx::StepStats st = trainer.step(mpx::slice_microbatches(batch, Model::num_microbatches));
  (void)st;
}
// docs/09_sharded_data_parallel.md: ZeRO levels per stage
using ShardedModel = mpx::Pipeline<mpx::Stage<torch::nn::Linear, mpx::CPU<0>, mpx::Sharded<1>>,
                                   mpx::Stage<torch::nn::Linear, mpx::CPU<1>, mpx::Sharded<2>, mpx::Optimizer<mpx::AdamW8bit>>,
                                   mpx::Microbatches<8>>;
static_assert(ShardedModel::stage<0>::sharding == 1 && ShardedModel::stage<1>::sharding == 2);
static_assert(mpx::model_fingerprint_v<ShardedModel> != mpx::fingerprint_v<ShardedModel>);
}  // namespace snippets
