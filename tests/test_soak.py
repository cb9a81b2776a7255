"""Soak: a million small calls and a thousand 16M calls, with resident memory sampled.

Bounds: after a warm-up, resident memory may not grow by more than 64 MiB over the run
(one 16M float32 result is 64 MiB; a leak of one result per call would show as gigabytes).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import multiact as ma

GROWTH_BOUND = 64 << 20


def _counts() -> tuple[int, int]:
    """The full soak (1M small calls, 1000 16M calls) on a fast default backend; a fifth otherwise."""
    fast = "-> native" in ma.explain("silu", np.ones(2, np.float32))
    return (1_000_000, 1000) if fast or os.environ.get("MULTIACT_SOAK") == "full" else (200_000, 200)


def _rss() -> int:
    with open(f"/proc/{os.getpid()}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs /proc (Linux)")


def test_a_million_small_calls_do_not_grow_memory():
    x = np.random.default_rng(0).standard_normal(256).astype(np.float32)
    dy = np.ones_like(x)
    for _ in range(2000):
        ma.silu(x)
        ma.silu_grad(dy, x)
    start = _rss()
    samples = []
    n = _counts()[0] // 2
    for i in range(n):
        ma.silu(x)
        ma.silu_grad(dy, x)
        if i % (n // 10) == 0:
            samples.append(_rss())
    growth = _rss() - start
    print(f"{2 * n} small calls: RSS {start >> 20} MiB -> {_rss() >> 20} MiB, samples {[s >> 20 for s in samples]}")
    assert growth < GROWTH_BOUND


def test_a_thousand_16m_calls_do_not_grow_memory():
    x = np.random.default_rng(0).standard_normal(1 << 24).astype(np.float32)
    out = np.zeros_like(x)  # touched, so its pages count before the start
    ma.relu(x)
    n = _counts()[1]
    start = _rss()
    for i in range(n):
        if i % 2:
            ma.relu(x, out=out)
        else:
            y = ma.relu(x)
            del y
    growth = _rss() - start
    print(f"{n} 16M calls: RSS {start >> 20} MiB -> {_rss() >> 20} MiB")
    assert growth < GROWTH_BOUND
