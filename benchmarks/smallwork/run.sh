#!/usr/bin/env bash
# Small-work benchmark: step time of a model whose step is a few to a few tens of milliseconds (2 x 4 layers
# of Linear 512x512 + GELU, AdamW, micro-batches of 8 rows) at m = 2, 4, 8, 16 micro-batches, for one process
# (the whole batch at once, and accumulating m micro-batches), mpx on two CPU ranks (GPipe, 1F1B, ZB-H1), the
# hand-written c10d 1F1B program and a plain Python torch.distributed loop (GPipe and 1F1B); 1f1b-overlap is mpx
# 1F1B with TrainOptions::skip_nonfinite = false (no end-of-step wait); mpx's ranks pass messages through shared
# memory, 1f1b-gloo is its 1F1B over Gloo (MPX_SHM=0), as the hand-written program and Python do. One intra-op
# thread per rank. zbh1 measures whether its split backward pays (the default, TrainOptions::split_backward =
# measure: 6 trial steps, warm-up for it) and zbh1-split splits at every step. Every round runs every contender at every m, the order rotated from round to round, so
# that the shared machine's noise hits all alike; the report gives paired ratios (within a round, then the
# median over rounds), mpx's time split per rank, and the per-action costs read from the last step's trace of 5 1F1B runs.
# Writes benchmarks/results/smallwork_<host>_<date>.md.
# MODEL=vlm measures the issue's model instead: a 2-stage moondream-architecture model (vision | text, vlm_bench.cpp;
# micro-batches of 2 samples) against one process, whole and accumulating (no hand-written or Python contender: they
# have no moondream), and writes benchmarks/results/smallwork_vlm_<host>_<date>.md.
#   benchmarks/smallwork/run.sh [build-dir] [rounds] [steps]     (MS="2 4" to run fewer m; MODES="whole 1f1b zbh1" fewer
#   contenders, for more rounds of the ones a question is about; RESULTS_DIR=... elsewhere)
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}; rounds=${2:-5}; steps=${3:-20}
ms=${MS:-"2 4 8 16"}
model=${MODEL:-linear}
case $model in
  linear) bench=$build/benchmarks/smallwork/smallwork_bench name=smallwork
          modes=(whole accumulate gpipe 1f1b 1f1b-gloo 1f1b-overlap 1f1b-torch-adamw zbh1 zbh1-split handwritten py-gpipe py-1f1b)
          export SW_PER=8 SW_UNIT=rows
          describe="2 x 4 layers of Linear 512x512 + GELU, AdamW (lr 1e-4), loss mean(y^2); micro-batches of 8 rows, m per step; one intra-op thread per rank; clipping off" ;;
  vlm) bench=$build/benchmarks/smallwork/smallwork_vlm_bench name=smallwork_vlm
       modes=(whole accumulate gpipe 1f1b 1f1b-overlap zbh1 zbh1-split)
       export SW_PER=2 SW_UNIT=samples
       describe="moondream architecture, vision (2 ViT layers, width 64, 5 crops of 56 px) | text (2 layers, width 128, vocabulary 512, 41 positions, 12 supervised tokens per sample); AdamW (mpx::FusedAdamW in every contender, lr 1e-4), answer-token cross-entropy; micro-batches of 2 samples, m per step; one intra-op thread per rank; clipping off" ;;
  *) echo "MODEL must be linear or vlm" >&2; exit 2 ;;
esac
if [ -n "${MODES:-}" ]; then read -ra modes <<< "$MODES"; fi
mpxrun=$build/tools/mpxrun
py=benchmarks/smallwork/python_pipeline.py
python=${PYTHON:-/usr/bin/python3}  # Debian's, with python3-torch (a pyenv python3 first on PATH has no torch)
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
# Every contender keeps freed memory instead of returning it to the OS. On hosts where a page fault is dear (the
# VM of 2026-12-04) glibc's default unmapped and re-faulted the Python loop's 1 MB AdamW temporaries at every
# step: rank 1's opt.step() 21.5 ms, 2.0 ms with this setting; the loop 29.9 -> 9.4 ms at m = 2. mpx moved by
# no more than the noise (paired 1.04, 6 rounds). A careful user on such a host would tune it: the baseline does.
export GLIBC_TUNABLES=${GLIBC_TUNABLES:-glibc.malloc.mmap_threshold=268435456:glibc.malloc.trim_threshold=1073741824}
work=$(mktemp -d)
: > "$work/split.txt"
trap 'rm -rf "$work"' EXIT
run() {  # <mode> <m> [flags]: the contender's output, without rank prefixes
  local mode=$1 m=$2; shift 2
  case $mode in
    handwritten) "$mpxrun" --no-prefix --nproc-per-node 2 "$bench" handwritten "$m" "$steps" ;;
    py-*) "$mpxrun" --no-prefix --nproc-per-node 2 "$python" "$py" "${mode#py-}" "$m" "$steps" ;;
    1f1b-gloo) MPX_SHM=0 "$bench" 1f1b "$m" "$steps" "$@" ;;  # mpx 1F1B with its messages over Gloo, as the baselines' are
    *) "$bench" "$mode" "$m" "$steps" "$@" ;;
  esac | sed 's/^\[rank [0-9]*\] //'
}
for ((r = 0; r < rounds; r++)); do
  for m in $ms; do
    for ((k = 0; k < ${#modes[@]}; k++)); do
      mode=${modes[$(((k + r) % ${#modes[@]}))]}
      out=$(run "$mode" "$m")
      t=$(echo "$out" | awk '/^result/ {print $3}')
      [ -n "$t" ] || { echo "$mode at m = $m printed no result:"; echo "$out"; exit 1; }
      echo "$r $m $mode $t" >> "$work/raw.txt"
      echo "$out" | awk -v r="$r" -v m="$m" -v mode="$mode" '/^detail/ {print r, m, mode, $2, $3, $4, $5, $6, $7, $8}' >> "$work/detail.txt"
      echo "$out" | awk -v r="$r" -v m="$m" '/^split/ {print r, m, $2, $3, $4, $5}' >> "$work/split.txt"
      echo "round $r m $m $mode $t s"
    done
  done
done
for m in $ms; do for k in 1 2 3 4 5; do run 1f1b "$m" --trace="$work/trace_${m}_$k.json" > /dev/null; done; done  # per-action costs: 5 runs' last steps
out=${RESULTS_DIR:-benchmarks/results}/${name}_$(hostname -s)_$(date +%Y%m%d).md
source benchmarks/results_file.sh && keep_earlier "$out"
{
  if [ "$model" = vlm ]; then echo "# Small work, the issue's moondream-architecture model: mpx against one process"
  else echo "# Small work: mpx against one process, hand-written c10d and a Python loop"; fi
  echo
  echo "- date: $(date -u +%Y-%m-%dT%H:%MZ); machine: $(nproc --all) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(free -g | awk '/Mem:/{print $2}') GiB"
  if [ "$model" = vlm ]; then echo "- LibTorch $(dpkg-query -W -f='${Version}' libtorch-dev 2>/dev/null), $(g++ --version | head -n 1); mpx: shared memory between its ranks"
  else echo "- LibTorch $(dpkg-query -W -f='${Version}' libtorch-dev 2>/dev/null), $(g++ --version | head -n 1), Python torch $("$python" -c 'import torch; print(torch.__version__)' 2>/dev/null); mpx: shared memory between its ranks (1f1b-gloo: Gloo over loopback), hand-written and Python: Gloo over loopback"; fi
  echo "- model: $describe"
  echo "- malloc, every contender: GLIBC_TUNABLES=$GLIBC_TUNABLES"
  echo "- each run: median step time over $steps steps after 2 warm-up steps (zbh1: 18, its 16 trial steps among them) (pipelines: the slower rank's); $rounds rounds, the contenders' order rotated each round"
  echo
  python3 benchmarks/smallwork/report.py "$work" $ms
} > "$out"
append_earlier "$out"
cat "$out"
