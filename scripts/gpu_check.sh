#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The GPU check: builds mpx's tests against the CUDA LibTorch 2.x of this machine's Python torch (plain g++,
# no CMake: a GPU machine rarely has our apt packages) and runs
#   1. tests/runtime/on_device.test.cpp on CUDA device 0 (NCCL groups, CUDA compute, autocast fp16/bf16,
#      the loss scaler, checkpointing's CUDA generator, 8-bit AdamW on CUDA tensors, save/load);
#   2. the LibTorch glue's unit tests (the NCCL-rules stand-in's among them) and the multi-process runtime tests
#      on LibTorch 2.x: CPU ranks over Gloo, then again under NCCL's rules (MPX_NCCL_RULES=1), then the
#      2-rank pipeline under the machine's torchrun with its default rendezvous;
#   3. every public header on its own with USE_C10D_NCCL (syntax only).
# Third-party headers come from the machine or from .deps/ (scripts/gpu_deps.sh fills it here, from Debian).
#   usage: scripts/gpu_check.sh [log-dir]      (writes build and test logs there; default build-gpu/logs)
#          scripts/gpu_check.sh --dry-run [log-dir]   CPU: every test source this script builds, compiled with its flags
#                                                     and definitions against Debian's LibTorch (syntax only: what rots
#                                                     first); CI runs it (ctest -R mpx.gpu_check_dry_run)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
dry=0
[ "${1:-}" = --dry-run ] && { dry=1; shift; }
LOGS=${1:-build-gpu/logs}
B=build-gpu
[ $dry = 1 ] && B=${LOGS%/*}/gpu_check_dry
rm -rf "$B/obj" "$LOGS"; mkdir -p "$B/obj" "$LOGS"  # never link a stale object
JOBS=$(nproc)

[ $dry = 1 ] && export TORCH_DIR=${TORCH_DIR:-/usr/lib/python3/dist-packages/torch}
source scripts/gpu_env.sh  # TORCH, CXXFLAGS, LIBS, compile, link

t0=$(date +%s)
TORCH_TESTS=(tests/torch/blas.test.cpp tests/torch/tensor.test.cpp tests/torch/nccl_rules.test.cpp tests/runtime/activation_checkpoint.test.cpp tests/optim/adamw8bit.test.cpp
             tests/runtime/precision.test.cpp tests/io/safetensors.test.cpp)
# mpxrun and the two-node script are not built here: their cases ([launchers], [nodes]) are left out below
RUNTIME_DEFS=(-DMPX_RANK_EXE="\"$PWD/$B/runtime_rank\"" -DMPX_MPXRUN_EXE="\"/bin/false\"" -DMPX_TWO_NODES_SH="\"/bin/false\"")
if [ $dry = 1 ]; then
  for s in tests/support/main.cpp tests/runtime/on_device.test.cpp "${TORCH_TESTS[@]}" tests/runtime/rank_main.cpp tests/runtime/runtime.test.cpp; do
    ( timeout 400 g++ "${CXXFLAGS[@]}" "${RUNTIME_DEFS[@]}" -fsyntax-only "$s" > "$LOGS/$(basename "$s" .cpp).log" 2>&1 ||
        { echo "FAILED to compile $s"; tail -n 20 "$LOGS/$(basename "$s" .cpp).log"; exit 1; } ) &
    while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do sleep 1; done
  done
  failed=0
  for j in $(jobs -p); do wait "$j" || failed=1; done
  echo "== gpu_check --dry-run: $( [ $failed = 0 ] && echo 'every source compiles' || echo 'FAILED (logs in '"$LOGS"')') in $(( $(date +%s) - t0 )) s"
  exit $failed
fi
# ---- the device test first: it is what this machine is for
compile $B/obj/main.o tests/support/main.cpp &
compile $B/obj/on_device.o tests/runtime/on_device.test.cpp &
[ -n "${QUICK:-}" ] && { wait; link $B/device_tests $B/obj/on_device.o $B/obj/main.o && OMP_NUM_THREADS=4 timeout 300 $B/device_tests -d yes; exit; }
# ---- the rest in parallel
for s in "${TORCH_TESTS[@]}"; do compile $B/obj/$(basename "$s" .cpp).o "$s" & done
compile $B/obj/runtime_rank.o tests/runtime/rank_main.cpp &
compile $B/obj/runtime_test.o tests/runtime/runtime.test.cpp "${RUNTIME_DEFS[@]}" &
HEADERS=$(cd include && find mpx -name '*.hpp' | sort)
for h in $HEADERS; do
  ( printf '#include <%s>\n#include <%s>\n' "$h" "$h" > "$B/obj/hc_${h//\//_}.cpp"
    timeout 400 g++ "${CXXFLAGS[@]}" -fsyntax-only "$B/obj/hc_${h//\//_}.cpp" > "$LOGS/hc_${h//\//_}.log" 2>&1 || echo "HEADER FAILED $h" ) &
  while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do sleep 1; done
done

status=0
wait_for() { while [ ! -s "$1" ] && [ "$(jobs -rp | wc -l)" -gt 0 ]; do sleep 2; done; }
wait_for $B/obj/on_device.o; wait_for $B/obj/main.o
if [ -s $B/obj/on_device.o ] && [ -s $B/obj/main.o ] && link $B/device_tests $B/obj/on_device.o $B/obj/main.o; then
  echo "== device tests (built in $(( $(date +%s) - t0 )) s)"
  OMP_NUM_THREADS=4 timeout 300 $B/device_tests -d yes 2>&1 | tee "$LOGS/device_tests.txt" | grep -v "^$" | tail -25
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
else
  status=1
fi
wait
echo "== all built in $(( $(date +%s) - t0 )) s"
objs=(); for s in "${TORCH_TESTS[@]}"; do objs+=($B/obj/$(basename "$s" .cpp).o); done
if link $B/torch_tests "${objs[@]}" $B/obj/main.o; then
  echo "== LibTorch glue tests"
  OMP_NUM_THREADS=4 timeout 200 $B/torch_tests 2>&1 | tee "$LOGS/torch_tests.txt" | tail -15 || status=1
else status=1; fi
if link $B/runtime_rank $B/obj/runtime_rank.o && link $B/runtime_tests $B/obj/runtime_test.o $B/obj/main.o; then
  echo "== multi-process runtime tests (Gloo on CPU ranks)"
  # the GPU-tag error case expects a machine without CUDA: not this one
  OMP_NUM_THREADS=1 timeout 600 $B/runtime_tests '~[launchers]~[nodes]~"GPU stages without CUDA stop with a message naming the fix"' 2>&1 | tee "$LOGS/runtime_tests.txt" | tail -15 || status=1
  echo "== the same under NCCL's rules (MPX_NCCL_RULES=1: a group per channel, the stand-in)"
  MPX_NCCL_RULES=1 OMP_NUM_THREADS=1 timeout 600 $B/runtime_tests "[parity]~[nodes]~[launchers]~[shm],[errors]~[shm]" 2>&1 |
    tee "$LOGS/runtime_tests_nccl_rules.txt" | tail -15 || status=1
  echo "== an mpx program under this machine's torchrun, its default rendezvous (the agent's store)"
  torchrun --version 2>/dev/null | head -1
  OMP_NUM_THREADS=1 timeout 300 $B/runtime_tests "Under torchrun as users type it*" 2>&1 | tee "$LOGS/runtime_tests_torchrun.txt" | tail -5 || status=1
else status=1; fi
grep -l "error" "$LOGS"/*.log 2>/dev/null | head -20 | while read -r f; do echo "---- $f"; grep -m 6 -A 3 "error" "$f"; done
echo "== done in $(( $(date +%s) - t0 )) s, status $status"
exit $status
