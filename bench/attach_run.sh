#!/bin/bash
# Runs PYTHON SCRIPT [ARGS...] as it would run without us, and attaches `scalene-rs attach`
# (with memory, or with the options in SCALENE_RS_ATTACH_ARGS) once it has started: the
# overhead of an attached profiler on a process started without it, for
# ../shared/bench/overhead.py:
#   overhead.py --workload julia --tool 'attach=bench/attach_run.sh {python} {script}'
#   overhead.py --workload julia --tool 'attach-cpu=SCALENE_RS_ATTACH_ARGS=--cpu-only bench/attach_run.sh {python} {script}'
# The script starts after a 0.3 s sleep (a thread at a safe point: the library can only go
# into a process that waits somewhere; a single thread computing from its first instant
# never does) and the attach begins 0.1 s into it, so the whole workload is recorded. The
# sleep counts in the measured time: SCALENE_RS_ATTACH_NONE=1 runs the same start without
# attaching, the reference to compare each attach with. The command's exit status is passed
# on.
# SCALENE_RS_ATTACH_TOP=1: `top PID --exit-on-end` instead of `attach`, in a pseudo-terminal
# of 120x40 made by util-linux's `script` (top needs a terminal; its screen goes to
# /dev/null): the cost of the live view to the target, beside attach's.
# SCALENE_RS_ATTACH_PTY=1: `attach` in the same pseudo-terminal, the control for top's
# rows. `script` ends about 12 ms after its command (3.3 s julia, 4 runs): without the
# control that is read as top's cost.
BIN=${SCALENE_RS_BIN:-$(dirname "$0")/../target/release/scalene-rs}
python=$1
shift
"$python" -c 'import runpy, sys, time
time.sleep(0.3)
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")' "$@" &
pid=$!
if [ -n "${SCALENE_RS_ATTACH_NONE:-}" ]; then
  wait "$pid"
  exit $?
fi
sleep 0.1
if [ -n "${SCALENE_RS_ATTACH_TOP:-}${SCALENE_RS_ATTACH_PTY:-}" ]; then
  if [ -n "${SCALENE_RS_ATTACH_TOP:-}" ]; then
    cmd="$BIN top $pid --exit-on-end ${SCALENE_RS_ATTACH_ARGS:-}"
  else
    cmd="$BIN attach $pid ${SCALENE_RS_ATTACH_ARGS:-} -o /dev/null"
  fi
  # Its input a FIFO that we hold open, so it never ends: at the end of an input of its
  # own (</dev/null), `script` passes an end-of-file to the terminal, which top read as a
  # key (the view showed PAUSED, and a paused view draws less than a watched one).
  fifo=$(mktemp -u)
  mkfifo "$fifo"
  exec 3<>"$fifo"
  rm -f "$fifo"
  script -qec "stty cols 120 rows 40; exec $cmd" /dev/null <&3 >/dev/null 2>&1 &
else
  # shellcheck disable=SC2086
  "$BIN" attach "$pid" ${SCALENE_RS_ATTACH_ARGS:-} -o /dev/null 2>/dev/null &
fi
prof=$!
wait "$pid"
rc=$?
wait "$prof"
exit "$rc"
