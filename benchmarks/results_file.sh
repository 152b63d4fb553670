# Sourced by benchmarks/*/run.sh: a results file of the same day is never overwritten. Call
# `keep_earlier FILE` before writing FILE, `append_earlier FILE` after: the new results come first, the
# earlier ones follow under "Earlier results of the same day".
keep_earlier() { earlier=$(mktemp); if [ -f "$1" ]; then cp "$1" "$earlier"; fi; }
append_earlier() {
  if [ -s "$earlier" ]; then { echo; echo "---"; echo; echo "# Earlier results of the same day"; echo; cat "$earlier"; } >> "$1"; fi
  rm -f "$earlier"
}
