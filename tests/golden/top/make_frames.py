#!/usr/bin/env python3
"""Writes the recorded frames of tests/top_screens.rs: server/frame-1.json and frame-2.json.

Each frame is the since-start profile (as --json writes it) of one made-up program at one
moment: a server of two handler threads and a main thread, and one child process. The
program is described once, as stacks with the seconds each took in two windows:
- window A, from 0 to 5 s (frame 1 is the profile at 5 s);
- window B, from 5 to 6 s (frame 2 is the profile at 6 s, A + B).

Everything else is derived from the stacks as the aggregator derives it, so the figures
agree with one another:
- a stack's time goes to the line of its innermost frame of the user's code (library
  frames fold into the calling line; native frames are never charged);
- lines, functions, threads, processes and files add up their stacks;
- every percentage is a share of the frame's total seconds.

Memory is given per line, cumulative at each frame. Run it again after changing the
program, then bless the screens (BLESS=1 cargo nextest run --test top_screens).
"""
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
SERVER = "/srv/app/server.py"
RENDER = "/srv/app/render.py"
WORKER = "/srv/app/worker.py"
THREADING = "/usr/lib/python3.12/threading.py"

SOURCE = {
    (SERVER, 12): "import numpy as np",
    (SERVER, 41): "    body = json.loads(req.data)",
    (SERVER, 42): "    out = render(body)",
    (SERVER, 43): "    return compress(out)",
    (SERVER, 55): "    return zlib.compress(data, 9)",
    (SERVER, 70): "        req = requests.get()",
    (SERVER, 71): "        reply(handle(req))",
    (SERVER, 80): "        conn, _ = sock.accept()",
    (SERVER, 90): "    main()",
    (RENDER, 8): "    rows = [fmt(x) for x in body[\"items\"]]",
    (RENDER, 9): "    return \"\\n\".join(rows)",
    (RENDER, 15): "    return f\"{x['id']:>8} {x['name']:<40} {x['price']:>10.2f}\"",
    (WORKER, 20): "        buf = bytearray(1 << 20)",
    (WORKER, 21): "        total += checksum(buf)",
    (WORKER, 35): "    crunch(n)",
    (WORKER, 40): "main(int(sys.argv[1]))",
}


def f(function, filename, line):
    return {"function": function, "filename": filename, "line": line}


def native(function, module):
    return {"function": function, "filename": module, "line": None, "native": True}


HANDLER = [f("worker_loop", SERVER, 71), f("run", THREADING, 1010),
           f("_bootstrap_inner", THREADING, 1073)]

# (pid, tid, frames innermost first, window A (python, native, system) s, window B).
STACKS = [
    (4242, 4242, [f("<module>", SERVER, 12)], (0.60, 0.30, 0.10), (0.0, 0.0, 0.0)),
    (4242, 4242, [f("accept", "/usr/lib/python3.12/socket.py", 293), f("main", SERVER, 80),
                  f("<module>", SERVER, 90)], (0.05, 0.10, 0.15), (0.01, 0.02, 0.03)),
    (4242, 4243, [f("fmt", RENDER, 15), f("render", RENDER, 8), f("handle", SERVER, 42)]
     + HANDLER, (1.20, 0.0, 0.05), (0.40, 0.0, 0.01)),
    (4242, 4243, [f("render", RENDER, 9), f("handle", SERVER, 42)] + HANDLER,
     (0.30, 0.20, 0.02), (0.10, 0.08, 0.01)),
    (4242, 4243, [f("raw_decode", "/usr/lib/python3.12/json/decoder.py", 353),
                  f("loads", "/usr/lib/python3.12/json/__init__.py", 346),
                  f("handle", SERVER, 41)] + HANDLER, (0.50, 0.25, 0.0), (0.05, 0.03, 0.0)),
    (4242, 4243, [native("deflate_slow", "libz.so.1"), f("compress", SERVER, 55),
                  f("handle", SERVER, 43)] + HANDLER, (0.05, 0.90, 0.0), (0.02, 0.45, 0.0)),
    (4242, 4244, [f("fmt", RENDER, 15), f("render", RENDER, 8), f("handle", SERVER, 42)]
     + HANDLER, (1.00, 0.0, 0.04), (0.35, 0.0, 0.01)),
    (4242, 4244, [native("longest_match", "libz.so.1"), f("compress", SERVER, 55),
                  f("handle", SERVER, 43)] + HANDLER, (0.02, 0.40, 0.0), (0.01, 0.30, 0.0)),
    (4242, 4244, [f("get", "/usr/lib/python3.12/queue.py", 171), f("worker_loop", SERVER, 70),
                  f("run", THREADING, 1010)], (0.05, 0.0, 0.30), (0.01, 0.0, 0.12)),
    (4250, 4250, [f("crunch", WORKER, 20), f("main", WORKER, 35), f("<module>", WORKER, 40)],
     (0.10, 0.50, 0.40), (0.02, 0.20, 0.15)),
    (4250, 4250, [native("adler32_z", "libz.so.1"), f("crunch", WORKER, 21),
                  f("main", WORKER, 35), f("<module>", WORKER, 40)],
     (0.20, 0.60, 0.0), (0.10, 0.25, 0.0)),
]

THREAD_NAMES = {4242: "MainThread", 4243: "handler-1", 4244: "handler-2", 4250: "MainThread"}
PROCESSES = {
    4242: "python3 app/server.py --port 8080 --handlers 2",
    4250: "/usr/bin/python3 -c from multiprocessing.spawn import spawn_main; "
          "spawn_main(tracker_fd=5, pipe_handle=7) --multiprocessing-fork",
}

# Per line, at each frame: (alloc MB, Python's share %, peak MB, copy MB).
MEMORY = {
    (SERVER, 12): [(45.0, 100.0, 40.0, 0.0), (45.0, 100.0, 40.0, 0.0)],
    (SERVER, 41): [(30.0, 90.0, 3.1, 10.0), (34.0, 90.0, 3.1, 12.0)],
    (SERVER, 55): [(15.0, 0.0, 1.0, 40.0), (23.0, 0.0, 1.0, 60.0)],
    (RENDER, 8): [(120.0, 95.0, 12.0, 0.0), (160.0, 95.0, 12.5, 0.0)],
    (RENDER, 9): [(60.0, 100.0, 6.0, 50.0), (80.0, 100.0, 6.0, 75.0)],
    (WORKER, 20): [(500.0, 100.0, 210.0, 0.0), (600.0, 100.0, 240.0, 0.0)],
}
FOOTPRINT = [[(1.0, 120.0), (2.0, 180.0), (3.0, 230.0), (4.0, 260.0), (5.0, 290.0)],
             [(1.0, 120.0), (2.0, 180.0), (3.0, 230.0), (4.0, 260.0), (5.0, 290.0),
              (6.0, 320.0)]]
# (duration s, ticks, missed ticks, unreadable stacks).
CLOCK = [(5.0, 500, 2, 1), (6.0, 598, 3, 1)]


def is_library(path):
    return path.startswith("/usr/lib/python3")


def charged(frames):
    python = [x for x in frames if not x.get("native")]
    user = [x for x in python if not is_library(x["filename"])]
    return (user or python)[0]


def add(acc, key, split):
    acc[key] = [a + b for a, b in zip(acc.get(key, [0.0, 0.0, 0.0]), split)]


def frame(n):
    """The since-start profile at frame n (1 or 2)."""
    duration, ticks, missed, errors = CLOCK[n - 1]
    lines, functions, threads, procs, native_by_line, stacks = {}, {}, {}, {}, {}, []
    for pid, tid, frames, a, b in STACKS:
        split = list(a) if n == 1 else [x + y for x, y in zip(a, b)]
        if sum(split) == 0.0:
            continue
        c = charged(frames)
        add(lines, (c["filename"], c["line"]), split)
        add(functions, (c["filename"], c["function"]), split)
        add(threads, tid, split)
        add(procs, pid, split)
        leaf = frames[0]
        if leaf.get("native"):
            by = native_by_line.setdefault((c["filename"], c["line"]), {})
            by[(leaf["function"], leaf["filename"])] = by.get(
                (leaf["function"], leaf["filename"]), 0.0) + split[1]
        stacks.append({
            "frames": frames,
            "samples": round(100 * sum(split)),
            "seconds": sum(split),
            "split": dict(zip(["python_s", "native_s", "system_s"], split)),
            "native_id": tid,
        })
    total = sum(sum(s) for s in lines.values())
    pct = lambda s: 100.0 * s / total
    files = {}
    for (file, line), split in sorted(lines.items()):
        entry = {
            "line": line,
            "source": SOURCE[(file, line)],
            "cpu_python_pct": pct(split[0]),
            "cpu_native_pct": pct(split[1]),
            "cpu_system_pct": pct(split[2]),
        }
        mem = MEMORY.get((file, line))
        if mem:
            alloc, python_share, peak, copy = mem[n - 1]
            entry.update({"mem_alloc_mb": alloc, "mem_python_pct": python_share,
                          "mem_peak_mb": peak, "mem_avg_mb": peak / 2,
                          "copy_mb_s": copy / duration})
        natives = sorted(native_by_line.get((file, line), {}).items(), key=lambda kv: -kv[1])
        if natives:
            entry["native_functions"] = [
                {"function": fn, "module": mod, "pct": pct(s)} for (fn, mod), s in natives]
        files.setdefault(file, {"filename": file, "lines": [], "functions": []})
        files[file]["lines"].append(entry)
    for (file, name), split in functions.items():
        first = min(line for (fl, line), _ in lines.items() if fl == file and any(
            charged(fr)["function"] == name and charged(fr)["line"] == line
            for _, _, fr, _, _ in STACKS))
        files[file]["functions"].append({
            "function": name, "first_line": first,
            "cpu_python_pct": pct(split[0]), "cpu_native_pct": pct(split[1]),
            "cpu_system_pct": pct(split[2]),
        })
    for fp in files.values():
        fp["cpu_pct"] = sum(l["cpu_python_pct"] + l["cpu_native_pct"] + l["cpu_system_pct"]
                            for l in fp["lines"])
        fp["functions"].sort(key=lambda fn: (-(fn["cpu_python_pct"] + fn["cpu_native_pct"]
                                               + fn["cpu_system_pct"]), fn["function"]))
    stacks.sort(key=lambda s: (-s["samples"], json.dumps(s["frames"]), s["native_id"]))
    alloc = sum(m[n - 1][0] for m in MEMORY.values())
    python_alloc = sum(m[n - 1][0] * m[n - 1][1] / 100 for m in MEMORY.values())
    merged = round(100 * sum(sum(s["split"].values()) for s in stacks))
    return {
        "schema_version": 2,
        "program": PROCESSES[4242],
        "pid": 4242,
        "python_version": "3.12.1",
        "duration_s": duration,
        "samples": ticks,
        "missed_samples": missed,
        "errors": errors,
        "paused_reads": 0,
        "thinned_samples": 0,
        "rate_hz": ticks / duration,
        "requested_rate_hz": 100.0,
        "mode": "cpu",
        "profile_all": False,
        "native": {"merged_samples": merged, "unmerged_samples": 0,
                   "merge_rate_pct": 100.0},
        "total_s": total,
        "files": sorted(files.values(), key=lambda fp: (-fp["cpu_pct"], fp["filename"])),
        "stacks": stacks,
        "threads": [{
            "native_id": tid, "name": THREAD_NAMES[tid],
            "samples": sum(s["samples"] for s in stacks if s["native_id"] == tid),
            "cpu_python_pct": pct(split[0]), "cpu_native_pct": pct(split[1]),
            "cpu_system_pct": pct(split[2]),
        } for tid, split in sorted(threads.items())],
        "processes": [{
            "pid": pid, "command": PROCESSES[pid], "python_version": "3.12.1",
            "samples": ticks, "cpu_pct": pct(sum(split)),
        } for pid, split in sorted(procs.items())],
        "memory": {
            "peak_mb": max(mb for _, mb in FOOTPRINT[n - 1]),
            "timeline": [[t, mb] for t, mb in FOOTPRINT[n - 1]],
            "alloc_mb": alloc,
            "python_pct": 100.0 * python_alloc / alloc,
            "copy_mb": sum(m[n - 1][3] for m in MEMORY.values()),
            "leaks": [],
            "window_bytes": 1048576,
            "copy_window_bytes": 1048576,
            "dropped_events": 0,
            "handshake_timeouts": 0,
        },
    }


if __name__ == "__main__":
    for n in (1, 2):
        path = os.path.join(HERE, "server", f"frame-{n}.json")
        with open(path, "w", encoding="utf-8") as out:
            json.dump(frame(n), out, indent=2, ensure_ascii=False)
            out.write("\n")
        print("wrote", path)
