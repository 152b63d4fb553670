#!/usr/bin/env bash
# Tensor-parallel benchmark: what one transformer layer's collectives carry per micro-batch under TP 2
# (measured: tp::traffic of a 4-layer minus a 2-layer model, halved), against Megatron-LM's formula, with
# and without sequence parallelism; and the step time of TP 2 against TP 1 (one intra-op thread per rank,
# rounds alternating the modes); the activations one layer leaves for the backward per rank, with and without
# sequence parallelism (the allocator's live bytes after the forward). Writes benchmarks/results/tp_<host>_<date>.md.
#   benchmarks/tp/run.sh [build-dir] [rounds] [steps]
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}; rounds=${2:-3}; steps=${3:-10}
bench=$build/benchmarks/tp/tp_bench
mpxrun=$build/tools/mpxrun
export OMP_NUM_THREADS=1
b=8; s=64; h=256; n=2  # rows, sequence, width (tp_bench.cpp), degree
declare -A all traffic acts
for ((r = 0; r < rounds; r++)); do
  for mode in "plain 1" "plain 2" "sp 2"; do
    set -- $mode
    out=$("$mpxrun" --no-prefix --nproc-per-node "$2" "$bench" "$1" "$steps")
    t=$(echo "$out" | awk '/^result/ {print $4}')
    all["$1 $2"]="${all["$1 $2"]:-} $t"
    traffic["$1 $2"]=$(echo "$out" | grep '^traffic')
    acts["$1 $2"]=$(echo "$out" | grep '^activations')
    echo "round $r $1 TP$2 $t s/step"
  done
done
med() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
# one layer's payload per micro-batch: (4-layer step - 2-layer step) / 2, all-reduce and all-gather bytes
per_layer() {  # <mode> <field: 7 all-reduce calls, 9 bytes, 12 all-gather calls, 14 bytes>
  echo "${traffic["$1 $n"]}" | awk -v f="$2" '{v[$5]=$f} END {print (v["4:"] - v["2:"]) / 2}'
}
M=$((b * s * h * 4))  # bytes of one (b, s, h) fp32 activation
act_layer() {  # <mode> <degree>: one layer's activation bytes per rank, (4 layers - 2 layers) / 2
  echo "${acts["$1 $2"]}" | awk '{v[$4]=$5} END {printf "%.0f", (v[4] - v[2]) / 2}'
}
out=benchmarks/results/tp_$(hostname -s)_$(date +%Y%m%d).md
source benchmarks/results_file.sh && keep_earlier "$out"
t1=$(echo "${all["plain 1"]}" | med); t2=$(echo "${all["plain 2"]}" | med); t2sp=$(echo "${all["sp 2"]}" | med)
{
  echo "# Tensor parallelism on CPU ranks"
  echo
  echo "- date: $(date -u +%Y-%m-%dT%H:%MZ); machine: $(nproc --all) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(free -g | awk '/Mem:/{print $2}') GiB"
  echo "- LibTorch $(dpkg-query -W -f='${Version}' libtorch-dev 2>/dev/null), $(g++ --version | head -n 1), Gloo over loopback"
  echo "- model: tests/support/tiny_tp_transformer.hpp, width h = $h, 4 heads, sequence s = $s, vocabulary 512, b = $b rows, fp32; forward + backward + SGD; TP degree N = $n; $steps steps per round, $rounds rounds alternating"
  echo
  echo "## Bytes one transformer layer's collectives carry per micro-batch (forward + backward), TP $n"
  echo
  echo "Payload: an all-reduce's tensor, an all-gather's gathered result (tp::traffic). Megatron-LM (1909.08053, 2205.05198):"
  echo "without sequence parallelism 4 all-reduces of b·s·h; with it 4 all-gathers and 4 reduce-scatters of b·s·h (the same"
  echo "ring traffic, 4 · 2(N-1)/N · b·s·h per rank). One b·s·h fp32 tensor here: $M bytes."
  echo
  echo "| | all-reduces | all-reduce bytes | all-gathers | all-gather bytes | Megatron payload | ring bytes sent per rank, measured payload | ring, Megatron |"
  echo "|---|---|---|---|---|---|---|---|"
  for mode in plain sp; do
    ar=$(per_layer $mode 7); arb=$(per_layer $mode 9); ag=$(per_layer $mode 12); agb=$(per_layer $mode 14)
    if [ $mode = plain ]; then mega=$((4 * M)); else mega=$((8 * M)); fi
    ring=$(awk -v a="$arb" -v g="$agb" -v n=$n 'BEGIN {printf "%.0f", a * 2 * (n - 1) / n + g * (n - 1) / n}')
    ringm=$(awk -v m=$M -v n=$n 'BEGIN {printf "%.0f", 4 * m * 2 * (n - 1) / n}')
    echo "| $mode | $ar | $arb | $ag | $agb | $mega | $ring | $ringm |"
  done
  echo
  echo "Without sequence parallelism the measured layer is exactly Megatron's: 4 all-reduces of b·s·h. With it, 4 of the"
  echo "all-gathers are Megatron's operators and 2 are the backward's re-gathers of the column-parallel inputs (kept as"
  echo "shards: Megatron does the same, overlapping them with the gradient's matmul); the 4 reduce-scatters are all-reduces followed by a slice (Gloo 1.13 has no reduce-scatter), so"
  echo "the ring traffic is 1.5x Megatron's until a backend with reduce-scatter is used; the small extra all-reduces are the"
  echo "replicated parameters' gradient sums (2 LayerNorms and 2 row-parallel biases per layer)."
  echo
  echo "## Activations one layer holds for its backward, per rank (one micro-batch, fp32)"
  echo
  a1=$(act_layer plain 1); a2=$(act_layer plain 2); a2sp=$(act_layer sp 2)
  echo "| TP 1 | TP 2 | TP 2, sequence parallel | TP 2 / TP 1 | sequence parallel / TP 2 |"
  echo "|---|---|---|---|---|"
  echo "| $a1 B ($(awk -v a="$a1" -v m=$M 'BEGIN {printf "%.1f", a / m}') b·s·h) | $a2 B ($(awk -v a="$a2" -v m=$M 'BEGIN {printf "%.1f", a / m}') b·s·h) | $a2sp B ($(awk -v a="$a2sp" -v m=$M 'BEGIN {printf "%.1f", a / m}') b·s·h) | $(awk -v a="$a2" -v b="$a1" 'BEGIN {printf "%.3f", a / b}') | $(awk -v a="$a2sp" -v b="$a2" 'BEGIN {printf "%.3f", a / b}') |"
  echo
  echo "Measured as the live bytes of mpx's host cache (every CPU block of 128 KiB or more, rounded to its size classes)"
  echo "after the forward and the loss, less before it (a 4-layer minus a 2-layer model, halved; the last round's). Tensor parallelism splits what the"
  echo "attention and the MLP keep (q, k, v, the scores, the MLP's hidden activations); every rank still keeps the whole"
  echo "LayerNorm inputs and outputs. Sequence parallelism splits the LayerNorm and residual tensors too, and a"
  echo "column-parallel linear keeps only its shard of the input, gathering it again in the backward (tp::gathered_linear),"
  echo "as Megatron-LM does (2205.05198 §4.2.2), whose ideal is TP 1's activations divided by N"
  echo "($(awk -v a="$a1" -v m=$M -v n=$n 'BEGIN {printf "%.1f", a / m / n}') b·s·h here)."
  echo "This model has no dropout, so there are no masks to keep."
  echo
  echo "## Step time, 4 layers (median of $rounds rounds)"
  echo
  echo "| TP 1 (one rank) | TP 2 | TP 2, sequence parallel | TP 2 / TP 1 |"
  echo "|---|---|---|---|"
  echo "| $t1 s | $t2 s | $t2sp s | $(awk -v a="$t2" -v b="$t1" 'BEGIN {printf "%.3f", a / b}') |"
  echo
  echo "TP 1 is one rank with one intra-op thread; TP 2 is two such ranks on the machine's two shared vCPUs, each doing"
  echo "half of every matrix product and then waiting on the all-reduces. The ratio is that halved compute against the"
  echo "collectives' cost over loopback Gloo, not a scaling claim for real interconnects."
  echo
  echo "## Raw rounds (s per step)"
  echo
  for k in "plain 1" "plain 2" "sp 2"; do echo "- $k:${all[$k]}"; done
  echo
  echo "## Raw traffic lines"
  echo
  for k in "plain 2" "sp 2"; do echo "${traffic[$k]}" | sed 's/^/    /'; done
  for k in "plain 1" "plain 2" "sp 2"; do echo "${acts[$k]}" | sed 's/^/    /'; done
} > "$out"
append_earlier "$out"
echo "wrote $out"
