#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Compile time of a downstream TU — examples/hello_pipeline/main.cpp: <mpx/mpx.hpp>, a model, a Trainer —
# against a TU with only <torch/torch.h>, with no precompiled header, with one of <torch/torch.h>, and
# with the one mpx offers (mpx_precompile_headers: <torch/torch.h> + <mpx/mpx.hpp>). Flags as CMake's
# Release build of mpx::mpx; best of N runs (default 3), one compile at a time; a -ftime-report of the
# downstream TU's biggest phases. Writes benchmarks/results/compile_downstream_<host>_<date>.md.
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
printf '#include <torch/torch.h>\n' > "$work/torch_pch.hpp"
printf '#include <torch/torch.h>\n#include <mpx/mpx.hpp>\n' > "$work/mpx_pch.hpp"
"$CXX" "${flags[@]}" -x c++-header "$work/torch_pch.hpp" -o "$work/torch_pch.hpp.gch"
"$CXX" "${flags[@]}" -x c++-header "$work/mpx_pch.hpp" -o "$work/mpx_pch.hpp.gch"
timed() {  # wall time of one compile of: <source> [flags...]
  local src=$1 s e; shift
  s=$(date +%s.%N); "$CXX" "${flags[@]}" -Winvalid-pch "$@" -c "$src" -o "$work/out.o"; e=$(date +%s.%N)
  printf '%.2f' "$(echo "$e - $s" | bc -l)"
}
# the best of $runs rounds, the contenders alternating within each round, so the machine's noise hits all alike
declare -A t
for key in torch_only downstream torch_only_pch downstream_torch_pch downstream_mpx_pch; do t[$key]=999; done
for ((r = 0; r < runs; r++)); do
  for key in torch_only downstream torch_only_pch downstream_torch_pch downstream_mpx_pch; do
    case $key in
      torch_only) v=$(timed "$work/torch_only.cpp") ;;
      downstream) v=$(timed "$downstream") ;;
      torch_only_pch) v=$(timed "$work/torch_only.cpp" -include "$work/torch_pch.hpp") ;;
      downstream_torch_pch) v=$(timed "$downstream" -include "$work/torch_pch.hpp") ;;
      downstream_mpx_pch) v=$(timed "$downstream" -include "$work/mpx_pch.hpp") ;;
    esac
    if (( $(echo "$v < ${t[$key]}" | bc -l) )); then t[$key]=$v; fi
    echo "round $r $key $v s"
  done
done
"$CXX" "${flags[@]}" -ftime-report -c "$downstream" -o "$work/out.o" 2> "$work/report.txt" || true
ratio() { printf '%.2f' "$(echo "$1 / $2" | bc -l)"; }
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
  echo "| downstream | none | ${t[downstream]} | $(ratio "${t[downstream]}" "${t[torch_only]}") |"
  echo "| torch only | <torch/torch.h> | ${t[torch_only_pch]} | 1.00 |"
  echo "| downstream | <torch/torch.h> | ${t[downstream_torch_pch]} | $(ratio "${t[downstream_torch_pch]}" "${t[torch_only_pch]}") |"
  echo "| downstream | mpx's: <torch/torch.h> + <mpx/mpx.hpp> | ${t[downstream_mpx_pch]} | $(ratio "${t[downstream_mpx_pch]}" "${t[torch_only_pch]}") |"
  echo
  echo "Downstream, no precompiled header, \`-ftime-report\` (its phases, and the biggest items):"
  echo
  echo '```'
  grep -E "^ (phase |TOTAL|template instantiation|callgraph ipa passes|preprocessing)" "$work/report.txt" || true
  echo '```'
} > "$out"
append_earlier "$out"
cat "$out"
