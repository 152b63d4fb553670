// SPDX-License-Identifier: Apache-2.0
// moondream_train's balanced layouts (--layout 2b, 4b): the pieces (vision blocks, then text layers) partitioned where
// the config's costs say (costs.hpp), each device's range one VisionText stage; with the encoder frozen, the
// leading stages that hold only its blocks are Frozen (forward only). The cut weighs the devices' speeds
// (--device-speeds, or what a re-plan measured: speeds.hpp), settled before the pipeline type is chosen: the ranks
// join the store first, and the world joins it after. --plan prints every layout's partition and predicted step
// without training.
#include "layouts.hpp"
#include "train.hpp"

namespace
{
template <class Tag>
int train_with(const moondream::Options& o, const moondream::Plan& p, const moondream::Prepared& pre)
{
  using namespace moondream;
  if (p.slots == 2) return p.frozen_slots == 0 ? train_pipeline<TwoStageBalanced<Tag, 0>>(o, pre) : train_pipeline<TwoStageBalanced<Tag, 1>>(o, pre);
  if (p.frozen_slots == 0) return train_pipeline<FourStageBalanced<Tag, 0>>(o, pre);
  if (p.frozen_slots == 1) return train_pipeline<FourStageBalanced<Tag, 1>>(o, pre);
  if (p.frozen_slots == 2) return train_pipeline<FourStageBalanced<Tag, 2>>(o, pre);
  return train_pipeline<FourStageBalanced<Tag, 3>>(o, pre);  // the decoder on the last device alone
}
}  // namespace

int moondream::train_balanced(const Options& o)
{
  const auto env = mpx::read_env();
  const int slots = slots_of(o.layout);
  if (env.world_size != slots)
    throw mpx::config_error(fmt::format("moondream_train: layout {} runs one rank per device, {} ranks; WORLD_SIZE is {}: start {} ranks",
                                        o.layout, slots, env.world_size, slots));
  // the plan as every rank computes it: the config, the first step's micro-batches, the speeds
  const Config c = load_config(o.config);
  const auto tok = Tokenizer::load(o.tokenizer);
  const Data data = make_data(o, c);
  const auto mbs = first_microbatches(o, c, data, tok);
  Prepared pre;
  pre.store = mpx::make_store(env, std::chrono::milliseconds(long(o.timeout_s) * 1000));
  std::vector<int> slot_of;  // one rank per slot
  for (int r = 0; r < slots; ++r) slot_of.push_back(r);
  pre.speeds = resolve_speeds(o, env, *pre.store, slot_of, slots, !resume_from(o, env).empty(), c, mbs.front());
  const Plan p = plan_for(o, c, workload_of(mbs), *pre.speeds);
  return with_schedule(o.schedule, [&]<class Tag>() { return train_with<Tag>(o, p, pre); });
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
  if (o.device_speeds == "probe")
    throw mpx::config_error("moondream_train: --plan runs no ranks to probe; declare the speeds (--device-speeds 1,0.5) or leave them equal");
  for (const char* layout : {"2", "2b", "4", "4b"}) {
    Options lo = o;
    lo.layout = layout;
    Speeds speeds;  // declared speeds for the layouts of as many devices
    if (!o.device_speeds.empty() && std::count(o.device_speeds.begin(), o.device_speeds.end(), ',') + 1 == slots_of(layout))
      speeds.per_slot = parse_speeds(o.device_speeds, slots_of(layout), layout);
    std::cout << describe(plan_for(lo, c, w, speeds)) << "\n";
  }
  return 0;
}
