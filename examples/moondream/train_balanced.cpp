// SPDX-License-Identifier: Apache-2.0
// moondream_train's balanced layouts (--layout 2b, 4b): the pieces (vision blocks, then text layers) partitioned where
// the config's costs say (costs.hpp), each device's range one VisionText stage; with the encoder frozen, the
// leading stages that hold only its blocks are Frozen (forward only). --plan prints every layout's partition and
// predicted step without training.
#include "layouts.hpp"
#include "train.hpp"

namespace
{
/// The plan of `o.layout` as every rank computes it (the config, the tokenizer, the first step's batch).
moondream::Plan plan(const moondream::Options& o)
{
  using namespace moondream;
  const Config c = load_config(o.config);
  const auto tok = Tokenizer::load(o.tokenizer);
  const Data data = make_data(o, c);
  return plan_for(o, c, workload_for(o, c, data, tok));
}

template <class Tag>
int train_with(const moondream::Options& o, const moondream::Plan& p)
{
  using namespace moondream;
  if (p.slots == 2) return p.frozen_slots == 0 ? train_pipeline<TwoStageBalanced<Tag, 0>>(o) : train_pipeline<TwoStageBalanced<Tag, 1>>(o);
  if (p.frozen_slots == 0) return train_pipeline<FourStageBalanced<Tag, 0>>(o);
  if (p.frozen_slots == 1) return train_pipeline<FourStageBalanced<Tag, 1>>(o);
  if (p.frozen_slots == 2) return train_pipeline<FourStageBalanced<Tag, 2>>(o);
  return train_pipeline<FourStageBalanced<Tag, 3>>(o);  // the decoder on the last device alone
}
}  // namespace

int moondream::train_balanced(const Options& o)
{
  const Plan p = plan(o);
  return with_schedule(o.schedule, [&]<class Tag>() { return train_with<Tag>(o, p); });
}

int moondream::print_plans(const Options& o)
{
  const Config c = load_config(o.config);
  const auto tok = Tokenizer::load(o.tokenizer);
  const Data data = make_data(o, c);
  const Workload w = workload_for(o, c, data, tok);
  const auto pieces = piece_costs(c, w);
  std::cout << fmt::format("config {}: vision {} layers, text {} layers; vision {}; {} micro-batches, {}\n", c.name, c.vision.enc_n_layers,
                           c.text.n_layers, o.train_vision() ? "trained" : "frozen (forward only when alone on its slot)", o.microbatches(),
                           o.schedule);
  std::int64_t vision = 0;
  for (int i = 0; i < c.vision.enc_n_layers; ++i) vision += pieces[std::size_t(i)].forward + (o.train_vision() ? pieces[std::size_t(i)].backward : 0);
  const auto& layer = pieces[std::size_t(c.vision.enc_n_layers)];
  std::cout << fmt::format("cost per micro-batch (forward + backward): the vision encoder {:.3g} GFLOP, a text layer {:.3g} GFLOP\n",
                           double(vision) / 1e9, double(layer.forward + layer.backward) / 1e9);
  for (const char* layout : {"2", "2b", "4", "4b"}) {
    Options lo = o;
    lo.layout = layout;
    std::cout << describe(plan_for(lo, c, w)) << "\n";
  }
  return 0;
}
