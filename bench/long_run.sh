#!/usr/bin/env bash
# The profiler's own memory over a long run: `scalene-rs run --rate RATE` on bench/long_run.py
# for SECONDS, printing the profiler's RSS every 30 s and its peak (VmHWM) at the end. Bounded
# memory shows as a flat line after the first minute (samples are aggregated, never stored).
#   bench/long_run.sh [SECONDS=600] [RATE=1000] [PYTHON=python3]
set -euo pipefail
secs=${1:-600}; rate=${2:-1000}; py=${3:-python3}
here=$(cd "$(dirname "$0")" && pwd)
bin=${SCALENE_RS:-$here/../target/release/scalene-rs}
out=$(mktemp -d)
"$bin" run --rate "$rate" -o "$out/profile.json" -- "$py" "$here/long_run.py" "$secs" 2>"$out/stderr" &
prof=$!
start=$(date +%s)
while kill -0 "$prof" 2>/dev/null; do
  sleep 30
  rss=$(awk '/VmRSS/{print $2}' /proc/$prof/status 2>/dev/null || true)
  hwm=$(awk '/VmHWM/{print $2}' /proc/$prof/status 2>/dev/null || true)
  [ -n "$rss" ] && echo "t=$(( $(date +%s) - start ))s profiler RSS ${rss} kB, peak ${hwm} kB"
  [ -n "$hwm" ] && echo "$hwm" > "$out/hwm"
done
wait "$prof" || true
echo "final peak RSS of the profiler: $(cat "$out/hwm" 2>/dev/null) kB (last reading before exit)"
cat "$out/stderr"; "$bin" view "$out/profile.json" 2>&1 | grep -E -A1 "Recorded|Lost"
