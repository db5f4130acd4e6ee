# -*- coding: utf-8 -*-
"""bench/pool_ramp.py's workload: bench/workloads/parked.py with its phases timed. Starts
BENCH_THREADS threads (default 1000) parked on one Event, does BENCH_WORK million loop
turns on the main thread (default 0: the start and the join alone), wakes and joins the
threads, and writes to stderr how long each phase took and the CPU time the process used
(all its threads). Python 3."""
import os
import resource
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from parked import parked, work  # noqa: E402  (the same threads and work as parked.py)


def main():
    n = int(os.environ.get("BENCH_THREADS", "1000"))
    units = int(os.environ.get("BENCH_WORK", "0"))
    t0 = time.perf_counter()
    stop = threading.Event()
    threads = [threading.Thread(target=parked, args=(stop,)) for _ in range(n)]
    for t in threads:
        t.daemon = True
        t.start()
    t1 = time.perf_counter()
    work(units)
    t2 = time.perf_counter()
    stop.set()
    for t in threads:
        t.join()
    t3 = time.perf_counter()
    ru = resource.getrusage(resource.RUSAGE_SELF)
    sys.stderr.write("CPU %.1f\n" % ((ru.ru_utime + ru.ru_stime) * 1e3))
    sys.stderr.write("PHASES start %.1f work %.1f join %.1f ms\n"
                     % ((t1 - t0) * 1e3, (t2 - t1) * 1e3, (t3 - t2) * 1e3))


main()
