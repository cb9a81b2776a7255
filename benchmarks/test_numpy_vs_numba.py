"""numpy vs numba backends on float32, preallocated `out=`, against a same-size np.copyto.

    pytest benchmarks/test_numpy_vs_numba.py --benchmark-only --benchmark-group-by=param:size,param:op
    MULTIACT_NUM_THREADS=2 ...   # the thread budget of the numba backend (default: all CPUs)

Targets at 16M elements with 2 threads: numba >= 4x the numpy backend on sigmoid, gelu and silu;
numba within 1.5x of np.copyto on relu and leaky_relu (both are bound by memory bandwidth).
"""

from __future__ import annotations

import numpy as np
import pytest

import multiact as ma

SIZES = {"1K": 1 << 10, "1M": 1 << 20, "16M": 1 << 24}
CASES = {
    "relu": ("relu", {}),
    "leaky_relu": ("leaky_relu", {"negative_slope": 0.2}),
    "gelu": ("gelu", {"approximate": "none"}),
    "gelu_tanh": ("gelu", {"approximate": "tanh"}),
    "silu": ("silu", {}),
    "sigmoid": ("sigmoid", {}),
    "tanh": ("tanh", {}),
}

_DATA: dict[int, tuple[np.ndarray, np.ndarray]] = {}


def _data(n: int) -> tuple[np.ndarray, np.ndarray]:
    if n not in _DATA:
        _DATA.clear()  # keep at most one size alive (16M float32 = 64 MB per array)
        x = np.random.default_rng(0).standard_normal(n).astype(np.float32) * 3
        _DATA[n] = (x, np.empty_like(x))
    return _DATA[n]


@pytest.mark.parametrize("size", list(SIZES))
@pytest.mark.parametrize("op", list(CASES))
@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_forward(benchmark, backend, op, size):
    name, params = CASES[op]
    x, out = _data(SIZES[size])
    ma.forward(name, x, out=out, backend=backend, **params)  # compile / warm the pool outside the timing
    benchmark.group = f"{op} {size}"
    benchmark(ma.forward, name, x, out=out, backend=backend, **params)


@pytest.mark.parametrize("size", list(SIZES))
def test_copyto(benchmark, size):
    """The floor for any elementwise kernel: read n floats, write n floats."""
    x, out = _data(SIZES[size])
    benchmark.group = f"copyto {size}"
    benchmark(np.copyto, out, x)
