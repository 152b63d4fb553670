#!/usr/bin/env bash
# Memory and precision benchmark: runs every mode of memory_bench in its own process (peak RSS is per
# process) and writes benchmarks/results/memory_<host>_<date>.md.   benchmarks/memory/run.sh [build-dir]
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
bench=$build/benchmarks/memory/memory_bench
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
declare -A r
for mode in plain-1 plain-2 plain-8 ckpt-1 ckpt-2 ckpt-8 blocks-1 blocks-2 blocks-8 optim-adamw optim-adamw8bit speed-fp32 speed-bf16; do
  r[$mode]=$("$bench" "$mode" | grep '^result' | cut -d' ' -f3-)
  echo "$mode ${r[$mode]}"
done
f() { echo "${r[$1]}" | cut -d' ' -f"$2"; }
out=benchmarks/results/memory_$(hostname -s)_$(date +%Y%m%d).md
source benchmarks/results_file.sh && keep_earlier "$out"  # the day's earlier results stay, below the new ones
{
  echo "# Activation memory, recomputation, optimizer state, bf16 on CPU"
  echo
  echo "- date: $(date -u +%Y-%m-%dT%H:%MZ); machine: $(nproc --all) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); LibTorch $(dpkg-query -W -f='${Version}' libtorch-dev 2>/dev/null); one thread"
  echo "- one stage: 4 blocks x (Linear 1024->4096, GELU, Linear 4096->1024, residual); a micro-batch is 1024 rows"
  echo "- memory: peak resident set over the process's baseline (parameters, gradients and inputs already allocated), each mode in its own process"
  echo
  echo "## Activation memory: k micro-batches in flight (GPipe holds m, 1F1B holds at most p on rank 0)"
  echo
  echo "| in flight | plain (MiB) | whole stage (MiB) | saved | per block (MiB) | saved | fwd+bwd plain (s) | whole stage (s) | per block (s) |"
  echo "|---|---|---|---|---|---|---|---|---|"
  for k in 1 2 8; do
    pm=$(f plain-$k 1); cm=$(f ckpt-$k 1); bm=$(f blocks-$k 1); pt=$(f plain-$k 2); ct=$(f ckpt-$k 2); bt=$(f blocks-$k 2)
    printf '| %d | %s | %s | %.0f%% | %s | %.0f%% | %s | %s (+%.0f%%) | %s (+%.0f%%) |\n' "$k" "$pm" "$cm" "$(echo "100 * (1 - $cm / $pm)" | bc -l)" \
      "$bm" "$(echo "100 * (1 - $bm / $pm)" | bc -l)" "$pt" "$ct" "$(echo "100 * ($ct / $pt - 1)" | bc -l)" "$bt" "$(echo "100 * ($bt / $pt - 1)" | bc -l)"
  done
  echo
  echo "1F1B against GPipe (p = 2, m = 8): rank 0 holds 2 micro-batches instead of 8: $(f plain-2 1) MiB against $(f plain-8 1) MiB."
  echo
  echo "## Optimizer state"
  echo
  echo "| optimizer | bytes per parameter |"
  echo "|---|---|"
  echo "| AdamW (fp32 moments) | $(f optim-adamw 3) |"
  echo "| mpx 8-bit AdamW (block-wise, 256) | $(f optim-adamw8bit 3) |"
  echo
  echo "## bf16 autocast on this CPU (AVX2, no native bf16): forward + backward of one micro-batch, best of 3"
  echo
  echo "| fp32 (s) | bf16 autocast (s) | ratio |"
  echo "|---|---|---|"
  printf '| %s | %s | %.2fx slower |\n' "$(f speed-fp32 2)" "$(f speed-bf16 2)" "$(echo "$(f speed-bf16 2) / $(f speed-fp32 2)" | bc -l)"
} > "$out"
append_earlier "$out"
cat "$out"
