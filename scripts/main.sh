#!/usr/bin/env bash
# The main job: builds mpx and the moondream example, trains the tiny moondream from scratch on the
# generated shapes questions with 2 pipeline ranks on CPU (vision | text), prints held-out accuracy before
# and after, then answers the questions that fit six held-out pictures with moondream_query.
# Usage: scripts/main.sh [moondream_train flags...]   (e.g. --layout 4, --schedule zbh1, --steps 100)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${MPX_BUILD_DIR:-build}
t0=$SECONDS
bash scripts/install-deps.sh "$build/npm"
t_install=$((SECONDS - t0))
export CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER=g++ \
  -DCMAKE_CXX_COMPILER_LAUNCHER=ccache
cmake --build "$build" -j "$(nproc)" --target moondream_train moondream_query
t_build=$((SECONDS - t0 - t_install))
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1  # one intra-op thread per rank, one rank per core
run="$build/moondream-demo"
"$build/examples/moondream/moondream_train" --save "$run" "$@"
t_train=$((SECONDS - t0 - t_install - t_build))
for n in 1 2 3 4 5 6; do  # held-out pictures: #1 and #2 counting pictures, #3 to #6 one shape on a side
  "$build/examples/moondream/moondream_query" --weights "$run/model" --generated $n  # the questions that fit the picture
done
echo "main job: install ${t_install} s, build ${t_build} s, train ${t_train} s, queries $((SECONDS - t0 - t_install - t_build - t_train)) s;" \
  "loss curve $run/loss.svg, metrics $run/metrics.jsonl, model $run/model"
