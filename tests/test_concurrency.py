"""Many threads at once: same results as a single-threaded replay; scopes stay where they were set."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
from conftest import host_backends

import multiact as ma
from multiact.ops import OPS

BACKENDS = [b.values[0] for b in host_backends() if not b.marks]
OPS_MIX = [op for op in OPS if op not in ("prelu", "threshold")]
DTYPES = ("float16", "float32", "float64")


def _call(i: int):
    """Call number i: a deterministic mix of op, direction, dtype, size and backend."""
    rng = np.random.default_rng(i)
    op = OPS_MIX[i % len(OPS_MIX)]
    dtype = DTYPES[(i // 3) % 3]
    backend = BACKENDS[(i // 7) % len(BACKENDS)]
    if not ma.registry.module(backend).supports(op, "backward", dtype):
        backend = "numpy"
    n = int(rng.integers(1, 70_000))
    x = (rng.standard_normal(n) * 4).astype(dtype)
    if i % 2:
        return ma.forward(op, x, backend=backend)
    return ma.backward(op, np.ones_like(x), x, backend=backend)


def test_sixteen_threads_match_a_single_threaded_replay():
    results: dict[int, np.ndarray] = {}
    errors = []
    deadline = time.monotonic() + 3.0
    counter = iter(range(10**9))
    lock = threading.Lock()

    def worker():
        try:
            while time.monotonic() < deadline:
                with lock:
                    i = next(counter)
                results[i] = _call(i)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(results) > 16
    for i, got in results.items():
        np.testing.assert_array_equal(got, _call(i), err_msg=f"call {i}")


def test_set_num_threads_while_other_threads_run():
    stop = threading.Event()
    errors = []
    x = np.random.default_rng(0).standard_normal(300_000).astype(np.float32)
    want = ma.gelu(x)

    def worker():
        try:
            while not stop.is_set():
                np.testing.assert_array_equal(ma.gelu(x), want)
        except Exception as e:  # pragma: no cover
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    before = ma.get_num_threads()
    try:
        for n in (1, 2, 1, 2, 1):
            ma.set_num_threads(n)
            time.sleep(0.05)
    finally:
        stop.set()
        for t in threads:
            t.join()
        ma.set_num_threads(before)
    assert not errors, errors


def test_use_scopes_are_per_asyncio_task():
    x = np.ones(3, np.float32)

    async def task(name: str, delay: float):
        with ma.use(name):
            await asyncio.sleep(delay)
            return ma.explain("relu", x).splitlines()[0].split("-> ")[1], name

    async def main():
        return await asyncio.gather(task("numpy", 0.02), task(BACKENDS[-1], 0.01))

    for chosen, asked in asyncio.run(main()):
        assert chosen == asked
