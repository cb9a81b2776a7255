"""Dask arrays: any family's plan as a lazy blockwise graph whose chunks are plans of their own.

The family says how its arrays meet chunk by chunk (`Family.blocks`: each argument's index labels, chunk
changes, whole axes); a chunk rebuilds the plan on its blocks and runs it through the same executors as a
plain call, wherever Dask schedules it, so each worker picks its own best backend for the chunk it holds
(native or numba for NumPy chunks, cuda for CuPy chunks).  What the caller chose when building the graph
travels with it: `backend=` and any `ma.use(...)` scopes.  Sums (parameter and bias gradients) come back
from each chunk as float64 partials, which Dask adds before the family's rounding, once.

The call core imports this module only when it meets a Dask array.
"""

from __future__ import annotations

import contextlib
import functools
import math
import operator
from collections.abc import Iterator
from typing import Any

import dask.array as da
import numpy as np

from . import _arrays, checks, executors, registry
from .plan import Blocks, Plan


def run(plan: Plan, dests: tuple) -> Any:
    """The lazy result of one call on Dask arrays (host arrays beside them join them as Dask arrays)."""
    fn = plan.fn
    if any(d is not None for d in dests):
        raise TypeError(f"{fn}: out= is not supported for Dask arrays: the result is lazy; use the returned "
                        "array (da.store writes it into an existing array)")
    if plan.backend is not None:
        registry.check_name(plan.backend)  # a typo fails now; availability is each worker's own question
    arrays = {n: as_dask(a) for n, a in plan.arrays.items() if a is not None}
    for n, a in arrays.items():
        if a.dtype.name not in checks.DEVICE_DTYPES:
            raise TypeError(f"{fn}: {n} must have a {_arrays.DTYPE_TEXT} dtype, got {a.dtype}")
    checks.same_given_dtype(fn, arrays)
    b = plan.family.blocks(plan, arrays)
    plan.family.check(plan, b.like.dtype)
    single = len(b.results) == 1
    chunk = functools.partial(_chunk, b.rebuild, registry.preference_key(), single)
    args = [x for arg in b.args for x in arg]
    token = f"multiact-{plan.what.split(' ')[0]}-{plan.direction}"
    ndim = len(b.index)
    if single:  # one array, block for block (a sum: one float64 partial per chunk)
        r = b.results[0]
        dtype, meta = (r.dtype, b.like._meta) if r.kernel else (np.float64, np.empty((0,) * ndim, np.float64))
        got = da.blockwise(chunk, b.index, *args, dtype=dtype, meta=meta, token=token,
                           adjust_chunks=b.adjust or None, concatenate=b.concatenate)
        return plan.family.returned(plan, [got if r.kernel else _total(got, r)])
    # one task per chunk returning all its results; each result a lazy view of those tasks
    parts = da.blockwise(chunk, b.index, *args, dtype=object, meta=np.empty((0,) * ndim, object), token=token,
                         adjust_chunks=b.adjust or None, concatenate=b.concatenate)
    values = []
    for i, r in enumerate(b.results):
        if r is None:
            values.append(None)
        elif r.kernel:
            values.append(parts.map_blocks(operator.itemgetter(i), dtype=r.dtype, meta=b.like._meta))
        else:
            chunks = tuple(c if k in r.axes else (1,) * len(c) for k, c in enumerate(parts.chunks))
            values.append(_total(parts.map_blocks(operator.itemgetter(i), dtype=np.float64, chunks=chunks,
                                                  meta=np.empty((0,) * ndim, np.float64)), r))
    return plan.family.returned(plan, values)


def _total(partial: da.Array, r: Any) -> da.Array:
    """A sum's float64 partials (one per chunk, keeping r.axes) added up, then the family's rounding, once."""
    total = partial.sum(axis=tuple(k for k in range(partial.ndim) if k not in r.axes), dtype=np.float64)
    if total.shape != r.shape:
        total = total.reshape(r.shape)
    dtype = np.dtype(r.dtype)
    return total.map_blocks(r.finish, dtype=dtype, meta=np.empty((0,) * len(r.shape), dtype))


@contextlib.contextmanager
def _preferences(prefs: tuple[tuple[str, bool], ...]) -> Iterator[None]:
    """Re-enter the caller's ma.use(...) scopes where the chunk runs (another thread or process)."""
    if not prefs:
        yield
        return
    with contextlib.ExitStack() as stack:
        for name, only in prefs:
            stack.enter_context(registry.use(name, only=only))
        yield


def _chunk(rebuild: Any, prefs: tuple, single: bool, *blocks: Any) -> Any:
    """One chunk: the plan rebuilt on its blocks, run like a plain call; its results' raw arrays (float64
    partials for sums), one array or a tuple."""
    with _preferences(prefs):
        plan = rebuild(*blocks)
        kind = checks.same_kind(plan.fn, plan.arrays)
        got = executors.host(plan, ()) if kind == "numpy" else executors.device(plan, kind, ())
    return got[0] if single else tuple(got)


def as_dask(a: Any) -> da.Array:
    """A Dask array of a call's argument (the core sends here when any of them is one)."""
    return a if isinstance(a, da.Array) else da.from_array(_arrays.as_host_array(a, "array"))


def known(fn: str, a: da.Array, axis: int | None = None) -> None:
    """The array's length along axis (every axis: None) is known; NaN chunks cannot be split or aligned."""
    axes = range(a.ndim) if axis is None else (axis,)
    if any(math.isnan(a.shape[k]) for k in axes):
        what = "x has unknown chunk sizes (NaN)" if axis is None else f"x.shape[{axis}] is unknown (NaN chunks)"
        raise ValueError(f"{fn}: {what}; x.compute_chunk_sizes() first")


__all__ = ["Blocks", "as_dask", "known", "run"]
