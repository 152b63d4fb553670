// SPDX-License-Identifier: Apache-2.0
// moondream_train's 2-stage layouts with the vision stage tensor-parallel (--vision-tp 2): the encoder split
// over two ranks, the decoder over the next --tp (1 or 2); also 2 replicas of that. One pipeline type per
// schedule and text degree.
#include "layouts.hpp"
#include "costs.hpp"  // moondream::with_schedule
#include "train.hpp"

namespace
{
template <int TextTP>
int by_schedule(const moondream::Options& o)
{
  return moondream::with_schedule(o.schedule, [&]<class Tag>() { return moondream::train_pipeline<moondream::TwoStage<Tag, TextTP, 2>>(o); });
}
}  // namespace

int moondream::train_two_stage_vision_tp(const Options& o)
{
  if (o.vision_tp != 2) throw mpx::config_error("moondream_train: --vision-tp " + std::to_string(o.vision_tp) + " is not built; use 1 or 2");
  return o.tp == 2 ? by_schedule<2>(o) : by_schedule<1>(o);
}
