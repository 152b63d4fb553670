// SPDX-License-Identifier: Apache-2.0
// moondream_train: fine-tunes (or trains from scratch) moondream with mpx. Started without RANK, it launches
// its own local ranks (one per pipeline stage and replica); under mpxrun or torchrun it is one rank.
//
//   moondream_train                                  # the demo: tiny config, generated shapes, 2 CPU ranks
//   moondream_train --layout 4 --schedule zbh1       # vision | text x 3
//   moondream_train --tp 2                           # vision | text split over 2 ranks (tensor parallel): 3 ranks
//   moondream_train --tp 2 --vision-tp 2             # vision split over 2 ranks | text over 2: 4 ranks
//   moondream_train --layout 2x2 --shard 2           # 2 replicas x 2 stages, each replica holding half the optimizer state and gradients
//   moondream_train --layout 2x2 --shard 3           # ... and half the weights between steps (ZeRO-3)
//   moondream_train --tp 2 --lora 16                 # LoRA adapters of rank 16 on the text decoder's linears, the base frozen
//   moondream_train --layout 4b --freeze-vision on   # 4 devices, partitioned where the config's costs say
//   moondream_train --layout 2b --device-speeds 1,0.5  # the second device half as fast: it gets a smaller share
//   moondream_train --layout 2b --rebalance on --save run --max-restarts 2   # re-cut when a device falls behind
//   moondream_train --config md2 --freeze-vision on --plan   # where each layout puts the work, predicted
//   moondream_train --config md2 --weights model.safetensors --tokenizer tokenizer.json --data docci.jsonl
//
// See docs/04_moondream.md for the layouts, the recipe and the real md2 weights.
#include "costs.hpp"  // moondream::is_balanced, slots_of
#include "layouts.hpp"
#include "lora.hpp"  // moondream::check_lora
#include "quantize.hpp"  // moondream::check_quantization
#include "speeds.hpp"    // moondream::check_speeds
#include "train.hpp"

#include <CLI/CLI.hpp>

int main(int argc, char** argv)
{
  moondream::Options o;
  CLI::App app{"moondream_train: fine-tune moondream with mpx (pipeline / data parallel)"};
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);  // a later flag overrides an earlier one
  app.add_option("--config", o.config, "tiny | tiny-reference | medium | md05 | md2 | path.json")->capture_default_str();
  app.add_option("--weights", o.weights, "safetensors file or directory of shards (either naming scheme); default: fresh init");
  app.add_option("--tokenizer", o.tokenizer, "tokenizer.json, or a directory with it or with GPT-2's encoder.json + vocab.bpe")->capture_default_str();
  app.add_option("--data", o.data, "'generated' (shapes VQA) or a JSONL of {image, question, answer} / {image, description}")->capture_default_str();
  app.add_option("--eval-data", o.eval_data, "held-out JSONL (the generated set has its own held-out split)");
  app.add_option("--layout", o.layout,
                 "1 (one process, plain LibTorch), 2 (vision | text), 4 (vision | text x 3), 2x2 (2 replicas x 2 stages), "
                 "2b / 4b (2 / 4 devices, balanced: the first holds vision and as many text layers as the config's costs say)")
      ->check(CLI::IsMember({"1", "2", "4", "2x2", "2b", "4b"}))->capture_default_str();
  app.add_option("--device-speeds", o.device_speeds,
                 "each device's relative speed, one per pipeline slot (e.g. 1,0.5: the second half as fast), or 'probe' (each rank times "
                 "matrix products first); layouts 2b and 4b cut the layers for them, every layout predicts with them; default: equal");
  app.add_option("--rebalance", o.rebalance,
                 "report: name a device that computes slower than the plan assumed (3 steps in a row); on (2b, 4b, with --save and "
                 "--max-restarts): also save a checkpoint and start again on a cut for the measured speeds")
      ->check(CLI::IsMember({"off", "report", "on"}))->capture_default_str();
  app.add_option("--costs", o.costs, "the pieces' costs for the plan: flops (from the config) | measured (each rank times an encoder block and a "
                                     "decoder layer on the first micro-batch: the encoder's time per FLOP against the decoder's scales its pieces)")
      ->check(CLI::IsMember({"flops", "measured"}))->capture_default_str();
  app.add_flag("--plan", o.plan, "print where layouts 2, 2b, 4 and 4b put vision and the text layers, each device's cost and the predicted "
                                 "step and bubble under --schedule (costs from the config and the first batch's shape), then stop");
  app.add_option("--tp", o.tp, "tensor-parallel degree of the text stage (layouts 2 and 2x2): 1 or 2")->check(CLI::IsMember({1, 2}))->capture_default_str();
  app.add_option("--vision-tp", o.vision_tp, "tensor-parallel degree of the vision stage (layouts 2 and 2x2): 1 or 2")
      ->check(CLI::IsMember({1, 2}))
      ->capture_default_str();
  app.add_option("--shard", o.shard, "ZeRO level over the data-parallel replicas (layout 2x2): 0 none, 1 optimizer state, 2 and gradients, 3 and parameters")
      ->check(CLI::IsMember({0, 1, 2, 3}))
      ->capture_default_str();
  app.add_option("--schedule", o.schedule, "gpipe | 1f1b | zbh1")->check(CLI::IsMember({"gpipe", "1f1b", "zbh1"}))->capture_default_str();
  app.add_option("--microbatch-size", o.microbatch_size, "samples per micro-batch (a step is " + std::to_string(o.microbatches()) + " micro-batches per replica)")
      ->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--steps", o.steps, "optimizer steps")->capture_default_str();
  app.add_option("--epochs", o.epochs, "if set: steps = epochs x samples / global batch");
  app.add_option("--lr", o.lr, "peak learning rate; default 3e-6 when fine-tuning (--weights), 5e-4 from scratch");
  app.add_option("--vision-lr-scale", o.vision_lr_scale, "the vision stage learns at lr x this")->capture_default_str();
  app.add_option("--warmup", o.warmup, "warm-up fraction of the steps (then cosine to 0.1 x lr)")->capture_default_str();
  app.add_option("--weight-decay", o.weight_decay)->capture_default_str();
  app.add_option("--clip", o.clip, "global gradient-norm clipping; 0: off")->capture_default_str();
  app.add_option("--optimizer", o.optimizer, "adamw8bit (the recipe) | adamw | sgd (momentum 0.9: parity checks)")
      ->check(CLI::IsMember({"adamw8bit", "adamw", "sgd"}))->capture_default_str();
  app.add_option("--lora", o.lora, "train LoRA adapters of this rank (the base frozen) instead of every weight; 0: off")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
  app.add_option("--lora-alpha", o.lora_alpha, "the adapters' term is scaled by alpha / rank; default: alpha = rank (unscaled)");
  app.add_option("--lora-dropout", o.lora_dropout, "dropout on the adapters' input")->check(CLI::Range(0.0, 0.99))->capture_default_str();
  app.add_option("--lora-targets", o.lora_targets, "regular expression over the linears' global names (e.g. 'text\\.blocks\\.[0-9]+\\.mlp\\.fc[12]')")
      ->capture_default_str();
  app.add_option("--base-precision", o.base_precision, "with --lora: the frozen base's linears held as fp32 | bf16 | int8 (per channel) | nf4 "
                                                     "(QLoRA: 4-bit NormalFloat, blocks of 64, double quantization), dequantized for each use")
      ->capture_default_str();
  app.add_option("--qat", o.qat, "quantization-aware training of every trained linear: int4 (groups of 64), int4/g32, int4/g128, int8 (per channel); "
                                 "the export adds model/quantized/ (packed integers and scales)");
  app.add_option("--precision", o.precision, "fp32 | bf16 (autocast, fp32 master weights)")->check(CLI::IsMember({"fp32", "bf16"}))->capture_default_str();
  app.add_flag("--checkpoint", o.checkpoint, "activation checkpointing of every stage");
  app.add_flag("--checkpoint-blocks", o.checkpoint_blocks, "activation checkpointing of every block (vision and text)");
  app.add_option("--freeze-vision", o.freeze_vision, "auto (frozen when fine-tuning --weights) | on | off")
      ->check(CLI::IsMember({"auto", "on", "off"}))->capture_default_str();
  app.add_option("--vision-forward-only", o.vision_forward_only,
                 "on: a frozen vision stage runs forward only (no backward, no gradient message); off: it still runs its backward "
                 "(the comparison of benchmarks/frozen_vision)")
      ->check(CLI::IsMember({"on", "off"}))->capture_default_str();
  app.add_option("--save", o.save, "directory for checkpoint/, model/, metrics.jsonl, loss.svg");
  app.add_option("--save-every", o.save_every, "also checkpoint every N steps");
  app.add_option("--resume", o.resume, "continue from <dir>/checkpoint's latest checkpoint, or from a checkpoint directory (saved by any layout or --tp, or by layout 1; the same config)");
  app.add_option("--checkpoint-checksums", o.checkpoint_checksums, "on | off: XXH3-64 of every checkpoint file, verified on load")
      ->check(CLI::IsMember({"on", "off"}))->capture_default_str();
  app.add_option("--max-restarts", o.max_restarts, "after a rank fails, start all ranks again (up to N times); they resume from --save")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--eval-samples", o.eval_samples, "held-out questions answered before and after training")->capture_default_str();
  app.add_option("--train-samples", o.train_samples, "size of the generated training set")->capture_default_str();
  app.add_option("--image-size", o.image_size, "generated image side in pixels (default: the config's crop size)");
  app.add_option("--kinds", o.kinds, "generated questions: the kinds asked, each optionally =weight (e.g. position=3,color=1)")->capture_default_str();
  app.add_option("--seed", o.seed)->capture_default_str();
  app.add_option("--metrics", o.metrics, "metrics JSONL (default <save>/metrics.jsonl)");
  app.add_option("--plot", o.plot, "loss curve SVG (default <save>/loss.svg)");
  app.add_option("--timeout", o.timeout_s, "seconds any wait for a peer may take")->capture_default_str();
  app.add_option("--log-every", o.log_every)->capture_default_str();
  app.add_flag("--quiet", o.quiet, "no progress lines");
  app.add_flag("--memory-report", o.memory_report,
               "each rank of a pipeline layout prints its weights, gradients, optimizer state and peak memory beside the formulas "
               "(malloc's statistics: run with MPX_KEEP_HOST_MEMORY=0)");
  app.add_flag("--profile", o.profile, "every step's times on stderr, on every rank (data, forward and backward, optimizer; a pipeline rank's walk and waits)");
  app.add_option("--trace", o.trace, "write the last step's actions of every rank as a Chrome trace (chrome://tracing, Perfetto) to FILE, "
                                     "and print the measured bubble beside the expected one (pipeline layouts)");
  app.add_option("--emulate-replicas", o.emulate_replicas, "layout 1: reproduce the global batch of N data-parallel replicas (parity reference)")
      ->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);

  try {
    if (o.plan) return moondream::print_plans(o);
    moondream::check_lora(o, moondream::load_config(o.config));
    moondream::check_quantization(o);
    moondream::check_speeds(o);
    if (moondream::is_balanced(o.layout) && (o.tp > 1 || o.vision_tp > 1))
      throw mpx::config_error("moondream_train: layout " + o.layout + " is balanced over whole devices; tensor parallelism (--tp, --vision-tp) " +
                              "is for layouts 2 and 2x2: use --layout 2 --tp 2, or --tp 1 --vision-tp 1");
    if (o.tp > 1 && (o.layout == "1" || o.layout == "4"))
      throw mpx::config_error("moondream_train: --tp " + std::to_string(o.tp) + " cuts the text stage of layout 2 or 2x2; layout " + o.layout +
                              " has " + (o.layout == "1" ? "no stages (one process)" : "three text stages") + ": use --layout 2 or 2x2, or --tp 1");
    if (o.vision_tp > 1 && (o.layout == "1" || o.layout == "4"))
      throw mpx::config_error("moondream_train: --vision-tp " + std::to_string(o.vision_tp) + " cuts the vision stage of layout 2 or 2x2; layout " +
                              o.layout + (o.layout == "1" ? " is one process" : " keeps vision on one rank") + ": use --layout 2 or 2x2, or --vision-tp 1");
    if (o.shard > 0 && o.layout != "2x2")
      throw mpx::config_error("moondream_train: --shard " + std::to_string(o.shard) + " shards over data-parallel replicas; layout " + o.layout +
                              " has one replica: use --layout 2x2, or --shard 0");
    if (o.layout == "1" && !o.trace.empty())
      throw mpx::config_error("moondream_train: --trace records a pipeline's actions; layout 1 is one process: use --layout 2, 4 or 2x2");
    if (o.layout == "1" && o.max_restarts > 0)
      throw mpx::config_error("moondream_train: --max-restarts restarts the ranks of a pipeline; layout 1 is one process: use --layout 2, 4 or 2x2");
    if (o.layout == "1") return moondream::train_single(o);
    const int per_replica = moondream::slots_of(o.layout) == 4 ? 4 : o.vision_tp + o.tp;  // vision's ranks, then the text stage's
    const int nproc = o.layout == "2x2" ? 2 * per_replica : per_replica;
    if (const int status = mpx::relaunch_self(nproc, argc, argv, o.max_restarts); status >= 0) return status;
    if (moondream::is_balanced(o.layout)) return moondream::train_balanced(o);
    if (!o.train_vision() && o.vision_forward_only == "on" && o.tp == 1 && o.vision_tp == 1)
      return moondream::train_frozen_vision(o);  // the vision stage is mpx::Frozen: forward only
    if (!o.train_vision() && o.vision_forward_only == "on" && mpx::read_env().rank == 0)  // tensor-parallel layouts have no Frozen type
      std::clog << "moondream_train: with --tp/--vision-tp above 1 the frozen vision stage is not forward only yet: its parameters are "
                   "frozen but it still runs a backward per micro-batch (use --tp 1 --vision-tp 1 for a forward-only vision stage)\n";
    if (o.layout == "4") return moondream::train_four_stage(o);
    if (o.vision_tp > 1) return moondream::train_two_stage_vision_tp(o);
    return o.tp > 1 ? moondream::train_two_stage_tp(o) : moondream::train_two_stage(o);
  } catch (const std::exception& e) {
    std::cerr << e.what() << "\n";
    return 1;
  }
}
