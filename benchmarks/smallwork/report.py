# SPDX-License-Identifier: Apache-2.0
"""The small-work benchmark's report (called by run.sh): WORK holds raw.txt ("round m mode seconds"),
detail.txt ("round m mode rank step schedule compute wait optimizer end-of-step", ms), split.txt ("round m kept
split-ms whole-ms": what zbh1's measured split chose) and trace_<m>_<k>.json
(the last step of the k-th 1F1B run, every rank; their actions are pooled). Prints Markdown.

    python3 report.py WORK M...
"""
import collections
import glob
import json
import os
import statistics
import sys

work, ms = sys.argv[1], [int(m) for m in sys.argv[2:]]
MODES = ["whole", "accumulate", "gpipe", "1f1b", "1f1b-gloo", "1f1b-overlap", "1f1b-torch-adamw", "zbh1", "zbh1-split", "handwritten", "py-gpipe", "py-1f1b"]
MPX = ["gpipe", "1f1b", "1f1b-gloo", "1f1b-overlap", "1f1b-torch-adamw", "zbh1", "zbh1-split"]
med = statistics.median
PER, UNIT = int(os.environ.get("SW_PER", "8")), os.environ.get("SW_UNIT", "rows")  # a micro-batch's size (run.sh's MODEL)

raw = collections.defaultdict(dict)  # (m, mode) -> {round: seconds}
for line in open(f"{work}/raw.txt"):
    r, m, mode, t = line.split()
    raw[(int(m), mode)][int(r)] = float(t)
detail = collections.defaultdict(list)  # (m, mode, rank) -> [(step, schedule, compute, wait, optimizer, rest)]
for line in open(f"{work}/detail.txt"):
    f = line.split()
    detail[(int(f[1]), f[2], int(f[3]))].append(tuple(map(float, f[4:])))


split = collections.defaultdict(list)  # m -> [(round, kept, split ms, whole ms, paired ratio)]
try:
    for line in open(f"{work}/split.txt"):
        f = line.split()
        r, m, kept, a, b = f[:5]
        split[int(m)].append((int(r), int(kept), float(a), float(b), float(f[5]) if len(f) > 5 else float("nan")))
except OSError:
    pass


def paired(m, a, b):
    """Median over rounds of a's step time / b's, within each round."""
    rounds = sorted(set(raw.get((m, a), {})) & set(raw.get((m, b), {})))
    return med(raw[(m, a)][r] / raw[(m, b)][r] for r in rounds) if rounds else float("nan")


print("## Step time and paired ratios")
print()
print("Ratios are step-time ratios within a round, then the median over the rounds: below 1 is faster. "
      "'vs 1F1B' divides by mpx 1F1B's step; 'speed-up' is one process accumulating m micro-batches divided by the contender.")
print()
for m in ms:
    print(f"### m = {m} ({PER * m} {UNIT} per step)")
    print()
    print("| contender | step (ms) | vs mpx 1F1B | speed-up over one process (accumulating) | over one process (whole batch) |")
    print("|---|---|---|---|---|")
    for mode in MODES:
        if (m, mode) not in raw:
            continue
        t = med(raw[(m, mode)].values()) * 1e3
        print(f"| {mode} | {t:.2f} | {paired(m, mode, '1f1b'):.3f} | {1 / paired(m, mode, 'accumulate'):.3f} | "
              f"{1 / paired(m, mode, 'whole'):.3f} |")
    print()

print("## The bound: what any two-rank pipeline can reach against the whole batch")
print()
print("A pipeline runs micro-batches, so its work is one process's accumulating run, shared by the ranks and "
      "stretched by the bubble: with two ranks of equal stages and no overhead at all, 1F1B's step is accumulate x "
      "(m + 1) / (2 m). Where that is longer than the whole batch, no two-rank pipeline of this micro-batch size "
      "beats one process: micro-batching costs that process more than a second rank gives. Paired within each round, "
      "medians over the rounds.")
print()
print("| m | accumulate / whole | ideal 1F1B / whole | measured mpx 1F1B / whole | mpx 1F1B / ideal |")
print("|---|---|---|---|---|")
for m in ms:
    if (m, "whole") not in raw or (m, "accumulate") not in raw:
        continue
    ideal = (m + 1) / (2 * m)
    print(f"| {m} | {paired(m, 'accumulate', 'whole'):.3f} | {paired(m, 'accumulate', 'whole') * ideal:.3f} | "
          f"{paired(m, '1f1b', 'whole'):.3f} | {paired(m, '1f1b', 'accumulate') / ideal:.3f} |")
print()

print("## ZB-H1's measured split")
print()
print("zbh1 (TrainOptions::split_backward = measure) times its first steps split and whole and keeps the split only "
      "if the median of neighbouring split / whole walks is below 0.98; zbh1-split splits at every step. 'kept' counts "
      "the rounds whose run kept the split; its trial medians are the slowest rank's schedule walk. The step ratios are "
      "paired step-time ratios against mpx 1F1B.")
print()
print("| m | kept the split (rounds) | trial walk split / whole (ms, median over rounds) | trial split / whole, paired (median over rounds) | zbh1 / 1f1b | zbh1 / 1f1b in the rounds that kept the split | zbh1-split / 1f1b |")
print("|---|---|---|---|---|---|---|")
for m in ms:
    d = split.get(m, [])
    if not d:
        continue
    kept_rounds = [x[0] for x in d if x[1]]
    kept = [raw[(m, "zbh1")][r] / raw[(m, "1f1b")][r] for r in kept_rounds if r in raw[(m, "zbh1")] and r in raw[(m, "1f1b")]]
    print(f"| {m} | {len(kept_rounds)} of {len(d)} | {med(x[2] for x in d):.2f} / {med(x[3] for x in d):.2f} | "
          f"{med(x[4] for x in d):.3f} | {paired(m, 'zbh1', '1f1b'):.3f} | {med(kept) if kept else float('nan'):.3f} | {paired(m, 'zbh1-split', '1f1b'):.3f} |")
print()

print("## Where mpx's step goes (per rank, medians over the rounds, ms)")
print()
print("schedule = walking the actions (compute, waits for data, sends and receive posts); end-of-step = the step less the "
      "walk and the optimizer (gradient statistics, the loss/norm/inf all-reduce, zeroing); utilisation = compute / step.")
print()
print("| m | schedule | rank | step | schedule walk | compute | waits | optimizer | end-of-step | utilisation |")
print("|---|---|---|---|---|---|---|---|---|---|")
for m in ms:
    for mode in MPX:
        for rank in (0, 1):
            rows = detail.get((m, mode, rank))
            if not rows:
                continue
            c = [med(x[i] for x in rows) for i in range(6)]
            print(f"| {m} | {mode} | {rank} | {c[0]:.2f} | {c[1]:.2f} | {c[2]:.2f} | {c[3]:.2f} | {c[4]:.2f} | {c[5]:.2f} | {c[2] / c[0]:.2f} |")
print()

print("## Per-action costs in mpx 1F1B (the last step's trace of several runs, pooled; µs)")
print()
print("send / receive post: the action's whole duration; gap: from one action's end to the next one's start "
      "(the executor's own time between actions); compute: a forward's or backward's work, less its wait.")
print()
print("| m | sends | median / mean send | receive posts | median / mean receive post | mean gap between actions | mean forward | mean backward | waits (sum per step) |")
print("|---|---|---|---|---|---|---|---|---|")
for m in ms:
    by_rank = collections.defaultdict(list)  # (trace, rank) -> its actions: one step of one run
    for path in sorted(glob.glob(f"{work}/trace_{m}_*.json")):
        try:
            trace = json.load(open(path))["traceEvents"]
        except (OSError, ValueError):
            continue
        for e in trace:
            if e.get("ph") == "X":
                by_rank[(path, e["tid"])].append(e)
    if not by_rank:
        continue
    traces = len({path for path, _ in by_rank})
    kinds = collections.defaultdict(list)
    gaps, waits = [], 0
    for events in by_rank.values():
        events.sort(key=lambda e: e["ts"])
        for prev, e in zip(events, events[1:]):
            gaps.append(e["ts"] - (prev["ts"] + prev["dur"]))
        for e in events:
            name = e["name"]
            if e["cat"] == "wait":
                waits += e["dur"]
            elif name.startswith(("SF", "SB")):
                kinds["send"].append(e["dur"])
            elif name.startswith(("RF", "RB")):
                kinds["recv"].append(e["dur"])
            elif name.startswith("F"):
                kinds["F"].append(e["dur"])
            else:
                kinds["B"].append(e["dur"])
    mean = lambda v: sum(v) / len(v) if v else float("nan")
    mid = lambda v: med(v) if v else float("nan")
    print(f"| {m} | {len(kinds['send'])} | {mid(kinds['send']):.0f} / {mean(kinds['send']):.0f} | {len(kinds['recv'])} | "
          f"{mid(kinds['recv']):.0f} / {mean(kinds['recv']):.0f} | "
          f"{mean(gaps):.0f} | {mean(kinds['F']):.0f} | {mean(kinds['B']):.0f} | {waits / traces:.0f} |")
print()

print("## Raw step times per round (s)")
print()
for m in ms:
    for mode in MODES:
        if (m, mode) in raw:
            print(f"- m = {m}, {mode}: " + " ".join(f"{raw[(m, mode)][r]:.6f}" for r in sorted(raw[(m, mode)])))
