#!/usr/bin/env bash
# Sharded data parallelism (ZeRO): what each rank holds, measured with the allocator's statistics beside the
# formula's bytes, at d = 2 and 4 replicas x 2 stages, levels 0 (unsharded), 1, 2 and 3, fp32 and 8-bit
# AdamW; the bytes each rank sends per step; and the step time of levels 1, 2 and 3 against unsharded data
# parallelism in alternating rounds (d = 2). Writes benchmarks/results/zero_<host>_<date>.md.
#   benchmarks/zero/run.sh [build-dir] [rounds]
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
rounds=${2:-5}
bench=$build/benchmarks/zero/zero_bench
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
raw=$(mktemp)
trap 'rm -f "$raw"' EXIT
for d in 2 4; do
  for opt in adamw adamw8bit; do
    for level in 0 1 2 3; do
      MPX_KEEP_HOST_MEMORY=0 "$bench" "$d" "$level" "$opt" 4 | grep -o 'result .*' | sed 's/^/memory /' | tee -a "$raw"
    done
  done
done
for r in $(seq "$rounds"); do
  for level in 0 1 2 3; do
    "$bench" 2 "$level" adamw 10 | grep -o 'result .*' | sed "s/^/time $r /" | tee -a "$raw"
  done
done
out=benchmarks/results/zero_$(hostname -s)_$(date +%Y%m%d).md
source benchmarks/results_file.sh && keep_earlier "$out"
{
  echo "# Sharded data parallelism (ZeRO): bytes per rank, bytes sent, step time"
  echo
  echo "- date: $(date -u +%Y-%m-%dT%H:%MZ); $(describe_machine | paste -sd ';' - | sed 's/;/; /g')"
  echo "- mpx: $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- include || echo ' with uncommitted changes to include/'); sharded stages reduce-scatter their gradients (an all-to-all per bucket) and all-gather their parameters (level 3: before the stage's first compute of a step, kept whole to its last)"
  echo "- model: benchmarks/runtime/model.hpp, 2 stages x 4 Linear 1024x1024 (N = 4,198,400 parameters per stage), 1F1B, 8 micro-batches of 64 rows, clipping on; d replicas (2d ranks on this machine); Gloo, the pipeline's messages through shared memory"
  echo "- measured (benchmarks/zero/zero_bench.cpp): params = bytes building the trainer added; grads = bytes in use at the optimizer's entry less those once the step returned, median over the steps after the first; state = bytes the first optimizer step added; peak = the process's peak resident set (libraries included); bytes measured with mpx's host cache off (MPX_KEEP_HOST_MEMORY=0: malloc's statistics count what tensors asked for, page-rounded; the cache would round each large block up to its size class), step times with it on; sent = bytes written to sockets per step (/proc/self/io wchar, median); formula: 4N weights (level 3: 4S between steps), 4N gradients (levels 2, 3: 4S), AdamW 8N (sharded: 8S), 8-bit AdamW per tensor or piece of n elements 2n + 8 n/256 in 256-blocks (under 4096 elements: 8n), plus its quantizers' lookup tables once per process (2 x 129 KiB), S = ceil(N / d)"
  echo
  python3 - "$raw" <<'PY'
import sys, math, statistics
rows = [l.split() for l in open(sys.argv[1])]
N_layer_w, N_layer_b = 1024 * 1024, 1024
def pieces(d, index):
    sizes = [N_layer_w, N_layer_b] * 4
    N = sum(sizes); S = (N + d - 1) // d; b, e = index * S, min(N, (index + 1) * S)
    out, off = [], 0
    for n in sizes:
        lo, hi = max(b, off), min(e, off + n)
        if hi > lo: out.append(hi - lo)
        off += n
    return out, N, S
def eight(n): return 2 * math.ceil(n / 256) * 256 + 8 * math.ceil(n / 256) if n >= 4096 else 8 * n
def formula(d, level, opt, index):
    ps, N, S = pieces(d, index) if level > 0 else pieces(1, 0)
    if level == 0: ps = [N_layer_w, N_layer_b] * 4
    grads = 4 * S if level >= 2 else 4 * N
    # 8-bit: the two quantizers' lookup tables (65,536 uint16 each) and code books (256 floats each), built at
    # the first 8-bit step of a process, count once
    state = sum(eight(n) for n in ps) + 2 * (65536 * 2 + 256 * 4) if opt == "adamw8bit" else 8 * sum(ps)
    return (4 * S if level == 3 else 4 * N), grads, state
def pct(a, b): return f"{100 * (a - b) / b:+.1f}%"
mib = lambda x: f"{x / 2**20:.2f}"
print("## Bytes per rank (MiB), measured against the formula")
print()
print("| d | level | optimizer | rank | params | formula | grads | formula | state | formula | peak RSS | sent / step |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
worst = 0.0
for r in (r for r in rows if r[0] == "memory"):
    _, _, d, lv, opt, rank, n, params, grads, state, peak, sent, step = r
    d, level, rank = int(d), int(lv[0]), int(rank)
    index = rank // 2  # replica: ranks are replica-major, 2 slots per replica
    fp, fg, fs = formula(d, level, opt, index)
    worst = max(worst, abs(int(params) - fp) / fp, abs(int(grads) - fg) / fg, abs(int(state) - fs) / fs)
    print(f"| {d} | {lv} | {opt} | {rank} | {mib(int(params))} | {mib(fp)} ({pct(int(params), fp)}) | {mib(int(grads))} | {mib(fg)} ({pct(int(grads), fg)}) "
          f"| {mib(int(state))} | {mib(fs)} ({pct(int(state), fs)}) | {mib(int(peak))} | {mib(float(sent))} |")
print()
print(f"Largest difference from the formula: {100 * worst:.1f}%.")
print()
print("## Bytes sent per step and rank (MiB), against the all-reduce's 2(d-1)/d x 4N")
print()
print("| d | optimizer | level 0 | level 1 | level 2 | level 3 | all-reduce formula | 1 / 0 | 2 / 0 | 3 / 0 |")
print("|---|---|---|---|---|---|---|---|---|---|")
for d in (2, 4):
    for opt in ("adamw", "adamw8bit"):
        sent = {r[3]: statistics.median(float(x[11]) for x in rows if x[0] == "memory" and x[2] == r[2] and x[3] == r[3] and x[4] == opt)
                for r in rows if r[0] == "memory" and int(r[2]) == d and r[4] == opt}
        ar = 2 * (d - 1) / d * 4 * 4198400
        f = lambda k: mib(sent[k]) if k in sent else "-"
        q = lambda k: f"{sent[k] / sent['0']:.2f}" if k in sent else "-"
        print(f"| {d} | {opt} | {f('0')} | {f('1')} | {f('2')} | {f('3')} | {mib(ar)} | {q('1')} | {q('2')} | {q('3')} |")
print()
print("## Step time, d = 2, fp32 AdamW: levels in alternating rounds (median seconds per step, the slowest rank's)")
print()
t = {}
for r in (r for r in rows if r[0] == "time" and r[6] == "0"):  # rank 0's line: the slowest rank's median
    t.setdefault(r[4], []).append(float(r[13]))
ks = ["1", "2", "3"]
print("| round | level 0 | " + " | ".join(f"level {k}" for k in ks) + " | " + " | ".join(f"{k} / 0" for k in ks) + " |")
print("|---" * (2 + 2 * len(ks)) + "|")
for i in range(len(t["0"])):
    print(f"| {i + 1} | {t['0'][i]:.4f} | " + " | ".join(f"{t[k][i]:.4f}" for k in ks) + " | " + " | ".join(f"{t[k][i] / t['0'][i]:.3f}" for k in ks) + " |")
med = [statistics.median(a / b for a, b in zip(t[k], t["0"])) for k in ks]
print("| median |" + " |" * (len(ks) + 1) + " " + " | ".join(f"{m:.3f}" for m in med) + " |")
PY
} > "$out"
results_end "$out" "$raw"
