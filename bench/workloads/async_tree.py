"""pyperformance's async_tree benchmark, run without pyperf: a tree of tasks six levels deep
with six branches a level, gathered (the benchmark's own module, from the peers' venv, is
imported and driven directly; pyperf, which only its command line uses, is stood in for).

ASYNC_TREE_VARIANT: none (default: scheduling only, the hardest case for a profiler),
cpu_io_mixed, io, memoization; ASYNC_TREE_LOOPS: trees per run (default 6).
ASYNC_TREE_MODULE: the benchmark's run_benchmark.py (default: found in the peers' venv).
"""
import asyncio
import glob
import importlib.util
import os
import sys
import types

VENV = os.path.expanduser("~/.cache/scalene-rs-bench/venv")
found = glob.glob(
    os.path.join(VENV, "lib/python3*/site-packages/pyperformance/data-files/benchmarks/"
                 "bm_async_tree/run_benchmark.py")
)
path = os.environ.get("ASYNC_TREE_MODULE") or (found[0] if found else None)
if not path or not os.path.exists(path):
    sys.exit("async_tree: pyperformance's bm_async_tree not found (run ../shared/bench/setup-peers.sh)")
sys.modules.setdefault("pyperf", types.ModuleType("pyperf"))
spec = importlib.util.spec_from_file_location("bm_async_tree", path)
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)

variants = {
    "none": bench.NoneAsyncTree,
    "io": bench.IOAsyncTree,
    "memoization": bench.MemoizationAsyncTree,
    "cpu_io_mixed": bench.CpuIoMixedAsyncTree,
}
tree = variants[os.environ.get("ASYNC_TREE_VARIANT", "none")]
for _ in range(int(os.environ.get("ASYNC_TREE_LOOPS", "6"))):
    asyncio.run(tree().run())
