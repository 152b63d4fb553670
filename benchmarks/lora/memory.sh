#!/usr/bin/env bash
# LoRA and QLoRA against a full fine-tune: what the text rank of layout 2 (vision frozen, forward only | text) holds, measured
# with malloc's statistics (`moondream_train --memory-report`, mpx's host cache off) beside the formulas, on
# the moondream *medium* config and, with CONFIGS="medium md2", on md2's real shapes (random weights: the
# set-up and a few steps; md2's full fine-tune needs 8-bit AdamW to fit this machine).
# Writes benchmarks/results/lora_memory_<host>_<date>.md (an earlier file of the day goes below it).
#   benchmarks/lora/memory.sh [build-dir] [steps]
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
steps=${2:-3}
configs=${CONFIGS:-medium}
train=$build/examples/moondream/moondream_train
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
raw=$(mktemp)
trap 'rm -f "$raw"' EXIT
for config in $configs; do
  full_opt=adamw
  [ "$config" = md2 ] && full_opt=adamw8bit
  for run in "full $full_opt" "lora16 adamw" "lora16 adamw8bit" "qlora16-nf4 adamw" "qlora16-int8 adamw"; do
    set -- $run
    what=$1 opt=$2
    flags=()
    case $what in
      lora16) flags=(--lora 16) ;;
      qlora16-*) flags=(--lora 16 --base-precision "${what#qlora16-}") ;;  # the frozen base packed (nf4: QLoRA's)
    esac
    start=$(date +%s)
    MPX_KEEP_HOST_MEMORY=0 "$train" --config "$config" --layout 2 --freeze-vision on --optimizer "$opt" --steps "$steps" "${flags[@]}" \
      --microbatch-size 1 --train-samples 64 --eval-samples 0 --checkpoint-blocks --quiet --memory-report |
      grep -o 'memory rank 1: .*' | sed "s/^/$config $what $opt /" | tee -a "$raw"
    echo "($config, $what, $opt: $(( $(date +%s) - start )) s)" >&2
  done
done
out=benchmarks/results/lora_memory_$(hostname -s)_$(date +%Y%m%d).md
source benchmarks/results_file.sh && results_begin "$out" "LoRA and QLoRA against a full fine-tune: bytes on moondream's text rank"
{
  echo "- run: moondream_train --config C --layout 2 --freeze-vision on --optimizer O [--lora 16 [--base-precision nf4|int8]] --steps $steps --microbatch-size 1 --train-samples 64 --checkpoint-blocks --memory-report, MPX_KEEP_HOST_MEMORY=0; rank 1 (the text stage; rank 0 is the frozen encoder, forward only, the same in every run)"
  echo "- measured (examples/moondream/memory_report.hpp): weights = bytes building the trainer added (base and adapters); gradients = bytes in use in the before_optimizer hook less those once the step returned (median over the steps after the first); state = bytes the first step added; formula: 4 x elements for weights (a packed base: its codes and scales, nf4 4 bits + an int8 block maximum per 64 + 8 bytes per row, int8 1 byte + 4 per row), 4 x trained elements for gradients, AdamW 8 x trained elements, 8-bit AdamW 2 x trained + a float per 256-block + its lookup tables"
  echo
  echo "| config | run | optimizer | rank | weights MiB | formula | gradients MiB | formula | state MiB | formula | peak resident MiB |"
  echo "|---|---|---|---|---|---|---|---|---|---|---|"
  memory_rows "$raw"
} >> "$out"
results_end "$out" "$raw"
