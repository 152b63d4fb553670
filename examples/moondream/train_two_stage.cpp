// SPDX-License-Identifier: Apache-2.0
// moondream_train's 2-stage layouts (vision | text; also 2 replicas x 2 stages): one pipeline type per schedule.
#include "layouts.hpp"
#include "costs.hpp"  // moondream::with_schedule
#include "train.hpp"

int moondream::train_two_stage(const Options& o)
{
  return with_schedule(o.schedule, [&]<class Tag>() { return train_pipeline<TwoStage<Tag>>(o); });
}
