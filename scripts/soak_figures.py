"""The figures issue 8's closing note asks for: calls per second under 16 threads, and resident memory
before and after the soak of tests/test_soak.py.

    python scripts/soak_figures.py [--seconds 5] [--small 1000000] [--large 1000]

Calls per second: 16 Python threads (and 1, for comparison) calling for a fixed time, on (a) small
float32 calls (silu forward and backward on 256 elements, the default backend) and (b) a mix like
tests/test_concurrency.py's (every op but prelu and threshold, forward and backward, float16/32/64,
1 to 70K elements, every host backend that has the kernel).  Soak: `--small` silu forward and
backward calls on 256 elements, then `--large` relu calls on 16M float32 elements (half allocating,
half into out=), with RSS (/proc/self/statm) after warm-up, after each phase, and the peak sampled.
"""

from __future__ import annotations

import argparse
import os
import platform
import threading
import time

import numpy as np

import multiact as ma
from multiact.optable import FLOAT_DTYPES, OPS, REQUIRED


def _rss_mib() -> float:
    with open(f"/proc/{os.getpid()}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _host_backends() -> list[str]:
    return [b.name for b in ma.backends() if b.available and "numpy" in b.kinds]


def _mix(backends: list[str]):
    """The concurrency test's kind of mix as a fixed, shuffled list of calls, one per (op, direction,
    dtype, backend), each on one of 8 sizes up to 70K: call(i) runs entry i modulo the list."""
    rng = np.random.default_rng(0)
    sizes = (1, 7, 100, 1000, 4099, 20_000, 65_536, 70_000)
    inputs = {(d, n): (rng.standard_normal(n) * 4).astype(d) for d in FLOAT_DTYPES for n in sizes}
    entries = []
    for op in OPS:
        needs_params = any(q.default is REQUIRED for q in OPS[op].params)  # called with the defaults only
        for dtype in FLOAT_DTYPES:
            for backend in backends:
                for direction in ("forward", "backward"):
                    if needs_params or not ma.registry.module(backend).supports(op, direction, dtype):
                        continue
                    entries.append((op, direction, backend, inputs[(dtype, sizes[len(entries) % len(sizes)])]))
    order = rng.permutation(len(entries))

    def call(i: int):
        op, direction, backend, x = entries[order[i % len(entries)]]
        if direction == "forward":
            return ma.forward(op, x, backend=backend)
        return ma.backward(op, x, x, backend=backend)

    call.size = len(entries)
    return call


def _rate(threads: int, seconds: float, call) -> float:
    """Calls per second of `threads` threads each calling call(i) until the time is up."""
    count = [0] * threads
    start = threading.Barrier(threads + 1)
    stop = threading.Event()

    def worker(k: int):
        start.wait()
        i = k
        while not stop.is_set():
            call(i)
            i += threads
            count[k] += 1

    ts = [threading.Thread(target=worker, args=(k,)) for k in range(threads)]
    for t in ts:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    time.sleep(seconds)
    stop.set()
    for t in ts:
        t.join()
    return sum(count) / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--small", type=int, default=1_000_000)
    ap.add_argument("--large", type=int, default=1000)
    a = ap.parse_args()
    from multiact.cli import sysinfo

    print(f"CPU: {sysinfo.summary()}")  # the CPU these figures are measured on
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}, "
          f"multiact threads {ma.get_num_threads()}, backends {', '.join(_host_backends())}")

    x256 = np.random.default_rng(0).standard_normal(256).astype(np.float32)
    dy256 = np.ones_like(x256)

    def small(i: int):
        return ma.silu(x256) if i % 2 else ma.silu_grad(dy256, x256)

    mix = _mix(_host_backends())
    for i in range(mix.size):  # compile and cache every kernel of the mix before timing
        mix(i)
    print(f"default backend for small float32 calls: {ma.explain('silu', x256).splitlines()[0].split('-> ')[1]}")
    for name, call in (("small silu f32[256]", small), ("concurrency mix", mix)):
        one, sixteen = _rate(1, a.seconds, call), _rate(16, a.seconds, call)
        print(f"{name}: 1 thread {one:,.0f} calls/s, 16 threads {sixteen:,.0f} calls/s")

    for _ in range(2000):
        small(0), small(1)
    r0 = peak = _rss_mib()
    t0 = time.perf_counter()
    for i in range(a.small):
        small(i)
        if i % 50_000 == 0:
            peak = max(peak, _rss_mib())
    r1 = _rss_mib()
    print(f"{a.small:,} small calls in {time.perf_counter() - t0:.1f} s: RSS {r0:.1f} -> {r1:.1f} MiB "
          f"(peak {max(peak, r1):.1f})")

    x = np.random.default_rng(0).standard_normal(1 << 24).astype(np.float32)
    out = np.zeros_like(x)
    ma.relu(x)
    r2 = peak = _rss_mib()
    t0 = time.perf_counter()
    for i in range(a.large):
        if i % 2:
            ma.relu(x, out=out)
        else:
            del_me = ma.relu(x)
            peak = max(peak, _rss_mib())
            del del_me
    r3 = _rss_mib()
    print(f"{a.large:,} 16M calls in {time.perf_counter() - t0:.1f} s: RSS {r2:.1f} -> {r3:.1f} MiB "
          f"(peak {max(peak, r3):.1f})")


if __name__ == "__main__":
    main()
