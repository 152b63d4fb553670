// SPDX-License-Identifier: Apache-2.0
// moondream_train's layouts with the vision encoder frozen (fine-tuning, or --freeze-vision on): its stage is
// mpx::Frozen and, being the first, runs forward only — the text stages train, nothing goes back to vision.
#include "layouts.hpp"
#include "costs.hpp"  // moondream::with_schedule
#include "train.hpp"

int moondream::train_frozen_vision(const Options& o)
{
  const bool four = o.layout == "4";
  return with_schedule(o.schedule, [&]<class Tag>() {
    return four ? train_pipeline<FourStage<Tag, true>>(o) : train_pipeline<TwoStage<Tag, 1, 1, true>>(o);
  });
}
