"""The executors of the call core: a plan carried out on host arrays, or on device arrays.

host: NumPy views of the caller's arrays (NumPy, torch CPU tensors, lists, floats) go to a CPU backend's
kernel; the results come back in the caller's kind.  device: CUDA or NPU arrays go as they are to the backend
that owns their kind, which allocates in kind.  Both check every destination before the kernel runs.  A plan
with `partial` set (a Dask chunk) gets its results' raw arrays back, sums as float64 partials.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import _arrays, checks, hot, registry
from .plan import Job, Plan


def _run(plan: Plan, job: Job, mod: Any, kernel: Any, dtype: str, arrays: list) -> dict[int, Any]:
    hit = hot.Hit(kernel, job.p, mod, f"{plan.what} {plan.direction} in {dtype}")
    return job.run(hit.call, arrays)


# ---- host arrays -------------------------------------------------------------------------------------


def host(plan: Plan, dests: tuple) -> Any:
    fn = plan.fn
    arrs = checks.host_arrays(fn, plan.arrays, plan.family.optional)
    job = plan.family.host(plan, arrs)
    plan.family.check(plan, job.dtype)
    dtype = checks.dtype_name(job.dtype)
    mod, kernel = registry.resolve(plan.key, plan.direction, dtype, "numpy", plan.backend)
    arrays, given = _host_results(fn, job, dests, arrs)
    values = _run(plan, job, mod, kernel, dtype, arrays)
    if not plan.partial:
        hot.remember(plan, job, mod, kernel, arrs)
    return _finish(plan, dests, given, arrays, values)


def _host_results(fn: str, job: Job, dests: tuple, arrs: dict) -> tuple[list, list]:
    """The results' arrays (destinations checked, the rest allocated) and the given destinations' views."""
    arrays: list[Any] = []
    given: list[Any] = []
    seen = dict(arrs)
    for i, r in enumerate(job.results):
        d = dests[i] if i < len(dests) else None
        if r is None:
            arrays.append(None)
            given.append(None)
            continue
        if d is None:
            arrays.append(_empty(r) if r.kernel else None)
            given.append(None)
            continue
        view = checks.destination(fn, d)
        checks.check_out(fn, view, seen, r)
        seen[r.name] = view
        given.append(view)
        arrays.append(view if r.kernel else None)
    if sum(g is not None for g in given) > 1:
        checks.separate(fn, [(r.name, g) for r, g in zip(job.results, given, strict=True) if r is not None])
    return arrays, given


def _empty(r: Any) -> np.ndarray:
    """A result's array: laid out like the array it takes after (np.empty_like: an F-ordered x gives an
    F-ordered y), or C-ordered where its shape is its own."""
    return np.empty_like(r.like) if r.shape == r.like.shape else np.empty(r.shape, r.dtype)


def _finish(plan: Plan, dests: tuple, given: list, arrays: list, values: dict[int, Any]) -> Any:
    """The computed values into their destinations, write marks, and the results in the caller's kind (or
    the caller's out); for a Dask chunk (`partial`), the results' raw arrays."""
    for i, v in values.items():
        if given[i] is not None and not plan.partial:
            given[i][...] = v
        else:
            arrays[i] = v
    if plan.partial:
        return arrays
    if any(d is not None for d in dests):
        for d in dests:
            if d is not None:
                _arrays.mark_written(d)
        return plan.out if len(dests) == 1 or not isinstance(plan.out, list) else tuple(plan.out)
    like = next(a for a in plan.arrays.values() if a is not None)
    return plan.family.returned(plan, [_arrays.wrap_like(a, like) if isinstance(a, np.ndarray) else a
                                       for a in arrays])


# ---- device arrays -----------------------------------------------------------------------------------


def device_job(plan: Plan, kind: str) -> tuple[Job, str, Any, Any]:
    """(job, dtype name, backend module, kernel) of a plan on device arrays, every array and parameter checked."""
    arrays_in = {n: a for n, a in plan.arrays.items() if a is not None or n not in plan.family.optional}
    checks.device_arrays(plan.fn, arrays_in)
    job = plan.family.device(plan, arrays_in)
    plan.family.check(plan, job.dtype)
    dtype = str(job.dtype).replace("torch.", "")
    mod, kernel = registry.resolve(plan.key, plan.direction, dtype, kind, plan.backend)
    return job, dtype, mod, kernel


def device(plan: Plan, kind: str, dests: tuple) -> Any:
    fn = plan.fn
    job, dtype, mod, kernel = device_job(plan, kind)
    arrays: list[Any] = []
    for i, r in enumerate(job.results):
        d = dests[i] if i < len(dests) else None
        if r is None:
            if d is not None:
                raise TypeError(f"{fn}: out[{i}] must be None: the call has no such result")
            arrays.append(None)
        elif d is None:
            arrays.append(mod.empty_like(r.like) if r.kernel else None)
        else:
            checks.device_arrays(fn, {r.name: d})
            checks.same_as(fn, r.name, d, "the result", r)
            arrays.append(d)
    values = _run(plan, job, mod, kernel, dtype, arrays)
    return _finish(plan, dests, [None] * len(arrays), arrays, values)
