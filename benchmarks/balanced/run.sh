#!/usr/bin/env bash
# Balanced fine-tuning layouts (issue 18): moondream with the vision encoder frozen, 1F1B on CPU ranks, the
# naive layouts against the balanced ones, side by side in alternating rounds:
#   2   vision | text                      2b  2 devices cut where the config's costs say (costs.hpp)
#   4   vision | text in 3 equal ranges    4b  4 devices cut where the costs say (the encoder may span two)
# Reports the median step time (steps after the first of each run), the ratio balanced / naive, and the
# predicted bubble (the proof under the config's FLOP costs) beside the measured one (the last step's trace:
# 1 - compute / wall, mean over ranks). Layouts 4 and 4b run 4 ranks: on a 2-core machine they share the
# cores two to a core, which the table says. Usage:
#   benchmarks/balanced/run.sh [build-dir] [rounds] [steps] [config] [layouts]
set -euo pipefail
build=${1:-build} rounds=${2:-3} steps=${3:-4} config=${4:-medium} layouts=${5:-"2 2b 4 4b"}
train="$build/examples/moondream/moondream_train"
out=$(mktemp -d)
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
source "$(dirname "$0")/../results_file.sh" && describe_machine
common=(--config "$config" --schedule 1f1b --freeze-vision on --microbatch-size 1 --eval-samples 0 --quiet --warmup 0 --timeout 600)
echo "config $config, --freeze-vision on, 1F1B, $steps steps per run (the first dropped), micro-batch 1 x 4, $rounds alternating rounds"
"$train" "${common[@]}" --plan
for r in $(seq 1 "$rounds"); do
  for layout in $layouts; do
    tag="l$layout-r$r"
    "$train" "${common[@]}" --layout "$layout" --steps "$steps" --metrics "$out/$tag.jsonl" --trace "$out/$tag.trace.json" \
      > "$out/$tag.log" 2>&1 || { cat "$out/$tag.log"; exit 1; }
    echo "round $r layout $layout: $(python3 -c "import json,sys; print(' '.join('%.3f' % json.loads(l)['seconds'] for l in open(sys.argv[1])))" "$out/$tag.jsonl") s; $(grep -m1 'bubble of step' "$out/$tag.log")"
  done
done
python3 - "$out" "$rounds" "$layouts" <<'PY'
import json, os, re, statistics, sys
out, rounds, layouts = sys.argv[1], int(sys.argv[2]), sys.argv[3].split()
print("\n| layout | cut (costs from the config) | median s/step | against the naive layout | predicted bubble (FLOP costs) | measured bubble (median) |")
print("|---|---|---|---|---|---|")
med = {}
for layout in layouts:
    secs, meas = [], []
    for r in range(1, rounds + 1):
        tag = f"l{layout}-r{r}"
        secs += [json.loads(l)["seconds"] for l in open(os.path.join(out, tag + ".jsonl"))][1:]
        log = open(os.path.join(out, tag + ".log")).read()
        m = re.search(r"measured ([0-9.]+)% ", log)
        if m: meas.append(float(m.group(1)))
        plan = re.search(r"costs from the config \(FLOPs\): layout [0-9b]+: (.*?); predicted step ([0-9.]+) [GT]FLOP-time, bubble ([0-9.]+)%", log)
    med[layout] = statistics.median(secs)
    naive = layout.rstrip("b")
    ratio = f"{med[layout] / med[naive]:.3f}" if layout.endswith("b") and naive in med else ""
    cut = plan.group(1).replace(" | ", " \\| ")
    print(f"| {layout} | {cut} | {med[layout]:.3f} | {ratio} | {plan.group(3)}% | {statistics.median(meas) if meas else 'n/a'}% |")
PY
