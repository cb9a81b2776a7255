"""The pytest-benchmark suite runs: one of its functions, called once with a stand-in for the fixture."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np

BENCH_DIR = Path(__file__).resolve().parent.parent / "benchmarks"


class OnceNoTiming:
    """Stands in for pytest-benchmark's `benchmark` fixture: calls the function once."""

    def __init__(self):
        self.extra_info: dict = {}
        self.calls = 0

    def __call__(self, fn, *args, **kwargs):
        self.calls += 1
        return fn(*args, **kwargs)


def _load(name: str):
    sys.path.insert(0, str(BENCH_DIR))
    try:
        spec = importlib.util.spec_from_file_location(f"_bench_{name}", BENCH_DIR / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    finally:
        sys.path.remove(str(BENCH_DIR))


def test_benchmark_function_runs_once():
    ops = _load("test_ops")
    arrays = {}

    def get(dtype, size):
        x = np.linspace(-4, 4, size, dtype=dtype)
        return arrays.setdefault((dtype, size), (x, np.ones_like(x), np.empty_like(x)))

    for mode in ("alloc", "out"):
        b = OnceNoTiming()
        ops.test_activation(b, get, "gelu", "backward", "backend:numpy", mode, "float32", 256)
        assert b.calls == 1 and b.extra_info["bytes"] == 3 * 256 * 4
    x, dy, out = get("float32", 256)
    import multiact as ma

    np.testing.assert_array_equal(out, ma.gelu_grad(dy, x, backend="numpy"))


def test_benchmark_parameters_cover_backends_and_peers():
    cfg = _load("bench_config")
    assert "backend:numpy" in cfg.IMPLS and cfg.OPS and cfg.SIZES
