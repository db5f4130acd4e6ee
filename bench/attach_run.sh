#!/bin/sh
# Runs a command as it would run without us, and attaches `scalene-rs attach` (with memory,
# or with the options given in SCALENE_RS_ATTACH_ARGS) to it once it has started: the
# overhead of an attached profiler on a process started without it, for
# ../shared/bench/overhead.py:
#   overhead.py --workload julia --tool 'attach=bench/attach_run.sh {python} {script}'
# The attach begins about 0.2 s after the start (the library is loaded then); the
# command's exit status is passed on.
BIN=${SCALENE_RS_BIN:-$(dirname "$0")/../target/release/scalene-rs}
"$@" &
pid=$!
sleep 0.2
# shellcheck disable=SC2086
"$BIN" attach "$pid" ${SCALENE_RS_ATTACH_ARGS:-} -o /dev/null 2>/dev/null &
prof=$!
wait "$pid"
rc=$?
wait "$prof"
exit "$rc"
