// SPDX-License-Identifier: Apache-2.0
// moondream_train's layouts with the vision encoder frozen (fine-tuning, or --freeze-vision on): its stage is
// mpx::Frozen and, being the first, runs forward only — the text stages train, nothing goes back to vision.
#include "layouts.hpp"
#include "train.hpp"

int moondream::train_frozen_vision(const Options& o)
{
  const bool four = o.layout == "4";
  if (o.schedule == "gpipe") return four ? train_pipeline<FourStage<mpx::GPipe, true>>(o) : train_pipeline<TwoStage<mpx::GPipe, 1, 1, true>>(o);
  if (o.schedule == "1f1b") return four ? train_pipeline<FourStage<mpx::OneFOneB, true>>(o) : train_pipeline<TwoStage<mpx::OneFOneB, 1, 1, true>>(o);
  if (o.schedule == "zbh1") return four ? train_pipeline<FourStage<mpx::ZBH1, true>>(o) : train_pipeline<TwoStage<mpx::ZBH1, 1, 1, true>>(o);
  throw mpx::config_error("moondream_train: --schedule " + o.schedule + " is not known; use gpipe, 1f1b or zbh1");
}
