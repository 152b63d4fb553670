#!/usr/bin/env bash
# Moondream benchmark: one config (default medium, ~94 M parameters) trained for a few steps with layout 1
# (one process, plain LibTorch), 2 (vision | text) and 4 (vision | text x 3), side by side in one run.
# Reports samples/s and tokens/s (steps after the first) and the ratios to layout 1.
# Usage: benchmarks/moondream/run.sh [build-dir] [config] [steps] [microbatch-size]
set -euo pipefail
build=${1:-build} config=${2:-medium} steps=${3:-4} mb=${4:-1}
train="$build/examples/moondream/moondream_train"
out=$(mktemp -d)
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
source "$(dirname "$0")/../results_file.sh" && describe_machine
echo "config $config, $steps steps, micro-batch $mb x 4 micro-batches per step, generated images at the crop size (2 crops each)"
for layout in 1 2 4; do
  "$train" --config "$config" --layout "$layout" --steps "$steps" --microbatch-size "$mb" --eval-samples 0 --quiet \
    --warmup 0 --timeout 600 --metrics "$out/$layout.jsonl" > "$out/$layout.log" 2>&1 || { cat "$out/$layout.log"; exit 1; }
done
python3 - "$out" <<'PY'
import json, sys, os
rows = {}
for layout in ["1", "2", "4"]:
    m = [json.loads(l) for l in open(os.path.join(sys.argv[1], layout + ".jsonl"))][1:]  # drop the first step
    secs = sum(x["seconds"] for x in m)
    samples = sum(x["samples_per_s"] * x["seconds"] for x in m)
    tokens = sum(x["tokens_per_s"] * x["seconds"] for x in m)
    rows[layout] = (samples / secs, tokens / secs, secs / len(m))
base = rows["1"][0]
print("| layout | ranks | s/step | samples/s | tokens/s | vs one process |")
print("|---|---|---|---|---|---|")
for layout, ranks in [("1", 1), ("2", 2), ("4", 4)]:
    s, t, step = rows[layout]
    print(f"| {layout} | {ranks} | {step:.2f} | {s:.3f} | {t:.1f} | {s / base:.2f}x |")
PY
