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
