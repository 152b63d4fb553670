// SPDX-License-Identifier: Apache-2.0
// moondream_train's 2-stage layouts with the vision stage tensor-parallel (--vision-tp 2): the encoder split
// over two ranks, the decoder over the next --tp (1 or 2); also 2 replicas of that. One pipeline type per
// schedule and text degree.
#include "layouts.hpp"
#include "train.hpp"

namespace
{
template <int TextTP>
int by_schedule(const moondream::Options& o)
{
  using moondream::TwoStage;
  if (o.schedule == "gpipe") return moondream::train_pipeline<TwoStage<mpx::GPipe, TextTP, 2>>(o);
  if (o.schedule == "1f1b") return moondream::train_pipeline<TwoStage<mpx::OneFOneB, TextTP, 2>>(o);
  if (o.schedule == "zbh1") return moondream::train_pipeline<TwoStage<mpx::ZBH1, TextTP, 2>>(o);
  throw mpx::config_error("moondream_train: --schedule " + o.schedule + " is not known; use gpipe, 1f1b or zbh1");
}
}  // namespace

int moondream::train_two_stage_vision_tp(const Options& o)
{
  if (o.vision_tp != 2) throw mpx::config_error("moondream_train: --vision-tp " + std::to_string(o.vision_tp) + " is not built; use 1 or 2");
  return o.tp == 2 ? by_schedule<2>(o) : by_schedule<1>(o);
}
