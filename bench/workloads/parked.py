# -*- coding: utf-8 -*-
"""bench/run.py's many-threads workload: N threads parked on one Event (a thread pool at
rest) beside a main thread that does a fixed amount of pure-Python work (so the run's wall
time measures what the profiler costs it, unlike fixtures/cpu/parked.py, which works for a
fixed time). BENCH_THREADS sets N (default 150); BENCH_WORK the work's size in units of a
million loop turns (default 30: about 2 s of CPU on the development machine).
Python 3."""
import os
import threading


def parked(stop):
    stop.wait()


def work(units):
    total = 0
    for _ in range(units):
        for i in range(1000000):
            total += i * i % 7
    return total


def main():
    n = int(os.environ.get("BENCH_THREADS", "150"))
    units = int(os.environ.get("BENCH_WORK", "30"))
    stop = threading.Event()
    threads = [threading.Thread(target=parked, args=(stop,)) for _ in range(n)]
    for t in threads:
        t.daemon = True
        t.start()
    result = work(units)
    stop.set()
    for t in threads:
        t.join()
    print("done", result)


if __name__ == "__main__":
    main()
