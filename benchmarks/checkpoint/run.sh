#!/usr/bin/env bash
# Checkpoint benchmark: the time and bytes of saving and loading a moondream checkpoint (default the medium
# config, ~94 M parameters, layout 2: vision | text on 2 ranks, 8-bit AdamW state), with XXH3-64 checksums
# on and off, in alternating rounds of one run. Each round: one training step, then Trainer::save (what
# moondream_train prints as "checkpoint ... written in S s"), then a fresh run resumes from it (Trainer::load,
# "resumed ... in S s"). Writes benchmarks/results/checkpoint_vm_<date>.md.
# Usage: benchmarks/checkpoint/run.sh [build-dir] [rounds] [config]
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build} rounds=${2:-3} config=${3:-medium}
train="$build/examples/moondream/moondream_train"
out=$(mktemp -d)
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
result=benchmarks/results/checkpoint_vm_$(date +%Y%m%d).md
source benchmarks/results_file.sh
keep_earlier "$result"
common=(--config "$config" --layout 2 --microbatch-size 1 --eval-samples 0 --quiet --warmup 0 --timeout 600)
raw="$out/raw.txt"
for round in $(seq "$rounds"); do
  for sums in on off; do
    dir="$out/$sums$round"
    "$train" "${common[@]}" --steps 1 --save "$dir" --checkpoint-checksums "$sums" > "$out/save.log" 2>&1 || { cat "$out/save.log"; exit 1; }
    save_s=$(grep -o "checkpoint .* written in [0-9.]* s" "$out/save.log" | tail -n 1 | awk '{print $(NF-1)}')
    bytes=$(du -sb "$dir/checkpoint/step-00000001" | cut -f1)
    "$train" "${common[@]}" --steps 1 --resume "$dir" --checkpoint-checksums "$sums" > "$out/load.log" 2>&1 || { cat "$out/load.log"; exit 1; }
    load_s=$(grep -o "resumed from .* in [0-9.]* s" "$out/load.log" | tail -n 1 | awk '{print $(NF-1)}')
    echo "round $round checksums $sums save_s $save_s load_s $load_s bytes $bytes" | tee -a "$raw"
    rm -rf "$dir"
  done
done
{
  echo "# Checkpoint save and load, $(date +%Y-%m-%d)"
  echo
  echo "machine: $(nproc --all) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); $(free -g | awk '/Mem/{print $2}') GiB; disk: $(df -h "$out" | awk 'NR==2{print $1}')"
  echo "LibTorch $(dpkg-query -W -f='${Version}' libtorch-dev 2>/dev/null), g++ $(g++ -dumpversion), xxHash $(dpkg-query -W -f='${Version}' libxxhash-dev 2>/dev/null)"
  echo "config $config, layout 2 (vision | text, 2 ranks), 8-bit AdamW, after 1 step; $rounds rounds, checksums on and off alternating"
  echo "(save: Trainer::save on both ranks, fsyncs included, as rank 0 times it; load: Trainer::load, checks included)"
  echo
  python3 - "$raw" <<'PY'
import sys, statistics as st
rows = [l.split() for l in open(sys.argv[1])]
by = {"on": [], "off": []}
for r in rows: by[r[3]].append((float(r[5]), float(r[7]), int(r[9])))
print("| checksums | save s (median) | load s (median) | bytes | save MB/s | load MB/s |")
print("|---|---|---|---|---|---|")
for k in ("on", "off"):
    s = st.median(x[0] for x in by[k]); l = st.median(x[1] for x in by[k]); b = by[k][0][2]
    print(f"| {k} | {s:.3f} | {l:.3f} | {b} | {b / s / 1e6:.0f} | {b / l / 1e6:.0f} |")
pairs = list(zip(by["on"], by["off"]))
print()
print(f"paired ratios on/off (per round): save {', '.join(f'{a[0] / b[0]:.2f}' for a, b in pairs)}; load {', '.join(f'{a[1] / b[1]:.2f}' for a, b in pairs)}")
print()
print("raw rounds:")
print()
print("```")
for l in open(sys.argv[1]): print(l.rstrip())
print("```")
PY
} > "$result"
append_earlier "$result"
cat "$result"
