"""pytest-benchmark suite: every implementation of an op on the same arrays.

    pytest benchmarks/ --benchmark-group-by=param:op            # one table per op
    pytest benchmarks/ --benchmark-group-by=param:op,param:size --benchmark-columns=median,iqr,ops
    pytest benchmarks/ --benchmark-save=base; ... --benchmark-compare=0001 --benchmark-compare-fail=median:10%

What runs is narrowed with environment variables (comma-separated):
MULTIACT_BENCH_OPS (default relu,gelu,silu,sigmoid,tanh), MULTIACT_BENCH_SIZES
(default 1K,64K,1M; K=1024), MULTIACT_BENCH_DTYPES (default float32),
MULTIACT_BENCH_IMPLS (default: every available backend for NumPy arrays and every
installed peer, e.g. "backend:numpy,peer:torch").  Implementations that are
missing or lack the op are skipped with the reason (settings: bench_config.py).

The CPU (vendor, family, model, stepping, microarchitecture, SIMD features) is printed in the session
header and stored in each saved run's machine_info["multiact_cpu"]: this project's machines are not all
one CPU, and a figure means little without the CPU it was measured on.
"""

from __future__ import annotations

import numpy as np
import pytest


def pytest_report_header(config):
    from multiact.cli import bench

    return bench.header()


@pytest.hookimpl(optionalhook=True)
def pytest_benchmark_update_machine_info(config, machine_info):
    from multiact.cli import sysinfo

    machine_info["multiact_cpu"] = sysinfo.cpu()


_arrays: dict[tuple[str, int], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}


@pytest.fixture
def arrays():
    """(x, dy, out) of a dtype and size, made once and shared by every implementation (one size kept at a time)."""

    def get(dtype: str, size: int):
        key = (dtype, size)
        if key not in _arrays:
            _arrays.clear()
            rng = np.random.default_rng(0)
            x = (rng.standard_normal(size, dtype=np.float32) * 3).astype(dtype)
            _arrays[key] = (x, rng.standard_normal(size, dtype=np.float32).astype(dtype), np.empty_like(x))
        return _arrays[key]

    return get
