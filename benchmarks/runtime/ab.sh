#!/usr/bin/env bash
# A/B of two builds of a pipeline benchmark: the same mode (default 1f1b) of `pipeline_bench` (or
# `smallwork_bench`) from build A and build B, in alternating rounds (A B, B A, A B, ...: each pair ran
# seconds apart, and the order alternates so that neither side always goes first). Reports each round's
# B / A step-time ratio and their median. Writes benchmarks/results/runtime_ab_<host>_<date>.md.
#   benchmarks/runtime/ab.sh <bench-A> <bench-B> [rounds] [steps] [mode] [label-A] [label-B]
# <bench-X>: a pipeline_bench or smallwork_bench binary (e.g. build/benchmarks/runtime/pipeline_bench, or a
# copy kept of an older build); for smallwork_bench the mode names m too: "1f1b 4". AB_ENV_A / AB_ENV_B: environment
# settings for one side only (e.g. AB_ENV_A=MPX_SHM=0 with the same binary twice: Gloo against shared memory);
# AB_NAME: the results file's name (default runtime_ab).
set -euo pipefail
cd "$(dirname "$0")/../.."
a=$1; b=$2; rounds=${3:-12}; steps=${4:-20}; mode=${5:-1f1b}; la=${6:-A}; lb=${7:-B}
export OMP_NUM_THREADS=1
# shellcheck disable=SC2086  # a mode may carry its own arguments ("1f1b 4": smallwork_bench's m)
run() { env $2 "$1" $mode "$steps" | sed 's/^\[rank 0\] //' | grep '^result' | awk '{print $3}'; }
ta=(); tb=(); ratios=()
for ((r = 0; r < rounds; r++)); do
  if (( r % 2 == 0 )); then x=$(run "$a" "${AB_ENV_A:-}"); y=$(run "$b" "${AB_ENV_B:-}"); else y=$(run "$b" "${AB_ENV_B:-}"); x=$(run "$a" "${AB_ENV_A:-}"); fi
  ta+=("$x"); tb+=("$y"); ratios+=("$(echo "$y / $x" | bc -l)")
  printf 'round %d %s %s %s %s ratio %.4f\n' "$r" "$la" "$x" "$lb" "$y" "${ratios[-1]}"
done
med() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
out=benchmarks/results/${AB_NAME:-runtime_ab}_$(hostname -s)_$(date +%Y%m%d).md
source benchmarks/results_file.sh && keep_earlier "$out"
{
  echo "# Runtime A/B: $lb (B) against $la (A), $(basename "$a") $mode"
  echo
  echo "- date: $(date -u +%Y-%m-%dT%H:%MZ); machine: $(nproc --all) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(free -g | awk '/Mem:/{print $2}') GiB"
  echo "- LibTorch $(dpkg-query -W -f='${Version}' libtorch-dev 2>/dev/null), $(g++ --version | head -n 1)"
  echo "- model: the benchmark's (pipeline_bench: 8 x (Linear 1024x1024 + GELU), AdamW, 8 micro-batches of 64 rows; smallwork_bench: 8 x (Linear 512x512 + GELU), AdamW, micro-batches of 8 rows), 2 CPU ranks, one intra-op thread each"
  echo "- each run: median step time over $steps steps (after 2 warm-up steps); $rounds rounds, the order alternating"
  echo "- A = $la ($a${AB_ENV_A:+, env $AB_ENV_A}), B = $lb ($b${AB_ENV_B:+, env $AB_ENV_B})"
  echo
  printf '**paired ratio B / A, median of %d rounds: %.4f** (min %.4f, max %.4f)\n' "$rounds" "$(med "${ratios[@]}")" \
    "$(printf '%s\n' "${ratios[@]}" | sort -g | head -n 1)" "$(printf '%s\n' "${ratios[@]}" | sort -g | tail -n 1)"
  echo
  echo "| round | A (s) | B (s) | B / A |"
  echo "|---|---|---|---|"
  for ((r = 0; r < rounds; r++)); do printf '| %d | %s | %s | %.4f |\n' "$r" "${ta[$r]}" "${tb[$r]}" "${ratios[$r]}"; done
} > "$out"
append_earlier "$out"
cat "$out"
