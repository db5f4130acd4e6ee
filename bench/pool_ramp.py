#!/usr/bin/env python3
"""What a pool of threads that start and end together costs: bench/workloads/pool_phases.py
(1,000 threads started, parked, woken and joined; BENCH_WORK million turns of work between,
default 0) run bare and under each profiler build given, in turn, for ROUNDS rounds after one
warm-up round. Prints, per tool, the median [min-max] of the start and join phases (as the
program timed them, and the work between), the whole run's wall time, and the profiler's own CPU time: its
rusage (it reaps the program) less the program's own CPU time, which the program reports.

    python3 bench/pool_ramp.py 10                                  # target/release/scalene-rs
    python3 bench/pool_ramp.py 10 old=/tmp/old/scalene-rs new=target/release/scalene-rs

BENCH_THREADS and BENCH_WORK pass through; SCALENE_RS_BENCH_PYTHON picks the interpreter
(default: the peers' venv of ../shared/bench/setup-peers.sh, else python3)."""
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "bench", "workloads", "pool_phases.py")


def python():
    given = os.environ.get("SCALENE_RS_BENCH_PYTHON")
    if given:
        return given
    venv = os.path.expanduser("~/.cache/scalene-rs-bench/venv/bin/python")
    return venv if os.path.exists(venv) else shutil.which("python3")


def main():
    if len(sys.argv) < 2 or not sys.argv[1].isdigit():
        sys.exit(__doc__)
    rounds = int(sys.argv[1])
    specs = sys.argv[2:] or ["scalene-rs=" + os.path.join(REPO, "target", "release", "scalene-rs")]
    tools = {"bare": []}
    for spec in specs:
        name, _, path = spec.partition("=")
        if not os.path.exists(path):
            sys.exit("pool_ramp.py: no such binary: %s" % path)
        tools[name] = [path, "run", "--cpu-only", "-o", "/dev/null", "--"]
    env = dict(os.environ)
    env.setdefault("BENCH_THREADS", "1000")
    env.setdefault("BENCH_WORK", "0")
    keys = ["start", "work", "join", "wall", "profiler CPU"]
    res = {name: {k: [] for k in keys} for name in tools}
    py = python()
    print("interpreter %s, %s threads, %s million turns of work, %d rounds"
          % (py, env["BENCH_THREADS"], env["BENCH_WORK"], rounds), flush=True)
    for r in range(rounds + 1):
        for name, pre in tools.items():
            with tempfile.TemporaryFile("w+") as err:
                t = time.perf_counter()
                p = subprocess.Popen(pre + [py, SCRIPT], env=env, stdout=subprocess.DEVNULL, stderr=err)
                _, status, ru = os.wait4(p.pid, 0)
                wall = (time.perf_counter() - t) * 1e3
                err.seek(0)
                text = err.read()
            phases = re.search(r"PHASES start ([\d.]+) work ([\d.]+) join ([\d.]+)", text)
            own = re.search(r"CPU ([\d.]+)", text)
            if status != 0 or not phases or not own:
                sys.exit("pool_ramp.py: %s failed (status %d): %s" % (name, status, text[-400:]))
            if r == 0:
                continue
            d = res[name]
            d["start"].append(float(phases.group(1)))
            d["work"].append(float(phases.group(2)))
            d["join"].append(float(phases.group(3)))
            d["wall"].append(wall)
            total = (ru.ru_utime + ru.ru_stime) * 1e3
            d["profiler CPU"].append(total - float(own.group(1)) if pre else 0.0)
    for name, d in res.items():
        print("%-12s" % name + "  ".join(
            "%s %.0f ms [%.0f-%.0f]" % (k, statistics.median(v), min(v), max(v)) for k, v in d.items()))


main()
