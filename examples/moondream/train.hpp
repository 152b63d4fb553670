// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file examples/moondream/train.hpp
/// What `moondream_train` does, in rooms (as torchtitan's models/llama3/):
///
/// | header | what |
/// |---|---|
/// | `recipe.hpp`         | options, data, initialisation, sampling, schedule, optimizer |
/// | `evaluation.hpp`     | held-out accuracy |
/// | `metrics.hpp`        | metrics JSONL, progress line, loss plot |
/// | `costs.hpp`          | the cost of each piece from the config, the layouts' partitions (balanced: 2b, 4b) and predicted steps |
/// | `measured_costs.hpp` | `--costs measured`: the encoder's time per FLOP against the decoder's, timed |
/// | `speeds.hpp`         | the devices' speeds behind the plan (declared, probed, re-measured) and the watch on them (`--rebalance`) |
/// | `train_pipeline.hpp` | `train_pipeline<P>`: one pipeline type trained across ranks with mpx |
/// | `train_single.hpp`   | `train_single`: the same training in one process, plain LibTorch (the parity reference) |

#include "train_pipeline.hpp"  // moondream::train_pipeline
#include "train_single.hpp"    // moondream::train_single
