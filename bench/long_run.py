"""A workload for long profiling runs: for SECONDS (argv[1], default 600) it keeps calling
through a dozen functions at varying depths (1-40 frames) from two threads, so the profiler
sees many distinct stacks and lines, as a real program would. Works on Python 2.7 and 3.x."""
import random
import sys
import threading
import time

DEADLINE = time.time() + (float(sys.argv[1]) if len(sys.argv) > 1 else 600.0)


def f0(d, r):
    return f1(d - 1, r) if d > 0 else sum(i * i for i in range(200))


def f1(d, r):
    return f2(d - 1, r) if d > 0 else sorted(r.random() for _ in range(300))[0]


def f2(d, r):
    return f3(d - 1, r) if d > 0 else len(str(r.random()) * 50)


def f3(d, r):
    return (f0 if r.random() < 0.5 else f4)(d - 1, r) if d > 0 else 1


def f4(d, r):
    return f5(d - 1, r) if d > 0 else max(range(500))


def f5(d, r):
    return f0(d - 1, r) if d > 0 else [x for x in range(400) if x % 3][-1]


def worker(seed):
    r = random.Random(seed)
    n = 0
    while time.time() < DEADLINE:
        f0(r.randint(1, 40), r)
        n += 1
    return n


threads = [threading.Thread(target=worker, args=(s,)) for s in (1, 2)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print("done")
