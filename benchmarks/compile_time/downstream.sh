#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Compile time of a downstream TU — examples/hello_pipeline/main.cpp: <mpx/mpx.hpp>, a model, a Trainer —
# against a TU with only <torch/torch.h>, with no precompiled header, with one of <torch/torch.h>, and
# with the one mpx offers (mpx_precompile_headers: <torch/torch.h> + <mpx/mpx.hpp>); header-only (mpx::mpx)
# and on mpx::compiled (MPX_SEPARATE_COMPILATION: the runtime's non-template code comes from the library,
# compiled once and not counted here). For scale, plain_loop.cpp: the same model and loop in plain LibTorch.
# Flags as CMake's Release build of mpx::mpx; best of N runs (default 3), one compile at a time; a
# -ftime-report of the downstream TU's biggest phases. Writes benchmarks/results/compile_downstream_<host>_<date>.md.
#   benchmarks/compile_time/downstream.sh [runs]
set -euo pipefail
cd "$(dirname "$0")/../.."
runs=${1:-3}
CXX=${CXX:-g++}
flags=(-std=gnu++20 -O3 -DNDEBUG -D_GLIBCXX_USE_CXX11_ABI=1 -DBOOST_ALL_NO_LIB -DUSE_C10D_GLOO -DUSE_DISTRIBUTED -DUSE_RPC -DUSE_TENSORPIPE
       -Iinclude -isystem /usr/include/torch/csrc/api/include)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
printf '#include <torch/torch.h>\nint main() { return 0; }\n' > "$work/torch_only.cpp"
downstream=examples/hello_pipeline/main.cpp
plain=benchmarks/compile_time/plain_loop.cpp
sep=-DMPX_SEPARATE_COMPILATION
printf '#include <torch/torch.h>\n' > "$work/torch_pch.hpp"
printf '#include <torch/torch.h>\n#include <mpx/mpx.hpp>\n' > "$work/mpx_pch.hpp"
"$CXX" "${flags[@]}" -x c++-header "$work/torch_pch.hpp" -o "$work/torch_pch.hpp.gch"
"$CXX" "${flags[@]}" -x c++-header "$work/mpx_pch.hpp" -o "$work/mpx_pch.hpp.gch"
mkdir -p "$work/sep"
cp "$work/mpx_pch.hpp" "$work/sep/mpx_pch.hpp"
"$CXX" "${flags[@]}" $sep -x c++-header "$work/sep/mpx_pch.hpp" -o "$work/sep/mpx_pch.hpp.gch"
timed() {  # wall time of one compile of: <source> [flags...]
  local src=$1 s e; shift
  s=$(date +%s.%N); "$CXX" "${flags[@]}" -Winvalid-pch "$@" -c "$src" -o "$work/out.o"; e=$(date +%s.%N)
  printf '%.2f' "$(echo "$e - $s" | bc -l)"
}
# the best of $runs rounds, the contenders alternating within each round, so the machine's noise hits all alike
declare -A t this
rounds=()
ratio() { printf '%.2f' "$(echo "$1 / $2" | bc -l)"; }
keys="torch_only plain downstream compiled torch_only_pch plain_pch downstream_torch_pch compiled_torch_pch downstream_mpx_pch compiled_mpx_pch"
for key in $keys; do t[$key]=999; done
for ((r = 0; r < runs; r++)); do
  for key in $keys; do
    case $key in
      torch_only) v=$(timed "$work/torch_only.cpp") ;;
      downstream) v=$(timed "$downstream") ;;
      torch_only_pch) v=$(timed "$work/torch_only.cpp" -include "$work/torch_pch.hpp") ;;
      downstream_torch_pch) v=$(timed "$downstream" -include "$work/torch_pch.hpp") ;;
      downstream_mpx_pch) v=$(timed "$downstream" -include "$work/mpx_pch.hpp") ;;
      plain) v=$(timed "$plain") ;;
      compiled) v=$(timed "$downstream" $sep) ;;
      plain_pch) v=$(timed "$plain" -include "$work/torch_pch.hpp") ;;
      compiled_torch_pch) v=$(timed "$downstream" $sep -include "$work/torch_pch.hpp") ;;
      compiled_mpx_pch) v=$(timed "$downstream" $sep -include "$work/sep/mpx_pch.hpp") ;;
    esac
    if (( $(echo "$v < ${t[$key]}" | bc -l) )); then t[$key]=$v; fi
    this[$key]=$v
    echo "round $r $key $v s"
  done
  # the round's own ratios against the plain-LibTorch loop: the contenders ran back to back, so the
  # machine's drift between rounds cancels in them
  rounds+=("| $r | ${this[torch_only]} | ${this[plain]} | ${this[compiled]} | ${this[downstream]} | $(ratio "${this[compiled]}" "${this[plain]}") | $(ratio "${this[downstream]}" "${this[plain]}") | ${this[plain_pch]} | ${this[compiled_torch_pch]} | $(ratio "${this[compiled_torch_pch]}" "${this[plain_pch]}") |")
done
"$CXX" "${flags[@]}" -ftime-report -c "$downstream" -o "$work/out.o" 2> "$work/report.txt" || true
"$CXX" "${flags[@]}" $sep -ftime-report -c "$downstream" -o "$work/out.o" 2> "$work/report_compiled.txt" || true
out=benchmarks/results/compile_downstream_$(hostname -s)_$(date +%Y%m%d).md
source benchmarks/results_file.sh && keep_earlier "$out"
{
  echo "# Compile time of a downstream TU"
  echo
  echo "- date: $(date -u +%Y-%m-%dT%H:%MZ); machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); $(free -g | awk '/Mem:/{print $2}') GiB"
  echo "- compiler: $("$CXX" --version | head -n 1); LibTorch $(dpkg-query -W -f='${Version}' libtorch-dev 2>/dev/null); flags: ${flags[*]}"
  echo "- downstream TU: \`$downstream\` (<mpx/mpx.hpp>, a two-stage model, a Trainer, a training loop); baseline: a TU with only <torch/torch.h>"
  echo "- best of $runs compiles each, the contenders alternating; a precompiled header's own build is not counted"
  echo
  echo "| TU | precompiled header | compile (s) | over torch-only, same header |"
  echo "|---|---|---|---|"
  echo "| torch only | none | ${t[torch_only]} | 1.00 |"
  echo "| plain LibTorch loop, same model (no mpx) | none | ${t[plain]} | $(ratio "${t[plain]}" "${t[torch_only]}") |"
  echo "| downstream, header-only (mpx::mpx) | none | ${t[downstream]} | $(ratio "${t[downstream]}" "${t[torch_only]}") |"
  echo "| downstream, mpx::compiled | none | ${t[compiled]} | $(ratio "${t[compiled]}" "${t[torch_only]}") |"
  echo "| torch only | <torch/torch.h> | ${t[torch_only_pch]} | 1.00 |"
  echo "| plain LibTorch loop, same model (no mpx) | <torch/torch.h> | ${t[plain_pch]} | $(ratio "${t[plain_pch]}" "${t[torch_only_pch]}") |"
  echo "| downstream, header-only | <torch/torch.h> | ${t[downstream_torch_pch]} | $(ratio "${t[downstream_torch_pch]}" "${t[torch_only_pch]}") |"
  echo "| downstream, mpx::compiled | <torch/torch.h> | ${t[compiled_torch_pch]} | $(ratio "${t[compiled_torch_pch]}" "${t[torch_only_pch]}") |"
  echo "| downstream, header-only | mpx's: <torch/torch.h> + <mpx/mpx.hpp> | ${t[downstream_mpx_pch]} | $(ratio "${t[downstream_mpx_pch]}" "${t[torch_only_pch]}") |"
  echo "| downstream, mpx::compiled | mpx's: <torch/torch.h> + <mpx/mpx.hpp> | ${t[compiled_mpx_pch]} | $(ratio "${t[compiled_mpx_pch]}" "${t[torch_only_pch]}") |"
  echo
  echo "Every round (s), the contenders back to back, and the round's ratios to the plain-LibTorch loop (no precompiled"
  echo "header, and both with <torch/torch.h> precompiled):"
  echo
  echo "| round | torch only | plain loop | mpx::compiled | header-only | compiled / plain | header-only / plain | plain, torch PCH | compiled, torch PCH | ratio, torch PCH |"
  echo "|---|---|---|---|---|---|---|---|---|---|"
  printf '%s\n' "${rounds[@]}"
  echo
  for mode in "header-only|report" "on mpx::compiled|report_compiled"; do
    echo "Downstream ${mode%%|*}, no precompiled header, \`-ftime-report\` (its phases):"
    echo
    echo '```'
    grep -E "^ (phase |TOTAL|template instantiation|callgraph ipa passes|preprocessing)" "$work/${mode##*|}.txt" || true
    echo '```'
    echo
  done
} > "$out"
append_earlier "$out"
cat "$out"
