"""Each activation's implementations side by side: multiact's backends and the peers, forward and backward.

Parameter ids are what `--benchmark-group-by=param:op` (or param:size, param:impl,
param:direction, param:mode) groups by; extra_info carries bytes moved and
elements so GB/s and ns/element can be computed from a saved run.
"""

from __future__ import annotations

import pytest
from bench_config import DTYPES, IMPLS, OPS, SIZES

import multiact as ma
from multiact.cli import bench


@pytest.mark.parametrize("size", SIZES, ids=bench.size_label)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", ["alloc", "out"])
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("direction", ["forward", "backward"])
@pytest.mark.parametrize("op", OPS)
def test_activation(benchmark, arrays, op, direction, impl, mode, dtype, size):
    x, dy, out = arrays(dtype, size)
    ins = (x,) if direction == "forward" else (dy, x)
    bound = bench.bind(impl, bench.parse_op(op), direction, ins, out, ma.get_num_threads())
    if isinstance(bound, str):
        pytest.skip(bound)
    fn = bound.alloc if mode == "alloc" else bound.into
    if fn is None:
        pytest.skip(f"{impl} has no {mode} form of {op} {direction}")
    benchmark.extra_info.update(elements=size, bytes=(len(ins) + 1) * size * x.itemsize, note=bound.note)
    result = benchmark(fn)
    if mode == "alloc" and result is not None and hasattr(result, "shape"):
        assert tuple(result.shape) == x.shape
