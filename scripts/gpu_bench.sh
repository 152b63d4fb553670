#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The GPU benchmark, one short run on a lent GPU machine (after scripts/gpu_deps.sh here; beside
# scripts/gpu_check.sh in one prepared script):
#   1. moondream text fine-tuning throughput on cuda:0 (benchmarks/gpu/text_throughput.cpp): the md2 text
#      decoder, bf16 autocast, image-prefixed sequences, batch 8 and 16, as a plain LibTorch loop (AdamW) and
#      as a one-stage mpx pipeline (AdamW) in 2 alternating rounds (their ratio), then mpx with block
#      checkpointing, with 8-bit AdamW, and both: tokens/s and model FLOPs utilisation against the GPU's
#      dense bf16 peak (from its name: H100/H200 989 TFLOPS, A100 312; else PEAK_TFLOPS=...);
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
  configs=("tiny 2"); rounds=1; device=cpu; peak=0; sw_build=$build; sw=(1 3); ms="2"; python=${PYTHON:-/usr/bin/python3}
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
  configs=("md2 8" "md2 16"); rounds=2; device=cuda; sw_build=$B/bench; sw=(3 20); ms="2 4 8 16"; python=${PYTHON:-python3}
fi
mkdir -p "$OUT"
status=0

# ---- 1. text fine-tuning throughput
: > "$OUT/text_throughput.jsonl"
# plain LibTorch and the one-stage mpx pipeline in alternating rounds (their ratio), then mpx's variants once
text_run() {  # text_run <config> <batch> <tag> [flags...]: one run, its JSON line appended
  local config=$1 batch=$2 tag=$3; shift 3
  local steps=20 warm=3
  [ $dry = 1 ] && steps=2 warm=1
  if timeout 600 "$text" --config "$config" --device "$device" --precision bf16 --batch "$batch" --answer-tokens 128 \
       --steps $steps --warmup $warm --peak-tflops "$peak" "$@" >> "$OUT/text_throughput.jsonl" 2> "$OUT/text_${config}_${batch}_$tag.err"; then
    tail -1 "$OUT/text_throughput.jsonl"
  else
    echo "text_throughput $config batch $batch $tag failed:"; tail -5 "$OUT/text_${config}_${batch}_$tag.err"; status=1
  fi
}
for c in "${configs[@]}"; do
  read -r config batch <<< "$c"
  for round in $(seq "$rounds"); do
    text_run "$config" "$batch" plain --loop plain
    text_run "$config" "$batch" mpx --loop mpx
  done
done
read -r config batch <<< "${configs[0]}"
if [ $dry = 0 ]; then  # (the dry run checks the flags together, once)
  text_run "$config" "$batch" mpx-ckpt --loop mpx --checkpoint-blocks
  text_run "$config" "$batch" mpx-8bit --loop mpx --optimizer adamw8bit
fi
text_run "$config" "$batch" mpx-8bit-ckpt --loop mpx --optimizer adamw8bit --checkpoint-blocks

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
  echo "| loop | optimizer | checkpoint blocks | config | batch | positions | params | step (s) | tokens/s | model TFLOPS | MFU |"
  echo "|---|---|---|---|---|---|---|---|---|---|---|"
  python3 - "$OUT/text_throughput.jsonl" <<'EOF'
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
for r in rows:
    mfu = "n/a" if r["mfu"] is None else f'{100 * r["mfu"]:.1f} %'
    print(f'| {r["loop"]} | {r["optimizer"]} | {"yes" if r["checkpoint_blocks"] else "no"} | {r["config"]} | {r["batch"]} | {r["positions"]} | '
          f'{r["params"] / 1e6:.1f} M | {r["step_s"]:.4f} | {r["tokens_per_s"]:.0f} | {r["model_tflops"]:.2f} | {mfu} |')
print()
print("mpx (AdamW, no checkpointing) against the plain LibTorch loop, tokens/s, per alternating round:")
print()
for key in sorted({(r["config"], r["batch"]) for r in rows}):
    plain = [r["tokens_per_s"] for r in rows if (r["config"], r["batch"]) == key and r["loop"] == "plain"]
    mine = [r["tokens_per_s"] for r in rows if (r["config"], r["batch"]) == key and r["loop"] == "mpx" and r["optimizer"] == "adamw"
            and not r["checkpoint_blocks"]]
    ratios = [m / p for p, m in zip(plain, mine)]
    if ratios:
        print(f'- {key[0]} batch {key[1]}: ' + ", ".join(f"{x:.3f}" for x in ratios) + f' (median {statistics.median(ratios):.3f}x)')
EOF
  echo
  echo "Raw: \`text_throughput.jsonl\`; small work: \`$(cd "$OUT" && ls smallwork_*.md 2>/dev/null | head -1)\`."
} > "$OUT/gpu_bench.md"
cat "$OUT/gpu_bench.md"
echo "== gpu_bench done in $(( $(date +%s) - t0 )) s, status $status"
exit $status
