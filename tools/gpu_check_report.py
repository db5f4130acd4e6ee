"""Reads tools/gpu_check.sh's profiles and prints each marked line's GPU figures against
the bars (ours), and Scalene's figures for the same lines when it ran. Exit 1 when a bar
of ours is missed."""
import json
import os
import sys

OUT = sys.argv[1]
FIXTURE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "gpu",
                       "torch_lines.py")


def marks():
    found = {}
    for i, line in enumerate(open(FIXTURE), 1):
        if "# MARK: " in line:
            found[line.rsplit("# MARK: ", 1)[1].strip()] = i
    return found


def ours(name):
    path = os.path.join(OUT, name + ".json")
    if not os.path.exists(path):
        return None, {}
    p = json.load(open(path))
    by_line = {}
    for f in p.get("files", []):
        if f["filename"].endswith("torch_lines.py"):
            for l in f["lines"]:
                by_line[l["line"]] = (l.get("gpu_pct", 0.0), l.get("gpu_mem_peak_mb", 0.0))
    return p, by_line


def scalene(name):
    path = os.path.join(OUT, name + ".json")
    if not os.path.exists(path):
        return {}
    p = json.load(open(path))
    by_line = {}
    for fname, f in p.get("files", {}).items():
        if fname.endswith("torch_lines.py"):
            for l in f.get("lines", []):
                by_line[l["lineno"]] = (l.get("n_gpu_percent", 0.0),
                                        l.get("n_gpu_peak_memory_mb", 0.0))
    return by_line


m = marks()
failed = []
for run in ("ours-full", "ours-cpu"):
    p, lines = ours(run)
    if p is None:
        failed.append(run + ": no profile")
        continue
    g = p.get("gpu", {})
    print("%s: GPU %s; %.2f GPU-s, %.2f unattributed, peak %.0f MB, notes %s"
          % (run, g.get("unavailable") or "ok", g.get("gpu_s", 0), g.get("unattributed_s", 0),
             g.get("mem_peak_mb", 0), g.get("notes", [])))
    for d in g.get("devices", []):
        print("  device %d %s: %.2f GPU-s, peak %.0f MB, device-wide busy %s%%"
              % (d["index"], d["name"], d["gpu_s"], d["mem_peak_mb"], d.get("device_busy_pct")))
    for label in ("MATMUL", "CPU", "ALLOC"):
        pct, mem = lines.get(m[label], (0.0, 0.0))
        print("  %-6s line %3d: GPU %5.1f%%  GPU memory peak %7.0f MB" % (label, m[label], pct, mem))
    if lines.get(m["MATMUL"], (0, 0))[0] < 85:
        failed.append(run + ": MATMUL under 85%")
    if lines.get(m["CPU"], (0, 0))[0] > 5:
        failed.append(run + ": CPU over 5%")
    if lines.get(m["ALLOC"], (0, 0))[1] < 4096:
        failed.append(run + ": ALLOC peak under 4096 MiB")
p, lines = ours("ours-async")
if p is not None:
    for label in ("LAUNCH", "SYNC"):
        pct, mem = lines.get(m[label], (0.0, 0.0))
        print("ours-async: %-6s line %3d: GPU %5.1f%%" % (label, m[label], pct))
    others = sorted((n, pct) for n, (pct, _) in lines.items()
                    if pct >= 1 and n not in (m["LAUNCH"], m["SYNC"]))
    print("ours-async: other lines with GPU time: %s; %.2f GPU-s unattributed of %.2f; notes %s"
          % (", ".join("%d: %.1f%%" % x for x in others) or "none",
             p["gpu"].get("unattributed_s", 0), p["gpu"].get("gpu_s", 0),
             p["gpu"].get("notes", [])))
else:
    failed.append("ours-async: no profile")
p, lines = ours("ours-attach")
if p is not None:
    g = p.get("gpu", {})
    print("ours-attach: GPU %s; %.2f GPU-s; MATMUL %.1f%%, CPU %.1f%%, ALLOC peak %.0f MB"
          % (g.get("unavailable") or "ok", g.get("gpu_s", 0), lines.get(m["MATMUL"], (0, 0))[0],
             lines.get(m["CPU"], (0, 0))[0], lines.get(m["ALLOC"], (0, 0))[1]))
sc = scalene("scalene")
if sc:
    for label in ("MATMUL", "CPU", "ALLOC"):
        pct, mem = sc.get(m[label], (0.0, 0.0))
        print("scalene --gpu: %-6s line %3d: GPU %5.1f%%  GPU memory peak %7.0f MB"
              % (label, m[label], pct, mem))
print("bars: " + ("all met" if not failed else "MISSED: " + "; ".join(failed)))
sys.exit(1 if failed else 0)
