#!/usr/bin/env bash
# Compile-time benchmark: how long a TU takes whose pipeline's schedule proof is a static_assert, against
# a baseline TU with the same includes and no pipeline. Best of 3, one job at a time.
# Writes benchmarks/results/compile_time_<host>_<date>.md. Usage: benchmarks/compile_time/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
CXX=${CXX:-g++}
tu=benchmarks/compile_time/pipeline_tu.cpp
flags=(-std=c++20 -O0 -Iinclude -fsyntax-only -DMPX_COMPILE_TIME_PROOF_STEPS=100000000
       -fconstexpr-ops-limit=4294967295 -fconstexpr-loop-limit=100000000)
best() {  # best wall time of 3 runs, in seconds
  local b=999
  for _ in 1 2 3; do
    local s e t
    s=$(date +%s.%N); "$CXX" "${flags[@]}" "$@" "$tu" || { echo "compile failed: $*" >&2; exit 1; }; e=$(date +%s.%N)
    t=$(echo "$e - $s" | bc -l); if (( $(echo "$t < $b" | bc -l) )); then b=$t; fi
  done
  printf '%.2f' "$b"
}
out=benchmarks/results/compile_time_$(hostname -s)_$(date +%Y%m%d).md
source benchmarks/results_file.sh && keep_earlier "$out"  # the day's earlier results stay, below the new ones
declare -A cpu_time
base=$(best)
{
  echo "# Compile time of the schedule proof"
  echo
  echo "- date: $(date -u +%Y-%m-%dT%H:%MZ); machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); $(free -g | awk '/Mem:/{print $2}') GiB"
  echo "- compiler: $("$CXX" --version | head -n 1); flags: ${flags[*]}"
  echo "- TU: \`$tu\` — a pipeline of p stages (one per slot), m micro-batches; \`static_assert(mpx::proof_v<Pipe>.ok())\`"
  echo "- each time is the best of 3 runs, one compile at a time, on a shared machine"
  echo
  echo "baseline (same includes, no pipeline): **${base} s**"
  echo
  echo "| schedule | table | p | m | steps | compile (s) | over baseline (s) | ms per step |"
  echo "|---|---|---|---|---|---|---|---|"
} > "$out"
# "m = 1" rows: the pipeline type of p stages with a trivial schedule, what the proof's rows add to
for cfg in "OneFOneB 2 8" "OneFOneB 8 64" "OneFOneB 16 128" "ZBH1 8 64" "OneFOneB 32 256" "GPipe 32 256" "ZBH1 32 256" \
           "OneFOneB 64 1" "OneFOneB 64 512" "GPipe 64 512" "Interleaved1F1B 64 512" "ZBH1 64 512" "OneFOneB 64 4096"; do
  read -r sched p m <<< "$cfg"
  per=2; form=runs; [ "$sched" = ZBH1 ] && per=3
  steps=$((p * m * per))
  t=$(best -DMPX_BENCH_P="$p" -DMPX_BENCH_M="$m" -DMPX_BENCH_SCHED="$sched")
  cost=$(echo "$t - $base" | bc -l)
  printf '| %s | %s | %d | %d | %d | %.2f | %.2f | %.3f |\n' "$sched" "$form" "$p" "$m" "$steps" "$t" "$cost" "$(echo "1000 * $cost / $steps" | bc -l)" >> "$out"
  echo "$sched p=$p m=$m: $t s"
  [ "$p" = 64 ] && [ "$m" = 512 ] && cpu_time[$sched]=$t
done
# the same pipelines on GPUs: both proofs, Gloo's order and NCCL's (a group per channel, sends that never wait)
{
  echo
  echo "### On GPUs: the proof under NCCL's order as well (\`Pipeline::nccl_order_proof\`, -DMPX_BENCH_GPU)"
  echo
  echo "| schedule | p | m | steps | compile, both proofs (s) | on CPUs, Gloo's only (s) | NCCL-order proof (s) |"
  echo "|---|---|---|---|---|---|---|"
} >> "$out"
for sched in GPipe OneFOneB Interleaved1F1B ZBH1; do
  per=2; [ "$sched" = ZBH1 ] && per=3
  t=$(best -DMPX_BENCH_P=64 -DMPX_BENCH_M=512 -DMPX_BENCH_SCHED="$sched" -DMPX_BENCH_GPU)
  printf '| %s | 64 | 512 | %d | %.2f | %.2f | %.2f |\n' "$sched" $((64 * 512 * per)) "$t" "${cpu_time[$sched]}" "$(echo "$t - ${cpu_time[$sched]}" | bc -l)" >> "$out"
  echo "$sched on GPUs p=64 m=512: $t s"
done
echo "wrote $out"
append_earlier "$out"
