"""The call core: one routine carries out every family's plan, for every array kind.

run(plan): the backend name, masked arrays, the one array kind of the call, then its executor:
- host arrays (NumPy, torch CPU tensors, lists, floats): NumPy views go to a CPU backend's kernel and the
  results come back in the caller's kind;
- device arrays (CUDA, NPU): handed as they are to the backend that owns their kind, which allocates in kind;
- Dask arrays: multiact.dask_arrays runs the plan blockwise, each chunk a plan of its own.
Every check happens before the kernel runs, so bad input never leaves a half-written `out`.  A plain call
whose plan names a cache is remembered there for the hot path (multiact.hot), which makes the same checks.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from . import _arrays, checks, executors, registry
from . import dtypes as _dtypes
from . import quant as Q
from .plan import Plan


def run(plan: Plan) -> Any:
    """Carry out one call."""
    checks.check_backend(plan.fn, plan.backend)
    if plan.dequant is not None:
        return _dequantized(plan)
    if plan.quant is not None:
        return _quantized(plan)
    dests = plan.family.outs(plan)
    if checks.masked(*plan.arrays.values(), *dests):
        return _masked(plan, dests)
    kind = checks.same_kind(plan.fn, {**plan.arrays, **_dest_names(dests)}, plan.family.join_dask)
    if kind == "dask":
        from . import dask_arrays  # only once a Dask array is met (it imports dask)

        return dask_arrays.run(plan, dests)
    if kind != "numpy":
        return executors.device(plan, kind, dests)
    return executors.host(plan, dests)


def _dest_names(dests: tuple) -> dict[str, Any]:
    if len(dests) == 1:
        return {"out": dests[0]}
    return {f"out[{i}]": d for i, d in enumerate(dests)}


# ---- dequantized inputs ----------------------------------------------------------------------------


def _dequantized(plan: Plan) -> Any:
    """A forward on a matmul's int32 output (multiact.dequant's contract): with quant=, a backend's one pass where
    it has one for the case; else the float32 values (Dequant.apply's), then the call as on a float32 x (quant=
    included).  Host arrays and Dask (lazily); device arrays are refused (no device kernels read int32 yet)."""
    from . import dequant as D

    fn, x = plan.fn, plan.arrays["x"]
    given = [n for n, a in plan.arrays.items() if n != "x" and a is not None]
    if plan.direction != "forward" or given:
        raise ValueError(f"{fn}: dequant= reads x alone, as one matmul's int32 output (the one-input form)"
                         + (f"; {given[0]}= cannot come with it" if given else ""))
    if checks.masked(x, plan.out):
        raise TypeError(f"{fn}: dequant= does not take masked arrays; pass np.ma.getdata(x)")
    kind = _arrays.kind_of(x)
    if kind == "dask":
        v = D.dequantize_dask(fn, x, plan.dequant)
    elif kind not in checks.HOST_KINDS:
        raise TypeError(f"{fn}: dequant= runs on host and Dask arrays; x is {_arrays.library_of(x)} (dequantize "
                        "on the device, then call with the float32 values)")
    else:
        xi = D.host_int32(fn, "x", x)
        c = D.check(fn, plan.dequant, xi.shape)
        res = _fused_dequant(plan, xi, c) if plan.quant is not None else None
        if res is not None:
            return Q.as_kind(res, x)
        v = D.dequantize_host(xi, c)
        if kind == "torch":
            v = sys.modules["torch"].from_numpy(v)
    sub = Plan(fn, plan.what, plan.key, plan.direction, plan.p, {**plan.arrays, "x": v}, plan.out, plan.backend,
               plan.family, plan.state)
    sub.quant = plan.quant
    return run(sub)


def _fused_dequant(plan: Plan, xi: np.ndarray, c: Any) -> Any:
    """The backend's one pass (dequantization, activation, amax, codes) where it has one, else None.

    A backend offers it as `dequantized(plan, job, kernel, parts, quant) -> (codes, scales) | None`: `job` is the
    family's job on the int32 x, `kernel` its float32 forward kernel, `parts` the family's jobs on each of the
    Dequant's parts broadcast to x's shape (None where not given: their views line up with x's), and the result
    must be the bits of the passes in _dequantized."""
    fn = plan.fn
    q = Q.check(fn, plan.quant)
    if plan.out is not None:
        raise TypeError(f"{fn}: out= cannot be combined with quant=: the result is (codes, scales), new arrays")
    plan.family.check(plan, np.dtype(np.float32))
    try:
        mod, kernel = registry.resolve(plan.key, plan.direction, "float32", "numpy", plan.backend)
    except registry.BackendError:  # the float32 passes raise the error that names it
        return None
    fused = getattr(mod, "dequantized", None)
    if fused is None:
        return None
    job = plan.family.host(plan, {"x": xi})
    parts = {n: None if a is None else plan.family.host(plan, {"x": a}) for n, a in c.full(xi.shape).items()}
    return fused(plan, job, kernel, parts, q)


# ---- quantized results -----------------------------------------------------------------------------


def _quantized(plan: Plan) -> Any:
    """A call whose result is quantized (multiact.quant's contract): the op computed in float32 on its inputs
    widened exactly to float32 (float16, bfloat16; float32 as it is, float64 in float64), then its values'
    codes and scales; NumPy in, NumPy out, torch CPU tensors in, torch tensors out.  A backward quantizes dx
    (its other results, bias_act's db and dscale, come back as they are, in float32)."""
    fn = plan.fn
    q = Q.check(fn, plan.quant)
    if plan.out is not None:
        raise TypeError(f"{fn}: out= cannot be combined with quant=: the result is (codes, scales), new arrays")
    if checks.masked(*plan.arrays.values()):
        raise TypeError(f"{fn}: quant= does not take masked arrays; pass np.ma.getdata(x)")
    kind = checks.same_kind(fn, plan.arrays, plan.family.join_dask)
    if kind == "dask":
        return _quantized_dask(plan, q)
    if kind != "numpy":
        return _quantized_device(plan, q, kind)
    arrs = checks.host_arrays(fn, plan.arrays, plan.family.optional)
    job = plan.family.host(plan, arrs)
    plan.family.check(plan, job.dtype)
    dtype = checks.dtype_name(job.dtype)
    like = next(a for a in plan.arrays.values() if a is not None)
    res = _fused(plan, job, dtype, q)
    if res is not None:
        return Q.as_kind(res, like)
    wide = {n: _widen(a) for n, a in arrs.items()}
    sub = Plan(fn, plan.what, plan.key, plan.direction, plan.p, {n: wide.get(n) for n in plan.arrays}, None,
               plan.backend, plan.family, plan.state)
    y = executors.host(sub, ())
    if isinstance(y, tuple):  # a backward with sums (bias_act_grad): dx quantized, db and dscale in float32
        return (Q.as_kind(Q.quantize_host(fn, y[0], q), like), *Q.as_kind(y[1:], like))
    return Q.as_kind(Q.quantize_host(fn, y, q), like)


def _quantized_device(plan: Plan, q: Any, kind: str) -> Any:
    """Device arrays (CUDA, NPU): the backend that owns their kind quantizes on the device, through its
    `quantized(plan, job, kernel, dtype, quant)` (the host hook's form on the device job: codes and scales as
    device arrays of the caller's library); a backend without it, or one that returns None (a case it does not
    build), is a TypeError naming quant= and the array kind.  Nothing is copied to the host."""
    fn = plan.fn
    job, dtype, mod, kernel = executors.device_job(plan, kind)
    fused = getattr(mod, "quantized", None)
    res = None if fused is None else fused(plan, job, kernel, dtype, q)
    if res is None:
        what = "has no quantized kernels" if fused is None else f"does not quantize this call ({plan.what} " \
            f"{plan.direction}, {q.dtype} {q.granularity}{'' if q.symmetric else ' with a zero point'})"
        raise TypeError(f"{fn}: quant= on {kind} arrays runs on the device, and backend {mod.NAME!r} {what}; "
                        "copy the float result to the host and use ma.quantize instead")
    return res


def _widen(a: np.ndarray) -> np.ndarray:
    """float16 and bfloat16 values exactly as float32 (float32 and float64 as they are)."""
    return _dtypes.to_float32(a) if _dtypes.is_bf16(a.dtype) else a.astype(np.float32) if a.itemsize < 4 else a


def _quantized_dask(plan: Plan, q: Any) -> Any:
    """Dask arrays: the float32 result's lazy graph, then multiact.dask_quant's codes and scales."""
    from . import dask_quant  # only once a Dask array is met (it imports dask)

    wide = {n: None if a is None else dask_quant.widened(a, _widen) if hasattr(a, "dask") else
            _widen(checks.host_arrays(plan.fn, {n: a}, frozenset())[n]) for n, a in plan.arrays.items()}
    sub = Plan(plan.fn, plan.what, plan.key, plan.direction, plan.p, wide, None, plan.backend, plan.family,
               plan.state)
    y = run(sub)
    if isinstance(y, tuple):  # a backward with sums: dx quantized, the sums as they are
        return (dask_quant.run(plan.fn, y[0], q), *y[1:])
    return dask_quant.run(plan.fn, y, q)


def _fused(plan: Plan, job: Any, dtype: str, q: Any) -> Any:
    """The backend's one pass (the op or its backward, amax, codes) where it has one for this case, else None.

    A backend offers it as `quantized(plan, job, kernel, dtype, quant) -> (codes, scales) | None`: `kernel` is
    its kernel of the plan's direction for the inputs' own dtype (a bfloat16 x is read as bfloat16),
    `job.run(call, arrays)` hands `call` the family's views of the inputs and of `arrays` (the results' arrays),
    and the codes and scales must be the bits of the two passes in _quantized (the tests compare them).  None
    leaves the call to those two passes: the activation on the backend, the quantization by multiact.quant."""
    try:
        mod, kernel = registry.resolve(plan.key, plan.direction, dtype, "numpy", plan.backend)
    except registry.BackendError:  # no kernel for the inputs' own dtype: the float32 passes decide
        return None
    fused = getattr(mod, "quantized", None)
    return None if fused is None else fused(plan, job, kernel, dtype, q)


# ---- masked arrays ---------------------------------------------------------------------------------


def _masked(plan: Plan, dests: tuple) -> Any:
    """Masked arrays, as NumPy's ufuncs treat them: computed on the data, the result masked where any input
    is; a sum (a parameter gradient) adds the unmasked elements only.  A family whose results do not line up
    with its inputs element for element refuses them (its `masked` text says what to do instead)."""
    refusal = getattr(plan.family, "masked", None)
    if refusal:
        raise TypeError(f"{plan.fn}: {refusal}")
    mam = sys.modules["numpy.ma"]
    data = {n: None if a is None else mam.getdata(a) for n, a in plan.arrays.items()}
    out = None if plan.out is None else mam.getdata(plan.out)
    sub = Plan(plan.fn, plan.what, plan.key, plan.direction, plan.p, data, out, plan.backend, plan.family,
               plan.state)
    # one dtype and shape before the masks meet
    job = plan.family.host(sub, checks.host_arrays(plan.fn, data, plan.family.optional))
    mask = _union_mask(mam, plan.arrays)
    if not any(r is not None and r.kernel for r in job.results):  # a sum: the masked elements add nothing
        if mask is not mam.nomask:
            sub.arrays = {n: None if a is None else np.where(mask, 0, a) for n, a in data.items()}
        return executors.host(sub, ())
    res = executors.host(sub, () if out is None else (out,))
    if plan.out is None:
        return mam.MaskedArray(res, mask=mask)
    if isinstance(plan.out, mam.MaskedArray):
        plan.out.mask = mask
    return plan.out


def _union_mask(mam: Any, named: dict) -> Any:
    """The union of the inputs' masks (after the call checked that their shapes agree)."""
    mask = mam.nomask
    for a in named.values():
        m = mam.getmask(a)
        if m is not mam.nomask:
            mask = np.logical_or(mask, m) if mask is not mam.nomask else np.array(m, copy=True)
    return mask
