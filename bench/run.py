#!/usr/bin/env python3
"""Runs the benchmarks of docs/benchmarks.md and rewrites the page (and the README's headline
table) from what it measured: one command for every figure.

  bench/run.py                      every suite, 7 rounds, rewrites the page and the README
  bench/run.py --suites native,threads --rounds 9
  bench/run.py --quick --no-write   one round each, short runs: checks the script itself
  bench/run.py --render             the page and the README again from docs/benchmarks.json

Suites (see SUITES): overhead against the peers on the four workloads (cpu, native, memory),
many parked threads (threads), 10 kHz with the rate achieved (rate), CPython 3.15's own
sampler (tachyon), async-aware stacks against Tachyon's (async), attach to a running process
(attach), and the cost of one sample
(sample: `cargo bench --bench snapshot`). The overhead suites run
../shared/bench/overhead.py (bare run and each tool in turn, round after round: the ratio
of whole-process wall times, median of the rounds, with min and max). The peers come from
../shared/bench/setup-peers.sh's venv; a suite whose tools are missing is reported as not
run, with the reason, never silently left out.

Each suite's figures are kept in docs/benchmarks.json with the run that measured them (date,
commit, machine, load, interpreter, rounds, command); the page is written from that file, so
a run of some suites replaces theirs and leaves the others' sections as they were, each with
its own date and machine.
"""
import argparse
import datetime
import json
import os
import platform
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
SHARED = os.path.join(os.path.dirname(REPO), "shared", "bench")
OVERHEAD = os.path.join(SHARED, "overhead.py")
VENV = os.environ.get("BENCH_VENV", os.path.expanduser("~/.cache/scalene-rs-bench/venv"))
BIN = os.path.join(REPO, "target", "release", "scalene-rs")
PAGE = os.path.join(REPO, "docs", "benchmarks.md")
STORE = os.path.join(REPO, "docs", "benchmarks.json")
README = os.path.join(REPO, "README.md")
HEADLINE = ("<!-- bench/run.py: headline -->", "<!-- bench/run.py: headline end -->")
PY315 = os.path.expanduser("~/.cache/scalene-rs/bin/debian-python3.15")

OURS = BIN + " run {opts} -o /dev/null -- {{python}} {{script}}"


def ours(opts):
    return OURS.format(opts=opts)


# Each suite: (title, what it shows, workloads, tools as (name, template or built-in peer),
# environment for the workload, interpreter: None for the peers' venv).
SUITES = {
    "cpu": dict(
        title="CPU profiling against py-spy and Scalene",
        what="`run --cpu-only` at 100 Hz (the default rate), py-spy 0.4.3 `record` (100 Hz), "
        "Scalene's `--cpu-only`.",
        workloads=["julia", "mdp"],
        tools=[("scalene-rs", ours("--cpu-only")), ("py-spy", "@py-spy"), ("scalene", "@scalene-cpu")],
    ),
    "native": dict(
        title="Native frames (`--native`) against `py-spy record --native`",
        what="Every sample pauses the threads that ran, copies their registers and stacks, "
        "unwinds and names the native frames. 100 Hz both. Goal: ≤1.05×.",
        workloads=["julia", "mdp"],
        tools=[
            ("scalene-rs --native", ours("--native --cpu-only --rate 100")),
            ("py-spy --native", "{venv}/bin/py-spy record --native -r 100 -o {out}/psn.svg -- {python} {script}"),
        ],
    ),
    "memory": dict(
        title="Memory accounting against memray and Scalene",
        what="`run` with memory (the default) at 100 Hz; memray `run`; Scalene with memory.",
        workloads=["allocs", "copies"],
        tools=[("scalene-rs", ours("")), ("memray", "@memray"), ("scalene", "@scalene-full")],
    ),
    "threads": dict(
        title="Many parked threads beside one busy thread",
        what="bench/workloads/parked.py: a main thread doing fixed pure-Python work beside "
        "N threads waiting on an Event. `run --cpu-only` at 100 Hz against py-spy (which "
        "stops every thread at every sample). Goal: ≤1.03×.",
        workloads=[
            ("parked-150", {"BENCH_THREADS": "150"}),
            # The same work: starting and joining 1,000 threads takes a few tenths of a
            # second, noisy; with less work that noise was most of the ratio.
            ("parked-1000", {"BENCH_THREADS": "1000", "BENCH_WORK": "30"}),
        ],
        tools=[("scalene-rs", ours("--cpu-only")), ("py-spy", "@py-spy")],
    ),
    "rate": dict(
        title="10 kHz",
        what="`run --cpu-only --rate 10000`; the share of the requested rate achieved is "
        "read from the profile of one more run. Goal: ≤1.02× and ≥99% of the rate.",
        workloads=["julia", "mdp"],
        tools=[("scalene-rs 10 kHz", ours("--cpu-only --rate 10000"))],
        rate=10000,
    ),
    "tachyon": dict(
        title="Against CPython 3.15's own sampler (Tachyon)",
        what="Debian's 3.15 (chrooted by tools/pythons.sh: SCALENE_RS_ROOT_BIND makes the "
        "workloads visible inside its root). Tachyon `-a --mode cpu` at its default rate "
        "and at 10 kHz; ours at 1 kHz and 10 kHz.",
        workloads=["julia"],
        tools=[
            ("scalene-rs 1 kHz", ours("--cpu-only --rate 1000")),
            ("scalene-rs 10 kHz", ours("--cpu-only --rate 10000")),
            ("tachyon", "@tachyon"),
            ("tachyon 10 kHz", "@tachyon-10khz"),
        ],
        python=PY315,
        env={"SCALENE_RS_ROOT_BIND": os.path.dirname(SHARED)},
    ),
    "async": dict(
        title="Async-aware stacks (`--async`) against Tachyon's `--async-aware` (CPython 3.15)",
        what="pyperformance's async_tree, variant `none` (bench/workloads/async_tree.py drives "
        "the benchmark's own module without pyperf: a tree of gathered tasks 6 deep and 6 wide, "
        "scheduling only, the hardest case). `run --cpu-only --async` at 100 Hz; Tachyon "
        "`--async-aware` at its default 1 kHz and at 100 Hz (wall mode: it refuses `--mode cpu` "
        "with `--async-aware`). Debian's 3.15, chrooted. Goal: ≤1.05×.",
        workloads=["async_tree"],
        tools=[
            ("scalene-rs --async", ours("--cpu-only --async --rate 100")),
            ("tachyon --async-aware", "{python} -m profiling.sampling run --async-aware --collapsed -o {out}/ta.txt {script}"),
            ("tachyon --async-aware 100 Hz", "{python} -m profiling.sampling run --async-aware -r 100hz --collapsed -o {out}/ta.txt {script}"),
        ],
        python=PY315,
        env={
            "SCALENE_RS_ROOT_BIND": os.path.dirname(SHARED) + ":" + os.path.expanduser("~/.cache/scalene-rs-bench"),
        },
    ),
    "attach": dict(
        title="`attach` to a process started without us",
        what="bench/attach_run.sh starts the program and attaches 0.1 s into it (with memory, "
        "and `--cpu-only`). The program first sleeps 0.3 s (a single thread computing from its "
        "first instant never waits where the library can go in): the ratios against the bare "
        "run count that sleep; `same start, no attach` is the run to compare each attach with.",
        workloads=["julia"],
        tools=[
            ("same start, no attach", "SCALENE_RS_ATTACH_NONE=1 " + os.path.join(HERE, "attach_run.sh") + " {python} {script}"),
            ("attach", os.path.join(HERE, "attach_run.sh") + " {python} {script}"),
            ("attach --cpu-only", "SCALENE_RS_ATTACH_ARGS=--cpu-only " + os.path.join(HERE, "attach_run.sh") + " {python} {script}"),
        ],
    ),
    "top": dict(
        title="`top PID`: what the live view costs the target, beside `attach`",
        what="bench/attach_run.sh as for `attach`; `SCALENE_RS_ATTACH_TOP=1` runs `top PID "
        "--exit-on-end` instead, in a 120x40 pseudo-terminal made by util-linux's `script` "
        "(the screen drawn every second, to /dev/null); the `attach` rows run in the same "
        "pseudo-terminal (`SCALENE_RS_ATTACH_PTY=1`), so `script`'s own end (about 12 ms) "
        "is in both. With memory (the default of both), at "
        "100 Hz and 1 kHz. The rows `top ÷ attach` divide the two at one rate: round by round (the "
        "median of each round's own ratio, with its min and max: the two ran back to back, so "
        "the machine's drift between rounds cancels), and the two medians. "
        "Goal: ≤1.01×.",
        workloads=["julia"],
        tools=[
            ("same start, no attach", "SCALENE_RS_ATTACH_NONE=1 " + os.path.join(HERE, "attach_run.sh") + " {python} {script}"),
            ("attach 100 Hz", "SCALENE_RS_ATTACH_PTY=1 SCALENE_RS_ATTACH_ARGS='--rate 100' " + os.path.join(HERE, "attach_run.sh") + " {python} {script}"),
            ("top 100 Hz", "SCALENE_RS_ATTACH_TOP=1 SCALENE_RS_ATTACH_ARGS='--rate 100' " + os.path.join(HERE, "attach_run.sh") + " {python} {script}"),
            ("attach 1 kHz", "SCALENE_RS_ATTACH_PTY=1 SCALENE_RS_ATTACH_ARGS='--rate 1000' " + os.path.join(HERE, "attach_run.sh") + " {python} {script}"),
            ("top 1 kHz", "SCALENE_RS_ATTACH_TOP=1 SCALENE_RS_ATTACH_ARGS='--rate 1000' " + os.path.join(HERE, "attach_run.sh") + " {python} {script}"),
        ],
        pairs=[("top ÷ attach, 100 Hz", "top 100 Hz", "attach 100 Hz"), ("top ÷ attach, 1 kHz", "top 1 kHz", "attach 1 kHz")],
    ),
}
ORDER = ["cpu", "native", "memory", "threads", "rate", "tachyon", "async", "attach", "top", "sample"]


def log(msg):
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def sh(cmd, **kw):
    return subprocess.run(cmd, shell=True, text=True, capture_output=True, **kw)


def machine():
    model = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    load = os.getloadavg()
    return dict(
        cores=os.cpu_count(),
        model=model,
        kernel=platform.release(),
        load=f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}",
    )


def workload_path(name):
    for d in (os.path.join(SHARED, "workloads"), os.path.join(HERE, "workloads")):
        p = os.path.join(d, name + ".py")
        if os.path.exists(p):
            return p
    return None


def overhead(suite, workload, env_extra, rounds, python, quick):
    """One overhead.py run: {tool: {ratio_min, ratio_median, ratio_max, median_s}}."""
    spec = SUITES[suite]
    name, env = (workload, {}) if isinstance(workload, str) else workload
    script_name = name if isinstance(workload, str) else "parked"
    script = workload_path(script_name)
    if script is None:
        raise RuntimeError(f"no workload {script_name}")
    peers, tools = [], []
    for tool, template in spec["tools"]:
        if template.startswith("@"):
            peers.append(template[1:])
            tools.append((tool, template[1:]))
        else:
            tools.append((tool, template))
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "r.json")
        cmd = [sys.executable, OVERHEAD, "--workload", script, "--runs", str(rounds), "--json", out]
        if python:
            cmd += ["--python", python]
        if peers:
            cmd += ["--peers", ",".join(peers)]
        for tool, template in tools:
            if template not in peers:
                cmd += ["--tool", f"{tool}={template}"]
        full_env = dict(os.environ, **env, **env_extra, **spec.get("env", {}))
        if quick:
            full_env.setdefault("MDP_LOOPS", "1")
            full_env["BENCH_WORK"] = "3"
        log(f"{suite}/{name}: {' '.join(shlex.quote(c) for c in cmd)}")
        r = subprocess.run(cmd, env=full_env, text=True, capture_output=True)
        if r.returncode != 0:
            raise RuntimeError((r.stderr or r.stdout).strip().splitlines()[-1] if (r.stderr or r.stdout).strip() else f"exit {r.returncode}")
        sys.stderr.write(r.stdout)
        with open(out) as f:
            results = json.load(f)["results"]
    by_round = round_times(r.stdout)
    named, rounds = {}, {}
    for tool, template in tools:
        key = template if template in peers else tool
        if key in results:
            named[tool] = results[key]
        if key in by_round:
            rounds[tool] = by_round[key]
    named["bare"] = results["baseline"]
    return dict(command=" ".join(shlex.quote(c) for c in cmd), env={**env, **spec.get("env", {})}, results=named,
                rounds=rounds)


def round_times(stdout):
    """Each tool's time in each round, from overhead.py's `round N: NAME 1.23s, ...` lines
    (its JSON keeps only the medians). Tool names may hold commas; a time ends each item."""
    times = {}
    for line in stdout.splitlines():
        m = re.match(r"\s*round \d+: (.*)$", line)
        if not m:
            continue
        for name, t in re.findall(r"(.+?) (\d+\.\d+)s(?:, |$)", m.group(1)):
            times.setdefault(name.strip(), []).append(float(t))
    return times


def paired(run, a, b):
    """`a ÷ b` round by round (the two ran back to back in each round, so the machine's
    drift between rounds cancels): (median, min, max), or None without round times."""
    ta, tb = run.get("rounds", {}).get(a), run.get("rounds", {}).get(b)
    if not ta or not tb or len(ta) != len(tb):
        return None
    ratios = sorted(x / y for x, y in zip(ta, tb))
    return statistics.median(ratios), ratios[0], ratios[-1]


def achieved_rate(python, script, rate, env_extra):
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "p.json")
        r = subprocess.run(
            [BIN, "run", "--cpu-only", "--rate", str(rate), "-o", out, "--", python, script],
            env=dict(os.environ, **env_extra), text=True, capture_output=True,
        )
        if r.returncode != 0:
            return None
        with open(out) as f:
            p = json.load(f)
    return 100.0 * p.get("rate_hz", 0) / max(p.get("requested_rate_hz", rate), 1)


def sample_cost(quick):
    env = dict(os.environ)
    if quick:
        env.update(SCALENE_RS_BENCH_ITERS="200", SCALENE_RS_BENCH_SUSTAINED="0")
    log("sample: cargo bench --bench snapshot")
    r = subprocess.run(["cargo", "bench", "--bench", "snapshot"], cwd=REPO, env=env, text=True, capture_output=True)
    if r.returncode != 0:
        raise RuntimeError("cargo bench --bench snapshot failed: " + r.stderr.strip()[-400:])
    text = [r.stdout.strip()]
    # What threads that do not run cost: the busy sample again beside parked threads.
    for parked in (150, 1000):
        log(f"sample: beside {parked} parked threads")
        env_p = dict(env, SCALENE_RS_BENCH_PARKED=str(parked), SCALENE_RS_BENCH_SUSTAINED="0",
                     SCALENE_RS_BENCH_ONLY="busy default sample")
        r = subprocess.run(["cargo", "bench", "--bench", "snapshot"], cwd=REPO, env=env_p, text=True,
                           capture_output=True)
        if r.returncode != 0:
            raise RuntimeError("cargo bench --bench snapshot failed: " + r.stderr.strip()[-400:])
        lines = [l for l in r.stdout.strip().splitlines() if not l.startswith("interpreter:")]
        text.append(f"\nbeside {parked} parked threads (SCALENE_RS_BENCH_PARKED={parked}):\n" + "\n".join(lines))
    # Instructions per busy sample: a figure the machine's noise does not move.
    if shutil.which("valgrind") and not quick:
        log("sample: bench/instructions.sh (callgrind)")
        r = subprocess.run([os.path.join(REPO, "bench", "instructions.sh")], cwd=REPO, env=env, text=True,
                           capture_output=True)
        if r.returncode == 0:
            text.append("\ninstructions of our own per sample (bench/instructions.sh, valgrind's callgrind):\n"
                        + r.stdout.strip())
        else:
            text.append("\nbench/instructions.sh failed: " + r.stderr.strip()[-300:])
    return "\n".join(text)


def interpreter_version(python):
    r = sh(f"{shlex.quote(python)} -c 'import sys; print(sys.version.split()[0])'")
    return r.stdout.strip() or "unknown"


def fmt_table(suite, runs):
    """A Markdown table: one row per workload and tool."""
    rows = ["| workload | tool | ratio (median) | min | max | median s |", "|---|---|---|---|---|---|"]
    for wl, run in runs.items():
        if "error" in run:
            rows.append(f"| {wl} | not run: {run['error']} | | | | |")
            continue
        for tool, r in run["results"].items():
            if tool == "bare":
                continue
            extra = ""
            if "rate_pct" in run and tool.startswith("scalene-rs"):
                extra = f" ({run['rate_pct']:.1f}% of the rate)" if run["rate_pct"] is not None else " (rate not read)"
            rows.append(
                f"| {wl} | {tool}{extra} | **{r['ratio_median']:.3f}×** | {r['ratio_min']:.3f} | {r['ratio_max']:.3f} | {r['median_s']:.2f} |"
            )
        rows.append(f"| {wl} | bare run | 1 | | | {run['results']['bare']['median_s']:.2f} |")
        for label, a, b in SUITES[suite].get("pairs", []):
            ra, rb = run["results"].get(a), run["results"].get(b)
            p = paired(run, a, b)
            if p:
                rows.append(f"| {wl} | {label}, round by round | **{p[0]:.3f}×** | {p[1]:.3f} | {p[2]:.3f} | |")
            if ra and rb:
                rows.append(f"| {wl} | {label}, of the medians | **{ra['median_s'] / rb['median_s']:.3f}×** | | | |")
    return "\n".join(rows)


def meta_lines(meta, overhead=True):
    machine = (f"{meta['machine']['cores']} cores ({meta['machine']['model']}), kernel "
               f"{meta['machine']['kernel']}, load average {meta['machine']['load']} at the start")
    if not overhead:
        return [f"Measured {meta['date']} (UTC) at commit {meta['commit']} by `{meta['command']}`; "
                f"{machine}. The bench names its interpreter and counts below.", ""]
    return [
        f"Measured {meta['date']} (UTC) at commit {meta['commit']} by `{meta['command']}`: "
        f"{meta['rounds']} rounds after one warm-up round; {machine}; {meta['python']} (the "
        "peers' venv) unless the section names another.",
        "",
    ]


def write_page(store):
    tables = {k: v["runs"] for k, v in store.items() if k in SUITES}
    lines = [
        "# Benchmarks",
        "",
        "Written by `bench/run.py` from docs/benchmarks.json (do not edit by hand: run it",
        "again). Each section gives the run that measured it; a benchmark that did not run",
        "says why.",
        "",
        "\"Ratio\" is the profiled run's whole-process wall time over the bare run's (`python",
        "script.py`), per round; the table gives the median of the rounds, their minimum and",
        "maximum. Each round runs the bare program and every tool in turn, so drift on a shared",
        "machine hits all alike; spreads of ±5–10% between rounds are usual on a shared 2-core",
        "machine, so read a difference of a few percent as noise.",
        "",
    ]
    for suite in ORDER:
        if suite == "sample":
            continue
        if suite in tables:
            spec = SUITES[suite]
            lines += [f"## {spec['title']}", "", spec["what"], ""]
            lines += meta_lines(store[suite]["meta"])
            first = next((r for r in tables[suite].values() if "command" in r), None)
            if first:
                env = " ".join(f"{k}={shlex.quote(v)}" for k, v in first["env"].items())
                shown = re.sub(r" --json \S+", "", first["command"])
                shown = shown.replace(REPO + "/", "").replace(os.path.dirname(REPO) + "/", "../")
                lines += ["One workload's command (the others differ by `--workload`):", "", "```sh",
                          (env + " " if env else "") + shown, "```", ""]
            lines += [fmt_table(suite, tables[suite]), ""]
    if "sample" in store:
        lines += ["## Cost of one sample (`cargo bench --bench snapshot`)", ""]
        lines += meta_lines(store["sample"]["meta"], overhead=False)
        lines += ["Its own output (wall and CPU time per case; see bench/snapshot.rs). `sustained",
                  "--blocking`: each paused sample is followed by at least as long with the target",
                  "running (src/sampler/drive.rs, `drive`), so past ~8 kHz the rate taken is what a",
                  "target stopped at most half the time allows, not what the sampler could do.", "",
                  "```text", store["sample"]["text"], "```", ""]
    not_run = [(s, v["not_run"]) for s, v in store.items() if "not_run" in v]
    missing = [s for s in ORDER if s not in store]
    if not_run or missing:
        lines += ["## Not run", ""]
        lines += [f"- {s}: {why}" for s, why in not_run]
        lines += [f"- {s}: never run by bench/run.py yet" for s in missing]
        lines.append("")
    lines += [
        "## Reproducing",
        "",
        "`../shared/bench/setup-peers.sh` once (the peers' venv), `cargo build --release`,",
        "then `bench/run.py` (`--suites LIST`, `--rounds N`, `--quick` for a check of the",
        "script itself, `--no-write` to leave the page alone). The overhead suites call",
        "`../shared/bench/overhead.py`, which runs beside this repository in the development",
        "workspace. Other benchmarks of bench/: `cargo bench --bench malloc_pair` (the preload",
        "library's fast path), `cargo bench --bench memory_overhead -- ...` (what memory",
        "accounting costs, one ingredient at a time), `bench/long_run.sh` (the profiler's own",
        "memory over a long run), `bench/line_accuracy.py NAME=BINARY ...` (how far a line's",
        "share falls from the truth, run after run, on fixtures/cpu/alternate.py).",
        "",
    ]
    with open(PAGE, "w") as f:
        f.write("\n".join(lines))
    log(f"wrote {PAGE}")


def headline(store):
    """The README's short table of headline ratios, from what ran."""
    pick = [
        ("cpu", "julia", "scalene-rs", "CPU, julia"),
        ("cpu", "julia", "py-spy", "CPU, julia"),
        ("native", "julia", "scalene-rs --native", "native frames, julia"),
        ("native", "julia", "py-spy --native", "native frames, julia"),
        ("memory", "allocs", "scalene-rs", "memory, allocs"),
        ("memory", "allocs", "memray", "memory, allocs"),
        ("threads", "parked-1000", "scalene-rs", "1,000 parked threads"),
        ("threads", "parked-1000", "py-spy", "1,000 parked threads"),
    ]
    rows = ["| benchmark | tool | ratio to the bare run | measured |", "|---|---|---|---|"]
    for suite, wl, tool, label in pick:
        r = store.get(suite, {}).get("runs", {}).get(wl, {}).get("results", {}).get(tool)
        if r:
            m = store[suite]["meta"]
            rows.append(
                f"| {label} | {tool} | {r['ratio_median']:.2f}× | {m['rounds']} rounds, "
                f"{m['date'][:10]}, {m['machine']['cores']} cores, load {m['machine']['load'].split()[0]} |"
            )
    if len(rows) == 2:
        return None
    rows.append("")
    rows.append("Medians of the rounds; min, max and the rest in [docs/benchmarks.md](docs/benchmarks.md).")
    return "\n".join(rows)


def write_readme(text):
    with open(README) as f:
        s = f.read()
    start, end = HEADLINE
    if start not in s or end not in s:
        log(f"README has no {start} … {end} markers: headline not written")
        return
    i, j = s.index(start) + len(start), s.index(end)
    s = s[:i] + "\n" + text + "\n" + s[j:]
    with open(README, "w") as f:
        f.write(s)
    log(f"wrote the headline table of {README}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--suites", default=",".join(ORDER), help="comma-separated: " + ",".join(ORDER))
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--quick", action="store_true", help="one round, short workloads: a check of the script")
    ap.add_argument("--no-write", action="store_true", help="print, do not rewrite the page and the README")
    ap.add_argument("--render", action="store_true", help="only write the page and the README from docs/benchmarks.json")
    args = ap.parse_args()
    if args.render:
        with open(STORE) as f:
            store = json.load(f)
        write_page(store)
        h = headline(store)
        if h:
            write_readme(h)
        return
    suites = [s for s in args.suites.split(",") if s]
    for s in suites:
        if s not in ORDER:
            sys.exit(f"bench/run.py: unknown suite {s!r}; known: {', '.join(ORDER)}")
    if not os.path.exists(OVERHEAD):
        sys.exit(f"bench/run.py: {OVERHEAD} is missing (../shared/bench beside the checkout)")
    if not os.path.exists(os.path.join(VENV, "bin", "python")):
        sys.exit(f"bench/run.py: the peers' venv {VENV} is missing: run ../shared/bench/setup-peers.sh")
    rounds = 1 if args.quick else args.rounds
    log("cargo build --release")
    r = subprocess.run(["cargo", "build", "--release"], cwd=REPO)
    if r.returncode != 0:
        sys.exit("bench/run.py: cargo build --release failed")
    python = os.path.join(VENV, "bin", "python")
    meta = dict(
        date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
        commit=sh(f"git -C {shlex.quote(REPO)} describe --always --dirty").stdout.strip(),
        machine=machine(),
        python=f"CPython {interpreter_version(python)}",
        command="bench/run.py " + " ".join(shlex.quote(a) for a in sys.argv[1:]),
        rounds=rounds,
    )
    tables, skipped, sample_text = {}, [], None
    for suite in suites:
        if suite == "sample":
            try:
                sample_text = sample_cost(args.quick)
            except RuntimeError as e:
                skipped.append((suite, str(e)))
            continue
        spec = SUITES[suite]
        py = spec.get("python")
        if py is not None and not os.path.exists(py):
            skipped.append((suite, f"{py} is missing (tools/pythons.sh makes it)"))
            continue
        runs = {}
        for wl in spec["workloads"]:
            name = wl if isinstance(wl, str) else wl[0]
            if args.quick and name == "parked-1000":
                continue
            try:
                run = overhead(suite, wl, {}, rounds, py, args.quick)
                if "rate" in spec:
                    env = dict(wl[1]) if not isinstance(wl, str) else {}
                    run["rate_pct"] = achieved_rate(py or python, workload_path(name), spec["rate"], env)
                runs[name] = run
            except RuntimeError as e:
                runs[name] = dict(error=str(e))
        tables[suite] = runs
        print(f"\n## {spec['title']}\n\n{fmt_table(suite, runs)}\n", flush=True)
    if sample_text is not None:
        print("\n## Cost of one sample\n\n" + sample_text + "\n", flush=True)
    for s, why in skipped:
        print(f"not run: {s}: {why}", flush=True)
    if args.no_write:
        return
    store = {}
    if os.path.exists(STORE):
        with open(STORE) as f:
            store = json.load(f)
    for suite, runs in tables.items():
        store[suite] = dict(meta=meta, runs=runs)
    if sample_text is not None:
        store["sample"] = dict(meta=meta, text=sample_text)
    for suite, why in skipped:
        store[suite] = dict(meta=meta, not_run=why)
    with open(STORE, "w") as f:
        json.dump(store, f, indent=1, sort_keys=True)
        f.write("\n")
    write_page(store)
    h = headline(store)
    if h:
        write_readme(h)


if __name__ == "__main__":
    main()
