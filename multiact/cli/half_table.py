"""`multiact check --exhaustive --dtype float16`: every float16 input of every native kernel, as a table.

The shared suite already runs all 65,536 float16 inputs against its tolerance; this states the measured
error per op the way the float32 table does (README "Accuracy"), with accuracy.py's rules in float16's
units: error in float16 ulps of the float64 reference where the result is normal (outputs below 2^-14
apart, in units of 2^-24); the op's declared cancellation fwd_atol eps16 |x|; a backward's floor of
2 eps16 |dy| (|g| + |x g'|) only where the terms of f' = g + x g' cancel around a zero crossing
(`consistency.cancel_terms`); a y-form's 2 eps16 |dy y|; NaN, +-inf and overflow exactly.  The kernels
compute in float32 and round once, so a result is within half an ulp plus the float32 error, or one ulp
where that error straddles a rounding boundary."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import consistency as C
from ..optable import OPS
from . import accuracy as A

EPS16 = 2.0 ** -10
MIN16 = 2.0 ** -14  # smallest normal float16
DY16 = (np.float16(1.0), np.float16(A.DY2))


def _judge(x: np.ndarray, got: np.ndarray, ref: np.ndarray, floor: np.ndarray) -> dict[str, Any]:
    """Max error in float16 ulps (normal results), worst x, count over 1 ulp, subnormal max (2^-24 units),
    special misses."""
    g = got.astype(np.float64)
    with np.errstate(all="ignore"):
        r16 = ref.astype(np.float16).astype(np.float64)
        special = ~np.isfinite(r16)
        miss = int((special & ~((g == r16) | (np.isnan(g) & np.isnan(r16)))).sum())
        fin = ~special
        excess = np.where(np.isfinite(g), np.maximum(np.abs(g - ref) - floor, 0.0), np.inf)
        _, e = np.frexp(np.where(fin, np.abs(ref), 1.0))
        err = excess / np.ldexp(1.0, e - 11)  # float16's spacing at |ref|: 2^(floor(log2 |ref|) - 10)
    normal = fin & (np.abs(ref) >= MIN16)
    sub = fin & ~normal
    err = np.where(normal, err, 0.0)
    i = int(np.argmax(err))
    return {"max_ulp": float(err[i]), "worst_x": float(x[i]), "over_1": int((err > 1.0).sum()),
            "subnormal_max": float(np.max(np.where(sub, excess, 0.0)) / 2.0 ** -24), "special_miss": miss}


def rows(ops: Sequence[str] | None, isas: Sequence[str]) -> list[dict[str, Any]]:
    """Every (op, case, direction, dy, ISA) of accuracy.cases on all 65,536 float16 inputs (prelu: one weight)."""
    from ..backend import native_backend, numba_backend

    x16 = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    out = []
    for op, params in A.cases(ops):
        spec = OPS[op]
        array = spec.defn.array_param  # prelu's weight: its parameters as given
        p = params if array else spec.validate(params)
        p_ref = params if array else C._rounded(spec, params, np.float32)  # the kernels' float32 values
        key = spec.kernel_key(p)
        case = C.case_id({a: v for a, v in params.items() if a != array})
        for direction in A.directions(spec):
            ref_k = numba_backend.kernel(key, direction, "float64")
            xs, y16 = x16, None
            if direction == "backward_y":  # the y-form takes outputs: the forward's finite ones
                yf = np.empty(x16.size)
                numba_backend.kernel(key, "forward", "float64")(x16.astype(np.float64), yf, p_ref)
                with np.errstate(all="ignore"):
                    y16 = yf.astype(np.float16)
                keep = np.isfinite(y16)
                xs, y16 = x16[keep], y16[keep]
            ax = np.abs(xs.astype(np.float64))
            ax = np.where(np.isfinite(ax), ax, 0.0)  # no floor at +-inf, NaN (0 * inf would be NaN)
            for dyv in [None] if direction == "forward" else DY16:
                ins16 = (xs,) if dyv is None else (np.full(xs.size, dyv), xs if y16 is None else y16)
                ref = np.empty(xs.size)
                ref_k(*(a.astype(np.float64) for a in ins16), ref, p_ref)
                if dyv is None:
                    floor = spec.tol.fwd_atol * EPS16 * ax
                else:
                    if y16 is None:
                        floor = A.FLOOR_ATOL * EPS16 * abs(float(dyv)) * C.cancel_terms(spec, params, np.float32, xs)
                    else:
                        floor = 2 * EPS16 * np.abs(float(dyv) * y16.astype(np.float64))
                tag = direction if dyv is None else f"{direction} dy={float(dyv):.4g}"
                for isa in isas:
                    got = np.empty(xs.size, np.float16)
                    native_backend.kernel(key, direction, "float16", isa=isa)(*ins16, got, p)
                    out.append({"op": op, "case": case, "direction": tag, "isa": isa, "points": int(xs.size),
                                **_judge(xs, got, ref, floor)})
    return out


def render(table: Sequence[dict[str, Any]]) -> str:
    """Per op (and kernel key) the largest error in float16 ulps over every ISA, dy and input."""
    from ._report import worst_table

    return worst_table(table, lambda r: (r["op"], r["case"], r["direction"], r["max_ulp"]),
                       lambda r: f"{r['max_ulp']:.3g}" + (f" ({r['over_1']} over 1)" if r["over_1"] else "")
                       + (f", {r['special_miss']} specials missed" if r["special_miss"] else ""))
