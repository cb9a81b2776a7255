"""Many threads at once: same results as a single-threaded replay; scopes stay where they were set."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest
from conftest import host_backends

import multiact as ma
from multiact.optable import OPS

BACKENDS = [b.values[0] for b in host_backends() if not b.marks]
OPS_MIX = [op for op in OPS if op not in ("prelu", "threshold")]
DTYPES = ("float16", "float32", "float64")
N_CALLS = 480  # every (op, dtype) pair within the first 198 calls, each on every backend in turn


def _call(i: int):
    """Call number i: a deterministic mix of op, direction, dtype, size and backend."""
    rng = np.random.default_rng(i)
    op = OPS_MIX[i % len(OPS_MIX)]
    dtype = DTYPES[(i // 3) % 3]
    backend = BACKENDS[(i // 7) % len(BACKENDS)]
    direction = "forward" if i % 2 else "backward"
    if not ma.registry.module(backend).supports(op, direction, dtype):
        backend = "numpy"
    n = int(rng.integers(1, 70_000))
    x = (rng.standard_normal(n) * 4).astype(dtype)
    if direction == "forward":
        return ma.forward(op, x, backend=backend)
    return ma.backward(op, np.ones_like(x), x, backend=backend)


def _in_threads(n: int, body) -> None:
    """Run body() in n threads started together; re-raise what any of them raised."""
    start = threading.Barrier(n)
    errors = []

    def worker():
        try:
            start.wait()
            body()
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_sixteen_threads_match_a_single_threaded_replay():
    """The same calls single-threaded, then from 16 threads at once: identical results.

    The single-threaded pass runs first, so kernels compile there: a JIT compile competing with 15 busy
    threads for the GIL takes 10-20x longer (first use from many threads has its own test below).
    """
    want = [_call(i) for i in range(N_CALLS)]
    results: dict[int, np.ndarray] = {}
    counter = iter(range(N_CALLS))
    lock = threading.Lock()

    def worker():
        while True:
            with lock:
                i = next(counter, None)
            if i is None:
                return
            results[i] = _call(i)

    _in_threads(16, worker)
    assert sorted(results) == list(range(N_CALLS))
    for i, got in results.items():
        np.testing.assert_array_equal(got, want[i], err_msg=f"call {i}")


def test_threads_meeting_a_cold_numba_loop_compile_it_once():
    """Eight threads ask for the same not-yet-compiled loop at once: one compiled function, right results."""
    if "numba" not in BACKENDS:
        pytest.skip("numba is not available")
    from multiact.backend import numba_backend as nb

    warm = nb._loops(("relu", "forward", "float32"))
    pair = nb._LoopPair(warm.scalar, warm.arity, warm.tag)  # a fresh, cold pair around the same formula
    x = np.linspace(-2, 2, 1001, dtype=np.float32)
    got = []

    def worker():
        loop = pair.loop(False)
        out = np.empty_like(x)
        loop(*nb._inputs((x,)), out, 0.0, 0.0)
        got.append((loop, out))

    _in_threads(8, worker)
    assert len({id(loop) for loop, _ in got}) == 1
    for _, out in got:
        np.testing.assert_array_equal(out, np.maximum(x, 0))


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
