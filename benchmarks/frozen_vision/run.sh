#!/usr/bin/env bash
# Frozen-vision fine-tuning layouts (issue 18): moondream (default medium) with the vision encoder frozen,
# layouts 2 (vision | text) and 4 (vision | text x 3), 1F1B on CPU ranks. Two contenders per layout, run
# side by side in alternating rounds:
#   forward-only  the vision stage is mpx::Frozen: forwards under no-grad, no backward, no gradient message
#   backward      the vision stage as before (trainable type, parameters frozen at run time): it still runs
#                 a backward per micro-batch and receives the text stage's input gradients
# Reports the median step time (steps after the first of each run), the ratio, and the expected bubble
# (the proof's, unit costs) beside the measured one (the last step's trace: 1 - compute / wall, mean over ranks).
# Usage: benchmarks/frozen_vision/run.sh [build-dir] [rounds] [steps] [config]
set -euo pipefail
build=${1:-build} rounds=${2:-3} steps=${3:-4} config=${4:-medium}
train="$build/examples/moondream/moondream_train"
out=$(mktemp -d)
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
source "$(dirname "$0")/../results_file.sh" && describe_machine
echo "config $config, --freeze-vision on, 1F1B, $steps steps per run (the first dropped), micro-batch 1 x 4, $rounds alternating rounds"
for r in $(seq 1 "$rounds"); do
  for layout in 2 4; do
    for mode in on off; do
      tag="l$layout-$mode-r$r"
      "$train" --config "$config" --layout "$layout" --schedule 1f1b --freeze-vision on --vision-forward-only "$mode" --steps "$steps" \
        --microbatch-size 1 --eval-samples 0 --quiet --warmup 0 --timeout 600 --metrics "$out/$tag.jsonl" --trace "$out/$tag.trace.json" \
        > "$out/$tag.log" 2>&1 || { cat "$out/$tag.log"; exit 1; }
      echo "round $r layout $layout vision-forward-only $mode: $(python3 -c "import json,sys; print(' '.join('%.3f' % json.loads(l)['seconds'] for l in open(sys.argv[1])))" "$out/$tag.jsonl") s; $(grep -m1 'bubble of step' "$out/$tag.log")"
    done
  done
done
python3 - "$out" "$rounds" <<'PY'
import json, os, re, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
print("\n| layout | vision | median s/step | forward-only / backward | expected bubble | measured bubble (median) |")
print("|---|---|---|---|---|---|")
for layout in ["2", "4"]:
    med = {}
    for mode in ["on", "off"]:
        secs, meas, exp = [], [], None
        for r in range(1, rounds + 1):
            tag = f"l{layout}-{mode}-r{r}"
            secs += [json.loads(l)["seconds"] for l in open(os.path.join(out, tag + ".jsonl"))][1:]
            m = re.search(r"measured ([0-9.]+)% .*expected ([0-9.]+)%", open(os.path.join(out, tag + ".log")).read())
            if m: meas.append(float(m.group(1))); exp = float(m.group(2))
        med[mode] = statistics.median(secs)
        name = "forward only (Frozen stage)" if mode == "on" else "backward (frozen at run time)"
        ratio = f"{med['on'] / med['off']:.3f}" if mode == "off" else ""
        print(f"| {layout} | {name} | {med[mode]:.3f} | {ratio} | {exp}% | {statistics.median(meas) if meas else 'n/a'}% |")
PY
