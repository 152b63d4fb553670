#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Sourced by scripts/gpu_check.sh and scripts/gpu_bench.sh: how to build against the LibTorch of this
# machine's Python torch (a CUDA LibTorch 2.x on a GPU machine) with plain g++. Needs B (the build folder)
# and LOGS set; defines TORCH, ABI, INC, CXXFLAGS, LIBS and the functions compile and link.
# TORCH_DIR (a folder with include/ and lib/) overrides the Python torch; a dry run on a CPU machine uses it.
if [ -n "${TORCH_DIR:-}" ]; then
  TORCH=$TORCH_DIR ABI=1 SITE=/nonexistent
  echo "torch at $TORCH_DIR" > "$LOGS/versions.txt"
else
  TORCH=$(python3 -c 'import torch, os; print(os.path.dirname(torch.__file__))') || { echo "no Python torch here"; exit 2; }
  SITE=$(dirname "$TORCH")
  ABI=$(python3 -c 'import torch; print(int(torch._C._GLIBCXX_USE_CXX11_ABI))')
  python3 -c 'import torch; ok = torch.cuda.is_available(); print("torch", torch.__version__, "cuda", torch.version.cuda, "available", ok,
    torch.cuda.get_device_name(0) if ok else "", "nccl", (lambda v: ".".join(map(str, v)) if isinstance(v, tuple) else str(v))(torch.cuda.nccl.version()) if ok else "none")' | tee "$LOGS/versions.txt"
  command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | sed 's/^/GPU, driver, memory: /' |
    tee -a "$LOGS/versions.txt"
fi
g++ --version | head -1 | tee -a "$LOGS/versions.txt"

INC=(-isystem "$TORCH/include" -isystem "$TORCH/include/torch/csrc/api/include")
[ -d "$TORCH/include/gloo" ] || INC+=(-isystem .deps/gloo)      # the wheel may lack Gloo's headers
for d in /usr/local/cuda/include "$SITE"/nvidia/*/include "$SITE"/nvidia/*/*/include; do
  [ -d "$d" ] && INC+=(-isystem "$d")
done
INC+=(-isystem .deps/include)
CXXFLAGS=(-std=c++20 -O1 -g0 -I include -I tests -I tests/runtime "${INC[@]}" -DUSE_DISTRIBUTED -DUSE_C10D_GLOO -DMPX_CATCH2_V2
          -D_GLIBCXX_USE_CXX11_ABI="$ABI" -Wno-deprecated-declarations)
CUDA_LIBS=()
if [ -e "$TORCH/lib/libtorch_cuda.so" ]; then  # a CUDA LibTorch: NCCL compiled in, CUDA hooks linked
  CXXFLAGS+=(-DUSE_C10D_NCCL)
  CUDA_LIBS=(-ltorch_cuda -lc10_cuda)
fi
# libstdc++ first: the wheels' libraries export some libstdc++ symbols of their own (std::filesystem among
# them); ours must bind to the system's, which our headers match.
LIBS=(-Wl,--no-as-needed -lstdc++ -L"$TORCH/lib" -Wl,-rpath,"$TORCH/lib" "${CUDA_LIBS[@]}" -ltorch -ltorch_cpu -lc10 -Wl,--as-needed -lpthread)
gloo_from=system; [ -d .deps/gloo ] && gloo_from=.deps; [ -d "$TORCH/include/gloo" ] && gloo_from=torch
echo "torch at $TORCH; gloo headers from $gloo_from" | tee -a "$LOGS/versions.txt"

compile() {  # compile <object> <source> [flags...]
  local obj=$1 src=$2; shift 2
  timeout 400 g++ "${CXXFLAGS[@]}" "$@" -c "$src" -o "$obj.tmp" > "$LOGS/$(basename "$obj").log" 2>&1 && mv "$obj.tmp" "$obj" ||
    { echo "FAILED to compile $src"; return 1; }
}
link() {  # link <exe> <objects...>
  local exe=$1; shift
  g++ "$@" "${LIBS[@]}" -o "$exe" > "$LOGS/$(basename "$exe").link.log" 2>&1 || { echo "FAILED to link $exe"; return 1; }
}

