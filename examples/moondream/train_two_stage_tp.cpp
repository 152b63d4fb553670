// SPDX-License-Identifier: Apache-2.0
// moondream_train's 2-stage layouts with the text stage tensor-parallel (--tp 2): vision on one rank, the
// decoder split over the next two; also 2 replicas of that. One pipeline type per schedule.
#include "layouts.hpp"
#include "costs.hpp"  // moondream::with_schedule
#include "train.hpp"

int moondream::train_two_stage_tp(const Options& o)
{
  if (o.tp != 2) throw mpx::config_error("moondream_train: --tp " + std::to_string(o.tp) + " is not built; use --tp 1 or 2");
  return with_schedule(o.schedule, [&]<class Tag>() { return train_pipeline<TwoStage<Tag, 2>>(o); });
}
