// SPDX-License-Identifier: Apache-2.0
// moondream_train's 2-stage layouts with the text stage tensor-parallel (--tp 2): vision on one rank, the
// decoder split over the next two; also 2 replicas of that. One pipeline type per schedule.
#include "layouts.hpp"
#include "train.hpp"

int moondream::train_two_stage_tp(const Options& o)
{
  if (o.tp != 2) throw mpx::config_error("moondream_train: --tp " + std::to_string(o.tp) + " is not built; use --tp 1 or 2");
  if (o.schedule == "gpipe") return train_pipeline<TwoStage<mpx::GPipe, 2>>(o);
  if (o.schedule == "1f1b") return train_pipeline<TwoStage<mpx::OneFOneB, 2>>(o);
  if (o.schedule == "zbh1") return train_pipeline<TwoStage<mpx::ZBH1, 2>>(o);
  throw mpx::config_error("moondream_train: --schedule " + o.schedule + " is not known; use gpipe, 1f1b or zbh1");
}
