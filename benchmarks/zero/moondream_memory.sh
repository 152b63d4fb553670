#!/usr/bin/env bash
# Sharded data parallelism on the moondream *medium* config (~94 M parameters): what each of the 4 ranks of
# layout 2x2 (2 replicas x vision | text) holds at ZeRO levels 0, 1, 2 and 3, fp32 and 8-bit AdamW, measured
# with malloc's statistics (`moondream_train --memory-report`, mpx's host cache off) beside the formulas.
# Writes benchmarks/results/zero_moondream_<host>_<date>.md (an earlier file of the day goes below it).
#   benchmarks/zero/moondream_memory.sh [build-dir] [steps] [levels, default "0 1 2 3"]
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
steps=${2:-4}
levels=${3:-0 1 2 3}
train=$build/examples/moondream/moondream_train
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
raw=$(mktemp)
trap 'rm -f "$raw"' EXIT
for opt in adamw adamw8bit; do
  for shard in $levels; do
    start=$(date +%s)
    MPX_KEEP_HOST_MEMORY=0 "$train" --config medium --layout 2x2 --shard "$shard" --optimizer "$opt" --steps "$steps" \
      --microbatch-size 1 --train-samples 64 --eval-samples 0 --checkpoint-blocks --quiet --memory-report |
      grep -o 'memory rank .*' | sort | sed "s/^/$opt $shard /" | tee -a "$raw"
    echo "($opt, level $shard: $(( $(date +%s) - start )) s)" >&2
  done
done
out=benchmarks/results/zero_moondream_$(hostname -s)_$(date +%Y%m%d).md
source benchmarks/results_file.sh && results_begin "$out" "Sharded data parallelism (ZeRO) on the moondream medium config: bytes per rank"
{
  echo "- run: moondream_train --config medium --layout 2x2 --shard L --optimizer O --steps $steps --microbatch-size 1 --train-samples 64 --checkpoint-blocks --memory-report, MPX_KEEP_HOST_MEMORY=0 (activation checkpointing per block keeps the vision ranks' activations within this 23 GiB machine: without it a vision rank peaked at 12-13.6 GiB) (ranks 0 and 2: vision, replicas 0 and 1; ranks 1 and 3: text)"
  echo "- measured (examples/moondream/memory_report.hpp): weights = bytes building the trainer added (the model's buffers too); gradients = bytes in use in the before_optimizer hook less those once the step returned (median over the steps after the first; the whole gradients: a ZeRO-2 stage keeps its shard of them after the hook); state = bytes the first step added; formula: 4 x elements for weights (level 3: the stepped shard's, what it keeps between steps) and gradients, AdamW 8 x stepped elements, 8-bit AdamW 2 x stepped + a float per 256-block + its lookup tables"
  echo
  echo "| optimizer | level | rank | weights MiB | formula | gradients MiB | formula | state MiB | formula | peak resident MiB |"
  echo "|---|---|---|---|---|---|---|---|---|---|"
  memory_rows "$raw"
} >> "$out"
results_end "$out" "$raw"
