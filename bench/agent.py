#!/usr/bin/env python3
"""The agent's own cost: `scalene-rs agent` at its default rate beside N Python processes.

  bench/agent.py                         50 processes, a minute measured
  bench/agent.py --processes 10 --seconds 10 --bin /path/to/scalene-rs

What it does:
1. A loopback receiver (http.server, answering 200 to every push) stands in for Pyroscope.
2. The agent starts first (`--match` a token of this run only: the other Python processes
   of the machine are left alone), at its default rate and window.
3. N processes of fixtures/agent/app.py `idle` start after it: each wakes 10 times a second
   to do a little work (sum(range(100))) and sleeps, as a fleet's mostly idle services do.
4. Once the agent has said it profiles all N, and 5 s more (each process located, its first
   windows cut), its CPU time (utime + stime of /proc/PID/stat, every thread) is read at the
   start and end of --seconds; the figure is that time as a percentage of one core.
   Memory: its peak resident set (VmHWM of /proc/PID/status) at the end.
5. SIGTERM: the agent's exit code and how long it took are printed too.

Goal (issue 38): at most 1% of one core and 64 MB with 50 processes.
"""
import argparse
import http.server
import os
import signal
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
APP = os.path.join(REPO, "fixtures", "agent", "app.py")


def default_bin():
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(REPO, "target"))
    return os.path.join(target, "release", "scalene-rs")


class Count:
    pushes = 0
    bytes = 0


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        n = int(self.headers.get("content-length", 0))
        self.rfile.read(n)
        Count.pushes += 1
        Count.bytes += n
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def cpu_seconds(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    # utime and stime are fields 14 and 15 (fields[11], fields[12] after the name).
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def status_kb(pid, key):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=default_bin())
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--processes", type=int, default=50)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--agent-arg", action="append", default=[], help="more agent options")
    a = ap.parse_args()

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = "http://127.0.0.1:%d" % server.server_address[1]
    token = "scalene-agent-bench-%d" % os.getpid()
    agent = subprocess.Popen(
        [a.bin, "agent", "--push", url, "--match", token] + a.agent_arg,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    said = []
    profiling = set()

    def read_log():
        for line in agent.stderr:
            said.append(line.rstrip())
            if "profiling process " in line:
                profiling.add(line.split("profiling process ")[1].split()[0])

    threading.Thread(target=read_log, daemon=True).start()
    time.sleep(1.0)
    started = time.time()
    procs = [
        subprocess.Popen(
            [a.python, APP, "idle", str(a.seconds + 120), token],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
        )
        for _ in range(a.processes)
    ]
    try:
        deadline = time.time() + 60
        while len(profiling) < a.processes and time.time() < deadline:
            time.sleep(0.2)
        if len(profiling) < a.processes:
            sys.exit("the agent profiles %d of %d processes after 60 s: %s"
                     % (len(profiling), a.processes, "\n".join(said[-20:])))
        found_at = time.time()
        time.sleep(5.0)
        c0, t0, p0 = cpu_seconds(agent.pid), time.time(), Count.pushes
        time.sleep(a.seconds)
        c1, t1, p1 = cpu_seconds(agent.pid), time.time(), Count.pushes
        hwm, rss = status_kb(agent.pid, "VmHWM"), status_kb(agent.pid, "VmRSS")
        threads = len(os.listdir("/proc/%d/task" % agent.pid))
        agent.send_signal(signal.SIGTERM)
        began = time.time()
        code = agent.wait(timeout=30)
        took = time.time() - began
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()
        if agent.poll() is None:
            agent.kill()
            agent.wait()
        server.shutdown()
    cpu_pct = 100.0 * (c1 - c0) / (t1 - t0)
    print("processes: %d (all found %.1f s after the first started)" % (a.processes, found_at - started))
    print("agent CPU: %.2f%% of one core over %.0f s (%.2f s of CPU)" % (cpu_pct, t1 - t0, c1 - c0))
    print("agent memory: peak RSS %.1f MB, RSS at the end %.1f MB, %d threads" % (hwm / 1024, rss / 1024, threads))
    print("pushes received while measured: %d (%d in all, %.1f kB)" % (p1 - p0, Count.pushes, Count.bytes / 1024))
    print("SIGTERM: exit %s after %.2f s" % (code, took))
    print("goal: <= 1%% of a core and <= 64 MB: %s" % ("met" if cpu_pct <= 1.0 and hwm <= 64 * 1024 else "NOT met"))


if __name__ == "__main__":
    main()
