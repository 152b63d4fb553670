# Sourced by benchmarks/*/run.sh: a results file of the same day is never overwritten. Call
# `keep_earlier FILE` before writing FILE, `append_earlier FILE` after: the new results come first, the
# earlier ones follow under "Earlier results of the same day".
keep_earlier() { earlier=$(mktemp); if [ -f "$1" ]; then cp "$1" "$earlier"; fi; }
append_earlier() {
  if [ -s "$earlier" ]; then { echo; echo "---"; echo; echo "# Earlier results of the same day"; echo; cat "$earlier"; } >> "$1"; fi
  rm -f "$earlier"
}
# The machine and library lines every benchmark's output starts with (one intra-op thread per rank).
describe_machine() {
  echo "machine: $(nproc --all) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); $(free -g | awk '/Mem/{print $2}') GiB"
  echo "LibTorch $(dpkg-query -W -f='${Version}' libtorch-dev 2>/dev/null), g++ $(g++ -dumpversion), OpenBLAS, 1 intra-op thread per rank"
}
# results_begin FILE TITLE: starts FILE (an earlier one of the day kept for results_end) with its title, the
# date and machine, and the mpx commit (marked when include/ or examples/ have uncommitted changes); the
# benchmark then appends its lines.
results_begin() {
  keep_earlier "$1"
  {
    echo "# $2"
    echo
    echo "- date: $(date -u +%Y-%m-%dT%H:%MZ); $(describe_machine | paste -sd ';' - | sed 's/;/; /g')"
    echo "- mpx: $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- include examples || echo ' with uncommitted changes')"
  } > "$1"
}
# results_end FILE RAW: appends the raw output RAW under "## Raw", then the earlier results of the day.
results_end() {
  { echo; echo "## Raw"; echo; echo '```'; cat "$2"; echo '```'; } >> "$1"
  append_earlier "$1"
  echo "wrote $1"
}
# memory_rows FILE: a table row for each line "<label> ... memory rank R: weights ..." of moondream_train
# --memory-report in FILE: each label word a column, then the rank, the figures with their formulas, the peak.
memory_rows() {
  python3 - "$1" <<'PY'
import re, sys
pat = re.compile(r"^(.*) memory rank (\d+): weights ([\d.]+) MiB \(formula ([\d.]+), ([-+\d.]+%)\), gradients ([\d.]+) MiB "
                 r"\(formula ([\d.]+), ([-+\d.]+%)\), optimizer state ([\d.]+) MiB \(formula ([\d.]+), ([-+\d.]+%)\), peak resident ([\d.]+) MiB")
for line in open(sys.argv[1]):
    m = pat.match(line)
    if m:
        g = m.groups()
        print(f"| {' | '.join(g[0].split())} | {g[1]} | {g[2]} | {g[3]} ({g[4]}) | {g[5]} | {g[6]} ({g[7]}) | {g[8]} | {g[9]} ({g[10]}) | {g[11]} |")
PY
}
