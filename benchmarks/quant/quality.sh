#!/usr/bin/env bash
# Does quantization-aware training keep the demo model's accuracy where post-training quantization loses it?
# The demo model (the main job's recipe: tiny config from scratch, 2 CPU ranks) is the start. From it, STEPS
# more steps two ways: quantization-aware in each int4 format (`--qat F`: every linear fake-quantized, the
# straight-through gradient; held-out accuracy of its packed export, model/quantized, as moondream_query runs
# it), and in fp32 (the control). Post-training quantization (PTQ: the weights rounded to F, no training,
# `--qat F --steps 0`) of the base and of the fp32 fine-tune is the baseline: QAT against PTQ of the model
# trained as long. Every linear but the patch embedding is quantized (vision trained too: --freeze-vision off).
# Writes benchmarks/results/quant_quality_<host>_<date>.md (an earlier file of the day goes below it).
#   benchmarks/quant/quality.sh [build-dir] [steps] [lr] ["formats"]
# (WORK=dir keeps the runs: a run whose result is there is not run again; SEEDS="1 2 3" repeats the
# fine-tunes with other data orders)
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
steps=${2:-150}
lr=${3:-2e-4}
formats=${4:-int4/channel int4/g128 int4}
seeds=${SEEDS:-1}
train=$build/examples/moondream/moondream_train
work=${WORK:-$(mktemp -d)}
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
mkdir -p "$work"
# run NAME WHEN FLAGS...: one moondream_train run, its held-out accuracy line (WHEN: before or after training)
# kept in $work/NAME.acc and printed with its label; a kept result is printed again, not run again
run() {
  local name=$1 when=$2; shift 2
  local t0; t0=$(date +%s)
  if [ ! -s "$work/$name.acc" ]; then
    "$train" "$@" | grep "held-out accuracy $when" | sed 's/^\[rank 0\] //' > "$work/$name.acc"
    echo "($name: $(( $(date +%s) - t0 )) s)" >&2
  fi
  sed "s|^|$name: |" "$work/$name.acc"
}
{
  run base after --layout 2 --save "$work/base" --eval-samples 200 --quiet
  common=(--freeze-vision off --eval-samples 200 --quiet --optimizer adamw --lr "$lr")
  for seed in $seeds; do
    run "fp32_finetune_seed$seed" after --layout 2 --weights "$work/base/model" "${common[@]}" --steps "$steps" --seed "$seed" --save "$work/fp32_$seed"
  done
  for f in $formats; do
    tag=${f//\//_}
    run "ptq_${tag}_of_base" before --layout 1 --weights "$work/base/model" "${common[@]}" --qat "$f" --steps 0
    for seed in $seeds; do
      run "ptq_${tag}_of_fp32_finetune_seed$seed" before --layout 1 --weights "$work/fp32_$seed/model" "${common[@]}" --qat "$f" --steps 0 --seed "$seed"
      run "qat_${tag}_seed$seed" after --layout 2 --weights "$work/base/model" "${common[@]}" --qat "$f" --steps "$steps" --seed "$seed" --save "$work/qat_${tag}_$seed"
    done
  done
} | tee "$work/raw.txt"
out=benchmarks/results/quant_quality_$(hostname -s)_$(date +%Y%m%d).md
source benchmarks/results_file.sh && results_begin "$out" "Quantization-aware training against post-training quantization: the demo model in int4"
{
  echo "- base: moondream_train --layout 2 --eval-samples 200 (the main job's recipe: tiny config from scratch, 2 CPU ranks), fp32"
  echo "- fp32_finetune: moondream_train --layout 2 --weights base/model --freeze-vision off --steps $steps --optimizer adamw --lr $lr --seed S (the control: what the extra steps give unquantized)"
  echo "- qat F: the same with --qat F: the held-out accuracy of its packed export (model/quantized, dequantized per use)"
  echo "- ptq F of M: moondream_train --layout 1 --weights M/model --freeze-vision off --qat F --steps 0: the held-out accuracy of M's weights rounded to F (every linear but the patch embedding), no training"
  echo "- formats: int4 = symmetric, a scale per group of 64 of a row; int4/g128 groups of 128; int4/channel a scale per row"
  echo "- held-out: 200 generated questions, the set of the run's --seed (the base and its PTQ: seed 1; a seed-S fine-tune, its PTQ and the seed-S QAT: seed S's set)"
} >> "$out"
results_end "$out" "$work/raw.txt"
