#!/usr/bin/env bash
# Builds mpx and runs the main job: the example pipeline on two CPU ranks.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${MPX_BUILD_DIR:-build}
bash scripts/install-deps.sh "$build/npm"
export CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER=g++ \
  -DCMAKE_CXX_COMPILER_LAUNCHER=ccache
cmake --build "$build" -j "$(nproc)" --target hello_pipeline
if [ $# -eq 0 ]; then set -- 60 "$build/hello_pipeline_trace.json"; fi  # steps, trace file
"$build/examples/hello_pipeline/hello_pipeline" "$@"
