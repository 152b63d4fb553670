#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The GPU benchmark, one short run on a lent GPU machine (after scripts/gpu_deps.sh here; beside
# scripts/gpu_check.sh in one prepared script):
#   1. moondream text fine-tuning throughput on cuda:0 (benchmarks/gpu/text_throughput.cpp): the md2 text
#      decoder, bf16 autocast, AdamW, image-prefixed sequences, batch 4, 8 and 16: tokens/s and model FLOPs
#      utilisation against the GPU's dense bf16 peak (from its name: H100/H200 989 TFLOPS, A100 312; else
#      PEAK_TFLOPS=...);
#   2. the small-work benchmark (benchmarks/smallwork) on the host's cores: mpx against one process, the
#      hand-written c10d program and a Python loop, two CPU ranks, one thread each.
# Builds with plain g++ against the Python torch (scripts/gpu_env.sh). Writes <out>/gpu_bench.md and the raw
# JSON lines; <out> defaults to build-gpu/bench.
#   scripts/gpu_bench.sh [out]
#   scripts/gpu_bench.sh --dry-run [build-dir]   CPU, tiny config, binaries from the CMake build (CI runs it:
#                                                ctest -R mpx.bench.gpu_dry_run); writes under build-dir
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
dry=0
[ "${1:-}" = --dry-run ] && { dry=1; shift; }
t0=$(date +%s)

if [ $dry = 1 ]; then
  build=${1:-build}
  OUT=$build/gpu_bench_dry
  rm -rf "$OUT"
  text=$build/benchmarks/gpu/text_throughput
  for b in "$text" "$build/benchmarks/smallwork/smallwork_bench" "$build/tools/mpxrun"; do
    [ -x "$b" ] || { echo "gpu_bench --dry-run: $b is not built; build the CMake project first (scripts/test.sh does)"; exit 2; }
  done
  configs=("tiny 2"); device=cpu; peak=0; sw_build=$build; sw=(1 3); ms="2"; python=${PYTHON:-/usr/bin/python3}
else
  OUT=${1:-build-gpu/bench}
  B=build-gpu LOGS=$OUT/logs
  mkdir -p "$B/bench/benchmarks/gpu" "$B/bench/benchmarks/smallwork" "$B/bench/tools" "$LOGS"
  source scripts/gpu_env.sh  # TORCH, CXXFLAGS, LIBS, compile, link
  gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
  case "$gpu" in
    *H100*|*H200*) peak=989 ;;
    *A100*) peak=312 ;;
    *) peak=0 ;;
  esac
  peak=${PEAK_TFLOPS:-$peak}
  echo "GPU: ${gpu:-none found}; dense bf16 peak used: $peak TFLOPS" | tee -a "$LOGS/versions.txt"
  text=$B/bench/benchmarks/gpu/text_throughput
  # the three programs, in parallel
  compile "$text.o" benchmarks/gpu/text_throughput.cpp -O2 -DMOONDREAM_CONFIG_DIR="\"$PWD/examples/moondream/configs\"" &
  compile "$B/bench/smallwork_bench.o" benchmarks/smallwork/smallwork_bench.cpp -O2 &
  compile "$B/bench/mpxrun.o" tools/mpxrun.cpp -O2 &
  wait
  link "$text" "$text.o" && link "$B/bench/benchmarks/smallwork/smallwork_bench" "$B/bench/smallwork_bench.o" &&
    link "$B/bench/tools/mpxrun" "$B/bench/mpxrun.o" || { echo "gpu_bench: build failed (logs in $LOGS)"; exit 1; }
  echo "== built in $(( $(date +%s) - t0 )) s"
  configs=("md2 4" "md2 8" "md2 16"); device=cuda; sw_build=$B/bench; sw=(3 20); ms="2 4 8 16"; python=${PYTHON:-python3}
fi
mkdir -p "$OUT"
status=0

# ---- 1. text fine-tuning throughput
: > "$OUT/text_throughput.jsonl"
for c in "${configs[@]}"; do
  read -r config batch <<< "$c"
  steps=20 warm=3
  [ $dry = 1 ] && steps=2 warm=1
  if timeout 600 "$text" --config "$config" --device "$device" --precision bf16 --batch "$batch" --answer-tokens 128 \
       --steps $steps --warmup $warm --peak-tflops "$peak" >> "$OUT/text_throughput.jsonl" 2> "$OUT/text_${config}_${batch}.err"; then
    tail -1 "$OUT/text_throughput.jsonl"
  else
    echo "text_throughput $config batch $batch failed:"; tail -5 "$OUT/text_${config}_${batch}.err"; status=1
  fi
done

# ---- 2. small work on the host's cores
if RESULTS_DIR=$OUT MS="$ms" PYTHON=$python bash benchmarks/smallwork/run.sh "$sw_build" "${sw[@]}" > "$OUT/smallwork.log" 2>&1; then
  grep -m1 -A12 "^## " "$OUT"/smallwork_*.md | head -14
else
  echo "small-work benchmark failed:"; tail -15 "$OUT/smallwork.log"; status=1
fi

# ---- the report
{
  echo "# GPU benchmark — $(date -u +%Y-%m-%dT%H:%MZ)$([ $dry = 1 ] && echo ' (dry run: CPU, tiny config)')"
  echo
  echo "- machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); GPU: ${gpu:-none}; peak used: $peak TFLOPS"
  [ -f "${LOGS:-/nonexistent}/versions.txt" ] && sed 's/^/- /' "$LOGS/versions.txt"
  echo
  echo "| config | batch | positions | params | step (s) | tokens/s | model TFLOPS | MFU |"
  echo "|---|---|---|---|---|---|---|---|"
  python3 - "$OUT/text_throughput.jsonl" <<'EOF'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    mfu = "n/a" if r["mfu"] is None else f'{100 * r["mfu"]:.1f} %'
    print(f'| {r["config"]} | {r["batch"]} | {r["positions"]} | {r["params"] / 1e6:.1f} M | {r["step_s"]:.4f} | {r["tokens_per_s"]:.0f} | {r["model_tflops"]:.2f} | {mfu} |')
EOF
  echo
  echo "Raw: \`text_throughput.jsonl\`; small work: \`$(cd "$OUT" && ls smallwork_*.md 2>/dev/null | head -1)\`."
} > "$OUT/gpu_bench.md"
cat "$OUT/gpu_bench.md"
echo "== gpu_bench done in $(( $(date +%s) - t0 )) s, status $status"
exit $status
