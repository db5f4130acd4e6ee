#!/usr/bin/env python3
"""Checks that the crate's modules depend on one another in one direction only.

Reads every `crate::a::b` path (and `super::` path) in src/ outside `#[cfg(test)]` code, and
fails when:
- a top-level module uses one at its own layer or above (LAYERS, lowest first: data flows
  upward, from reading a process to rendering a profile; docs/ARCHITECTURE.md);
- files form a circle (a file uses a second that, through others, uses the first).

A path is matched to the longest file it names (`crate::python::stack::walk::X` is the file
src/python/stack/walk.rs). Comments are ignored; `use` lists spanning lines are read whole.
Not seen: paths relative to a module's own children (`use child::X` in a mod.rs), which are
how a mod.rs re-exports; a circle through one of those goes unnoticed.
preload/ is a crate of its own and is not looked at.

    tools/layers.py            # prints the module edges; exit 1 on a back-arrow or circle
"""
import os
import re
import sys

# Lowest first. A module may use the modules of lower layers only. Reading a process is at
# the bottom, the profile's plain data above what it is built from, what records above the
# data it writes, the renderers and the sessions on top.
LAYERS = [
    ["error"],
    ["proc"],
    ["courtesy"],
    ["ptrace", "elf"],
    # A core file's memory (one more `ProcessMemory`) and the files it names.
    ["coredump"],
    ["python_bindings", "native"],
    ["python"],
    # The plain data a recording produces (and its aggregator), built from python's frames.
    ["profile"],
    ["timeline"],
    # What records: each writes into the profile, none uses another.
    ["sampler", "memory", "gpu"],
    ["report"],
    # Sends what report encodes to a backend (`--push`): above the encoders, below the
    # sessions that cut the windows.
    ["export"],
    ["session"],
    ["fuzzing"],
]
LEVEL = {m: i for i, layer in enumerate(LAYERS) for m in layer}

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")


def module_of(rel):
    """src-relative path -> module path ("python/stack/mod.rs" -> "python::stack")."""
    rel = rel[:-3]
    if rel.endswith("/mod"):
        rel = rel[: -len("/mod")]
    return rel.replace("/", "::")


def code_of(text):
    """The text without comments and without the unit tests' module."""
    cut = text.find("#[cfg(test)]\nmod tests")
    if cut >= 0:
        text = text[:cut]
    text = re.sub(r"//[^\n]*", "", text)
    return text


def main():
    files = {}
    for d, _, names in os.walk(ROOT):
        for n in names:
            if n.endswith(".rs"):
                p = os.path.join(d, n)
                files[module_of(os.path.relpath(p, ROOT))] = p
    edges = {}  # file module -> set of file modules
    top = {}  # top module -> set of top modules
    for mod, path in files.items():
        if mod in ("lib", "main"):
            continue
        code = code_of(open(path, encoding="utf-8").read())
        # `super::` names the module above this one's (for a mod.rs, above its directory).
        parent = mod.rsplit("::", 1)[0] if "::" in mod else ""
        targets = set()
        for p in re.findall(r"\bcrate::([a-z_][a-z0-9_]*(?:::[a-z_][a-z0-9_]*)*)", code):
            targets.add(p)
        for p in re.findall(r"\bsuper::([a-z_][a-z0-9_]*(?:::[a-z_][a-z0-9_]*)*)", code):
            targets.add(f"{parent}::{p}" if parent else p)
        for t in targets:
            segs = t.split("::")
            for k in range(len(segs), 0, -1):
                c = "::".join(segs[:k])
                if c in files:
                    if c != mod and not mod.startswith(c + "::"):
                        edges.setdefault(mod, set()).add(c)
                    break
            a, b = mod.split("::")[0], segs[0]
            if a != b and b not in ("lib", "main"):
                top.setdefault(a, set()).add(b)
    failures = []
    print("module edges (lowest layer first):")
    for a in sorted(top, key=lambda m: (LEVEL.get(m, 99), m)):
        print(f"  {a} -> {', '.join(sorted(top[a], key=lambda m: (LEVEL.get(m, 99), m)))}")
        for b in top[a]:
            if a not in LEVEL or b not in LEVEL:
                failures.append(f"{a} -> {b}: a module missing from LAYERS (tools/layers.py)")
            elif LEVEL[b] >= LEVEL[a]:
                failures.append(f"{a} -> {b}: against the flow ({b} is not below {a})")
    # Circles of files: strongly connected components of more than one file.
    index, low, stack, on, count = {}, {}, [], set(), [0]
    sys.setrecursionlimit(100000)

    def visit(v):
        index[v] = low[v] = count[0]
        count[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                failures.append("a circle of files: " + " <-> ".join(sorted(comp)))

    for v in sorted(files):
        if v not in index:
            visit(v)
    for f in failures:
        print("layers: " + f, file=sys.stderr)
    if not failures:
        print("layers: no arrow against the flow, no circle of files")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
