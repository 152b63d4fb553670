#!/usr/bin/env bash
# Devices of different speeds (issue 40): moondream layout 2b on two CPU ranks, one of them held to a fraction of a
# core for the whole run by its CPU cgroup's quota (scripts/slow_rank.py --method cgroup; the signals method where
# no cgroup is writable), side by side in alternating rounds:
#   flops     the cut for equal speeds from the config's FLOPs (what 2b does by default)
#   equal     the cut for equal speeds, costs measured (--costs measured: the encoder's time per FLOP timed)
#   declared  --device-speeds for the quota (e.g. 1,0.5), costs measured
#   probe     --device-speeds probe (each rank times matrix products first, held as it is), costs measured
# The speed-aware cuts are compared with "equal": the same cost model, the speeds the only difference.
# Reports each contender's median step (steps after the first of each run), the ratio to the equal cut's, the cut
# and the predicted step; writes benchmarks/results/balanced_speeds_<host>_<date>.md. Usage:
#   [CONTENDERS="flops equal declared probe"] [FREEZE=on|off] benchmarks/balanced/speeds.sh [build-dir] [rounds] [steps] [config] [slow-rank] [fraction] [method]
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build} rounds=${2:-3} steps=${3:-4} config=${4:-medium} slow=${5:-1} fraction=${6:-0.5} method=${7:-cgroup}
here=benchmarks/balanced
train="$build/examples/moondream/moondream_train"
out=$(mktemp -d)
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
source benchmarks/results_file.sh
declared=$([ "$slow" = 0 ] && echo "$fraction,1" || echo "1,$fraction")
common=(--config "$config" --layout 2b --schedule 1f1b --freeze-vision "${FREEZE:-on}" --microbatch-size 1 --eval-samples 0 --quiet --warmup 0 --timeout 600)
{
describe_machine
echo "config $config, layout 2b, --freeze-vision ${FREEZE:-on}, 1F1B, $steps steps per run (the first dropped), micro-batch 1 x 4, $rounds alternating rounds;"
echo "rank $slow held to $fraction of a core ($method) for the whole run; declared speeds $declared"
for r in $(seq 1 "$rounds"); do
  for who in ${CONTENDERS:-flops equal declared probe}; do
    case $who in
      flops) extra=() ;;
      equal) extra=(--costs measured) ;;
      declared) extra=(--costs measured --device-speeds "$declared") ;;
      probe) extra=(--costs measured --device-speeds probe) ;;
    esac
    tag="$who-r$r"
    "$train" "${common[@]}" "${extra[@]}" --steps "$steps" --metrics "$out/$tag.jsonl" > "$out/$tag.log" 2>&1 &
    job=$!
    python3 "$here/../../scripts/slow_rank.py" "$job" "$slow" "$fraction" --method "$method" > "$out/$tag.slow.log" 2>&1 &
    holder=$!
    if ! wait $job; then cat "$out/$tag.log" "$out/$tag.slow.log"; exit 1; fi
    wait $holder
    grep -q "holding rank $slow" "$out/$tag.slow.log" || { echo "rank $slow was not held:"; cat "$out/$tag.slow.log"; exit 1; }
    echo "round $r $who: $(python3 -c "import json,sys; print(' '.join('%.3f' % json.loads(l)['seconds'] for l in open(sys.argv[1])))" "$out/$tag.jsonl") s; $(grep -m1 "devices' speeds .*:" "$out/$tag.log" || echo 'equal speeds'); $(grep -m1 "encoder's time per FLOP" "$out/$tag.log" || echo 'FLOP costs')"
  done
done
python3 - "$out" "$rounds" <<'PY'
import json, os, re, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
print("\n| cut | slot 0 \\| slot 1 (costs from the config) | predicted step (fastest device's time) | median s/step | against the faster equal-speed cut |")
print("|---|---|---|---|---|")
rows, med = [], {}
for who in [w for w in ["flops", "equal", "declared", "probe"] if os.path.exists(os.path.join(out, f"{w}-r1.jsonl"))]:
    secs, cuts = [], set()
    for r in range(1, rounds + 1):
        tag = f"{who}-r{r}"
        secs += [json.loads(l)["seconds"] for l in open(os.path.join(out, tag + ".jsonl"))][1:]
        log = open(os.path.join(out, tag + ".log")).read()
        plan = re.search(r"costs from the config \(FLOPs\): layout 2b: (.*?)(; encoder at [^;]*)?(; devices' speeds [0-9., ]+)?; predicted step ([0-9.]+ [GT]FLOP-time)", log)
        cuts.add((plan.group(1).replace(" | ", " \\| ") + (plan.group(2) or "") + (plan.group(3) or ""), plan.group(4)))
    med[who] = statistics.median(secs)
    rows += [(who, cut, predicted) for cut, predicted in sorted(cuts)]
base = min(v for k, v in med.items() if k in ("flops", "equal"))  # the better equal-speed cut: the strongest baseline
for who, cut, predicted in rows:
    print(f"| {who} | {cut} | {predicted} | {med[who]:.3f} | {med[who] / base:.3f} |")
PY
} | tee "$out/raw.txt"
file=benchmarks/results/balanced_speeds_$(hostname -s)_$(date +%Y%m%d).md
results_begin "$file" "Devices of different speeds: layout 2b cut for them, one rank held to $fraction of a core"
sed -n '/^| cut/,$p' "$out/raw.txt" >> "$file"
results_end "$file" "$out/raw.txt"
