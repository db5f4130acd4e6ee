#!/usr/bin/env python3
"""How close a profile's line shares come to the truth, run after run.

Runs `scalene-rs run --cpu-only --rate RATE` on fixtures/cpu/alternate.py (two lines that
take turns every 0.15-0.3 ms, with no clock read between them, and print what each took)
ROUNDS times with each binary given, alternating, and prints for each binary the error of
line a's share of the two (ours minus the truth, in points): each run's, the mean and the
root mean square. What it shows: how many samples' worth a profile's figures are (a
binary whose samples carry no weight of their own is as noisy as a slower rate).

Usage: bench/line_accuracy.py [--rounds N] [--rate HZ] [--seconds S] [--python PY]
       NAME=BINARY [NAME=BINARY ...]
"""
import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURE = os.path.join(HERE, "..", "fixtures", "cpu", "alternate.py")


def mark(label):
    with open(FIXTURE) as f:
        for i, line in enumerate(f, 1):
            if line.rstrip().endswith("# MARK: " + label):
                return i
    sys.exit("no MARK: %s in %s" % (label, FIXTURE))


def one_run(binary, args, out):
    cmd = [binary, "run", "--cpu-only", "--rate", str(args.rate), "-o", out, "--",
           args.python, FIXTURE, str(args.seconds)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("%s failed (%d): %s" % (" ".join(cmd), r.returncode, r.stderr.strip()))
    m = re.search(r"truth a=([\d.]+) b=([\d.]+)", r.stdout)
    if not m:
        sys.exit("the fixture printed no truth line: %r" % r.stdout)
    truth = 100 * float(m[1]) / (float(m[1]) + float(m[2]))
    with open(out) as f:
        p = json.load(f)
    share = {}
    for f in p["files"]:
        if f["filename"].endswith("alternate.py"):
            for l in f["lines"]:
                share[l["line"]] = sum(l.get(k, 0.0) for k in
                                       ("cpu_python_pct", "cpu_native_pct", "cpu_system_pct"))
    a, b = share.get(mark("a"), 0.0), share.get(mark("b"), 0.0)
    ours = 100 * a / (a + b) if a + b > 0 else 0.0
    return ours - truth, p["samples"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--rate", type=float, default=10000)
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("tools", nargs="+", metavar="NAME=BINARY")
    args = ap.parse_args()
    tools = [t.split("=", 1) for t in args.tools]
    errors = {name: [] for name, _ in tools}
    samples = {name: [] for name, _ in tools}
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "p.json")
        for r in range(args.rounds):
            for name, binary in tools:
                e, n = one_run(binary, args, out)
                errors[name].append(e)
                samples[name].append(n)
                print("round %d %-10s error %+.1f points (%d samples)" % (r + 1, name, e, n),
                      flush=True)
    print("\nline a's share of the two, ours minus the truth (points), %d rounds at %g Hz, %g s"
          % (args.rounds, args.rate, args.seconds))
    for name, _ in tools:
        e = errors[name]
        rms = math.sqrt(sum(x * x for x in e) / len(e))
        print("%-10s mean %+.2f  rms %.2f  max |error| %.1f  median samples %d" % (
            name, sum(e) / len(e), rms, max(abs(x) for x in e),
            sorted(samples[name])[len(e) // 2]))


main()
