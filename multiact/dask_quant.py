"""quant= on Dask arrays: the float32 result as a lazy graph (the call core's Dask executor), then its codes and
scales chunk by chunk, the same bits as the host call.

Per token, group or MX block, a chunk must hold whole groups along the last axis: where the chunks do not
(a token's row split, a group cut), the float32 result is rechunked along the last axis first (whole rows for
"token"; multiples of the group elsewhere), which Dask does lazily.  A dynamic "tensor" scale needs the whole
array's amax (or min and max, for int8's zero-point form): Dask reduces it (max and min are exact and keep a
NaN), and every chunk is quantized with it.  The scales come back as a Dask array beside the codes.

The call core imports this module only when it meets a Dask array with quant=.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable
from typing import Any

import dask.array as da
import numpy as np

from . import quant as Q
from .dask_arrays import known


def run(fn: str, y: da.Array, q: Q.Quant) -> tuple[da.Array, ...]:
    """(codes, scales[, zero points]) of the lazy float32 result y."""
    known(fn, y)
    if q.granularity == "tensor":
        return _whole(fn, y, q)
    if y.ndim == 0:
        Q.quantize_host(fn, np.zeros((), np.float32), q)  # the contract's own error for a 0-d array
    block = q.block or y.shape[-1]
    Q.quantize_host(fn, np.zeros((1, y.shape[-1]), np.float32), q)  # the last axis fits the groups (or its error)
    last = y.ndim - 1
    if any(c % block for c in y.chunks[last]):
        size = block * max(1, round(max(y.chunks[last]) / block))
        y = y.rechunk({last: min(size, y.shape[last]) if q.granularity != "token" else -1})
    groups = tuple(c // block for c in y.chunks[last])
    parts = y.map_blocks(functools.partial(_chunk, fn, q), dtype=object, meta=np.empty((0,) * y.ndim, object))
    metas = _dtypes(q)
    out = [parts.map_blocks(operator.itemgetter(0), dtype=metas[0], meta=np.empty((0,) * y.ndim, metas[0]))]
    for i, dt in enumerate(metas[1:], start=1):
        out.append(parts.map_blocks(operator.itemgetter(i), dtype=dt, chunks=(*y.chunks[:-1], groups),
                                    meta=np.empty((0,) * y.ndim, dt)))
    return tuple(out)


def _whole(fn: str, y: da.Array, q: Q.Quant) -> tuple[da.Array, ...]:
    """One scale for the whole array: its statistics reduced by Dask, then every chunk quantized with them."""
    stats = Q.whole_stats(q, y)
    if not stats:  # a static scale: the chunks need nothing of each other
        parts = y.map_blocks(functools.partial(_chunk, fn, q), dtype=object, meta=np.empty((0,) * y.ndim, object))
        scale = Q.quantize_host(fn, np.zeros((1,), np.float32), q)[1]
        dt = _dtypes(q)[0]
        return parts.map_blocks(operator.itemgetter(0), dtype=dt, meta=np.empty((0,) * y.ndim, dt)), \
            da.from_array(scale)
    ind = tuple(range(y.ndim))
    args: list[Any] = [y, ind]
    for s in stats:
        args += [s, ()]
    parts = da.blockwise(functools.partial(_chunk, fn, q), ind, *args, dtype=object,
                         meta=np.empty((0,) * y.ndim, object), concatenate=True)
    metas = _dtypes(q)
    codes = parts.map_blocks(operator.itemgetter(0), dtype=metas[0], meta=np.empty((0,) * y.ndim, metas[0]))
    # the scale (and zero point) from the statistics alone: one 0-d task each, the chunks' agree
    first = np.zeros((1,), np.float32)
    rest = [da.blockwise(functools.partial(_scalar, fn, q, i, first), (), *[a for s in stats for a in (s, ())],
                         dtype=dt, meta=np.empty((), dt)) for i, dt in enumerate(metas[1:], start=1)]
    return (codes, *rest)


def _chunk(fn: str, q: Q.Quant, block: np.ndarray, *stats: np.ndarray) -> tuple[np.ndarray, ...]:
    return Q.quantize_host(fn, np.asarray(block, np.float32), q, tuple(stats) or None)


def _scalar(fn: str, q: Q.Quant, i: int, probe: np.ndarray, *stats: np.ndarray) -> np.ndarray:
    """Result i (the scale, the zero point) of a tensor quantization with the whole array's statistics."""
    return Q.quantize_host(fn, probe, q, tuple(stats) or None)[i]


def _dtypes(q: Q.Quant) -> list[np.dtype]:
    """The results' dtypes (codes, scales[, zero points]), from the contract's own results on one value."""
    probe = np.zeros((1, q.block or 1), np.float32)
    return [r.dtype for r in Q.quantize_host("quant", probe, q)]


def widened(a: da.Array, to_float32: Callable[[Any], Any]) -> da.Array:
    """A Dask array widened exactly to float32 (float16 and bfloat16 chunks); float32 and float64 as they are."""
    return a.map_blocks(to_float32, dtype=np.float32) if a.dtype.itemsize < 4 else a
