// SPDX-License-Identifier: Apache-2.0
// moondream_train's 4-stage layout (vision | text x 3): one pipeline type per schedule.
#include "layouts.hpp"
#include "costs.hpp"  // moondream::with_schedule
#include "train.hpp"

int moondream::train_four_stage(const Options& o)
{
  return with_schedule(o.schedule, [&]<class Tag>() { return train_pipeline<FourStage<Tag>>(o); });
}
