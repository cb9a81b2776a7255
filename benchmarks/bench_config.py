"""What the benchmark suite runs, from environment variables (see conftest.py for how to use it)."""

from __future__ import annotations

import os

from multiact.cli import bench, peers


def _env(name: str, default: str) -> list[str]:
    return [v.strip() for v in os.environ.get(name, default).split(",") if v.strip()]


def implementations() -> list[str]:
    """'backend:NAME' for each available backend of NumPy arrays, 'peer:NAME' for each installed peer."""
    given = _env("MULTIACT_BENCH_IMPLS", "")
    if given:
        return given
    backends, _ = bench.host_backends()
    return [f"backend:{b}" for b in backends] + [f"peer:{p}" for p in peers.PEERS if peers.available(p)[0]]


OPS = _env("MULTIACT_BENCH_OPS", "relu,gelu,silu,sigmoid,tanh")
SIZES = [bench.parse_size(s) for s in _env("MULTIACT_BENCH_SIZES", "1K,64K,1M")]
DTYPES = _env("MULTIACT_BENCH_DTYPES", "float32")
IMPLS = implementations()
