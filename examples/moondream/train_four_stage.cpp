// SPDX-License-Identifier: Apache-2.0
// moondream_train's 4-stage layout (vision | text x 3): one pipeline type per schedule.
#include "layouts.hpp"
#include "train.hpp"

int moondream::train_four_stage(const Options& o)
{
  if (o.schedule == "gpipe") return train_pipeline<FourStage<mpx::GPipe>>(o);
  if (o.schedule == "1f1b") return train_pipeline<FourStage<mpx::OneFOneB>>(o);
  if (o.schedule == "zbh1") return train_pipeline<FourStage<mpx::ZBH1>>(o);
  throw mpx::config_error("moondream_train: --schedule " + o.schedule + " is not known; use gpipe, 1f1b or zbh1");
}
