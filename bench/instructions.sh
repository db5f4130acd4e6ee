#!/bin/bash
# Instructions our own code runs per busy default sample (user space: ours and libc's),
# counted by valgrind's callgrind: a stable figure on a noisy machine, where the time of
# one sample swings by half between runs. The difference of two runs of the snapshot
# bench (SCALENE_RS_BENCH_ITERS 300 and 1,300) over 1,000, so that start-up cancels out.
#   bench/instructions.sh                 # builds the bench, newest pyenv interpreter
#   bench/instructions.sh path/to/snapshot-binary   # an older build, for an A/B
# SCALENE_RS_BENCH_PYTHON picks the interpreter; SCALENE_RS_BENCH_ONLY the case
# ("busy default sample" unless set). Needs valgrind.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || { echo "bench/instructions.sh: valgrind is not installed (apt-get install valgrind)" >&2; exit 1; }
bin=${1:-}
if [ -z "$bin" ]; then
  bin=$(cargo bench --bench snapshot --no-run --message-format=json 2>/dev/null \
    | python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "snapshot" and m.get("executable"):
        print(m["executable"])')
fi
case_label=${SCALENE_RS_BENCH_ONLY:-busy default sample}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
count() {
  SCALENE_RS_BENCH_ITERS=$1 SCALENE_RS_BENCH_SUSTAINED=0 SCALENE_RS_BENCH_ONLY="$case_label" \
    valgrind --tool=callgrind --callgrind-out-file="$tmp/cg.$1" "$bin" >/dev/null 2>"$tmp/err.$1"
  awk '/Collected/ {print $4}' "$tmp/err.$1"
}
low=$(count 300)
high=$(count 1300)
echo "$case_label: $(( (high - low) / 1000 )) instructions per sample ($(basename "$bin"))"
