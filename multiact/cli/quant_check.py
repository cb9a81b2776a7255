"""`multiact check --quant`: quantized outputs (multiact.quant's contract) against the float64 reference.

For every op and parameter case, host backend, input dtype, granularity and target dtype, on every one of the
65,536 bfloat16 or float16 inputs (float32: every 65,537th bit pattern) as x, laid out as rows of 128:
- fused: `ma.<op>(x, quant=Q)` is bit for bit `ma.quantize(ma.<op>(x widened to float32), Q)`;
- scales: each group's scale against the one the float64 result gives (amax / qmax rounded once to float32),
  in float32 ulps; it may differ by the op's own float32 error at the group's largest element (the scale is
  derived from the float32 activation) and one rounding more; a group the reference makes non-finite has a
  non-finite scale, an all-zero group the scale 1;
- codes: each code against the float64 result divided by the kernel's own scale, rounded to nearest even
  into the target and saturated: equal, or one code from it.  A code one away that a correctly rounded float32
  activation gives too (the contract quantizes float32 values, and divides in float32) is the float32
  rounding's (counted apart); the others are the activation's own error straddling a rounding boundary
  (counted; a case fails beyond 0.5% of its codes, or at two codes or more).
Results below float32's smallest normal number are not judged (the shared suite allows them an error of up to
that number: flush-to-zero SIMD, subnormal intermediates), nor scales derived from such an amax.
Symmetric quantization (the zero-point form shares its scale and rounding with it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import ml_dtypes
import numpy as np

from .. import consistency as C
from .. import quant as Q
from .. import vocab
from ..optable import OPS, REQUIRED
from ._report import fmt, table

QUANTS = (
    Q.Quant("float8_e4m3fn", "token"), Q.Quant("float8_e4m3fn", "group", group_size=128),
    Q.Quant("float8_e5m2", "token"), Q.Quant("float8_e5m2", "group", group_size=128),
    Q.Quant("int8", "token"), Q.Quant("int8", "group", group_size=128),
    Q.Quant("float8_e4m3fn", "mx"),
)
DTYPES = tuple(n for n, d in vocab.DTYPES.items() if d.compute == "float32")  # what quant= computes in float32
ROW = 128
ONE_CODE_SHARE = 0.005


def inputs(dtype: str) -> np.ndarray:
    """Every bit pattern of a 16-bit float (float32: every 65,537th), as rows of 128."""
    if dtype == "float32":
        bits = (np.arange(1 << 16, dtype=np.uint64) * 65537).astype(np.uint32)
        return bits.view(np.float32).reshape(-1, ROW)
    np_dtype = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    return np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np_dtype).reshape(-1, ROW)


def _grid(name: str) -> tuple[np.ndarray, np.ndarray]:
    bits = np.arange(128, dtype=np.uint8)
    vals = bits.view(getattr(ml_dtypes, name)).astype(np.float64)
    ok = np.isfinite(vals)
    return vals[ok], bits[ok]


def round_codes(r: np.ndarray, dtype: str) -> np.ndarray:
    """float64 quotients to the target's codes as ordinals (int8: the value; float8: +-the code's magnitude
    bits, so that neighbouring codes differ by one), nearest even, saturated; NaN gives a NaN-free ordinal of
    0 (masked by the caller)."""
    if dtype == "int8":
        return np.clip(np.rint(np.nan_to_num(r)), -127, 127).astype(np.int64)
    vals, bits = _grid(dtype)
    a = np.minimum(np.abs(np.nan_to_num(r)), vals[-1])
    i = np.clip(np.searchsorted(vals, a), 1, len(vals) - 1)
    lo, hi = vals[i - 1], vals[i]
    pick_lo = (a - lo < hi - a) | ((a - lo == hi - a) & (bits[i - 1] % 2 == 0))
    mag = np.where(a == vals[0], 0, np.where(pick_lo, bits[i - 1], bits[i])).astype(np.int64)
    return np.where(np.signbit(r), -mag, mag)


def ordinals(codes: np.ndarray, dtype: str) -> np.ndarray:
    """The kernel's codes as ordinals (round_codes' numbering)."""
    if dtype == "int8":
        return codes.astype(np.int64)
    b = codes.view(np.uint8).astype(np.int64)
    return np.where(b & 0x80, -(b & 0x7F), b & 0x7F)


def _scales64(y: np.ndarray, q: Q.Quant) -> np.ndarray:
    """The reference scale per group, from the float64 result's amax rounded once to float32 (the value the
    contract derives the scale from, less the activation's error): amax / qmax rounded once, at least 2^-149,
    1 for a group whose amax is 0 in float32; MX: the E8M0 power of two by the rule.  NaN where the group
    holds a non-finite value."""
    g = y.reshape(*y.shape[:-1], -1, q.block or y.shape[-1])
    with np.errstate(all="ignore"):
        amax = np.max(np.abs(g), axis=-1)
        a32 = amax.astype(np.float32)
        if q.granularity == "mx":
            e = (np.ceil(np.log2((a32 / np.float32(q.qmax)).astype(np.float64))) if q.rule == "ceil"
                 else np.floor(np.log2(a32.astype(np.float64))) - Q.EMAX[q.dtype])
            s = np.exp2(np.clip(e, -127, 127))
        else:
            s = np.maximum((amax / q.qmax).astype(np.float32), Q.TINY).astype(np.float64)
        s = np.where(a32 == 0, 1.0, s)
    return np.where(np.isfinite(a32) & ~np.isnan(g).any(axis=-1), s, np.nan)  # beyond float32: inf there


def _amax(y: np.ndarray, q: Q.Quant) -> np.ndarray:
    g = y.reshape(*y.shape[:-1], -1, q.block or y.shape[-1])
    with np.errstate(invalid="ignore"):
        return np.max(np.abs(g), axis=-1)


def _ulps(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """|a - b| in float32 ulps of b (finite pairs)."""
    return np.abs(a.astype(np.float64) - b) / np.spacing(np.abs(b).astype(np.float32)).astype(np.float64)


def _call_params(spec: Any, params: dict, x: np.ndarray) -> dict:
    """params with an array parameter (prelu's weight) made for x, once per case."""
    p = dict(params)
    if spec.defn.array_param:
        p[spec.defn.array_param] = C.prelu_weight(x, p[spec.defn.array_param], p.get("axis", 1))
    return p


def one_case(backend: str, op: str, params: dict, dtype: str, q: Q.Quant, x: np.ndarray,
             y64: np.ndarray, p: dict | None = None) -> dict[str, Any]:
    """One row of the report (see the module's docstring); `p`: the call's parameters where the caller built
    them (an array parameter's weight made for x), else built here from `params`."""
    import multiact as ma

    p = _call_params(OPS[op], params, x) if p is None else p
    array = OPS[op].defn.array_param
    row = {"backend": backend, "op": op, "case": ",".join(f"{k}={v}" for k, v in params.items()), "dtype": dtype,
           "quant": _label(q), "n": int(x.size)}
    try:
        codes, scale = ma.forward(op, x, quant=q, backend=backend, **p)[:2]
        x32 = x.astype(np.float32)
        p32 = {**p, array: p[array].astype(np.float32)} if array else p
        wc, ws = ma.quantize(ma.forward(op, x32, backend=backend, **p32), q)[:2]
    except Exception as e:  # a backend's failure is a row of the report, not the end of the run
        return {**row, "status": "error", "error": f"{type(e).__name__}: {e}", "fused_diff": 0, "scale_ulp": None,
                "rounding": 0, "one_code": 0, "bad": 0}
    fused = int(np.count_nonzero(codes.view(np.uint8) != wc.view(np.uint8))
                + np.count_nonzero(np.asarray(scale).view(np.uint8) != np.asarray(ws).view(np.uint8)))
    s_ref = _scales64(y64, q)
    s_got = np.asarray(scale).astype(np.float64)
    fin = np.isfinite(s_ref)
    # below float32's smallest normal an activation may be off by up to that number (the shared suite's rule:
    # flush-to-zero SIMD, subnormal intermediates): such results, and scales from such an amax, are not judged
    normal = np.abs(y64) >= np.finfo(np.float32).tiny
    judged = fin & (_amax(y64, q) >= np.finfo(np.float32).tiny)
    bad_special = int(np.count_nonzero(np.isfinite(s_got[~fin])))
    if q.granularity == "mx":
        scale_ulp = float(np.max(np.abs(np.log2(s_got[judged] / s_ref[judged])), initial=0.0))  # powers of two
    else:
        scale_ulp = float(np.max(_ulps(s_got[judged], s_ref[judged]), initial=0.0))
    block = q.block or x.shape[-1]
    s_el = np.repeat(s_got, block, axis=-1).reshape(y64.shape)
    ok = np.repeat(fin, block, axis=-1).reshape(y64.shape) & np.isfinite(y64.astype(np.float32)) & (normal | (y64 == 0))
    with np.errstate(all="ignore"):
        want = round_codes(np.where(ok, y64 / s_el, 0.0), q.dtype)
        # what a correctly rounded float32 activation gives under the contract (its quotient in float32)
        s32 = s_el.astype(np.float32)
        want32 = round_codes(np.where(ok, y64.astype(np.float32) / s32, 0.0).astype(np.float64), q.dtype)
    got = ordinals(codes, q.dtype)
    diff = np.abs(got - want)[ok]
    rounding = int(np.count_nonzero((diff == 1) & (got == want32)[ok]))  # the float32 rounding's own
    one, bad = int(np.count_nonzero(diff == 1)) - rounding, int(np.count_nonzero(diff > 1))
    failed = fused or bad_special or bad or one > ONE_CODE_SHARE * max(int(ok.sum()), 1)
    return {**row, "status": "FAIL" if failed else "pass", "error": None, "fused_diff": fused,
            "scale_ulp": scale_ulp, "rounding": rounding, "one_code": one, "bad": bad + bad_special}


def _label(q: Q.Quant) -> str:
    return f"{q.dtype} {q.granularity}" + (f" {q.group_size}" if q.group_size else "") + (
        f" {q.rule}" if q.granularity == "mx" else "")


def run(backends: Sequence[str] | None, ops: Sequence[str] | None, dtypes: Sequence[str] | None,
        progress: Callable | None = None) -> dict[str, Any]:
    from .selfcheck import choose_backends

    for op in ops or ():
        if op not in OPS:
            raise ValueError(f"unknown op {op!r}; valid ops: {', '.join(OPS)}")
    dts = list(dtypes) if dtypes else list(DTYPES)
    for d in dts:
        if d not in DTYPES:
            raise ValueError(f"--quant checks {', '.join(DTYPES)}; got {d!r}")
    chosen, skipped = choose_backends(backends)
    chosen = [b for b, kind in chosen if kind == "numpy"]
    jobs = [(op, params, d) for op in (ops or OPS) for params in C.param_cases(OPS[op]) for d in dts]
    rows = []
    for op, params, d in (progress(jobs, len(jobs)) if progress else jobs):
        spec = OPS[op]
        x = inputs(d)
        p = _call_params(spec, {**{k: v for k, v in spec.defaults().items() if v is not REQUIRED}, **params}, x)
        with np.errstate(all="ignore"):
            y64 = np.asarray(C.reference(spec, "forward", p, np.float32, x), dtype=np.float64)
        with np.errstate(all="ignore"):  # NaN and inf inputs are the point
            rows += [one_case(b, op, params, d, q, x, y64, p) for b in chosen for q in QUANTS]
    return {"rows": rows, "backends": chosen, "skipped_backends": skipped,
            "passed": bool(chosen) and all(r["status"] == "pass" for r in rows)}


def render(report: dict[str, Any], full: bool = False) -> str:
    lines = [f"{name}: skipped ({why})" for name, why in report["skipped_backends"].items()]
    rows = report["rows"]
    if full:
        out = [[r["backend"], f"{r['op']}[{r['case']}]", r["dtype"], r["quant"], r["fused_diff"],
                fmt(r["scale_ulp"], 2), r.get("rounding", 0), r["one_code"], r["bad"], r["status"]] for r in rows]
    else:
        groups: dict[tuple, list] = {}
        for r in rows:
            groups.setdefault((r["backend"], r["op"]), []).append(r)
        out = []
        for (b, op), rs in groups.items():
            worst = max((100 * r["one_code"] / r["n"] for r in rs), default=0.0)
            failed = sum(r["status"] != "pass" for r in rs)
            out.append([b, op, len(rs), sum(r["fused_diff"] for r in rs),
                        fmt(max((r["scale_ulp"] or 0.0) for r in rs), 2), fmt(worst, 3),
                        sum(r["bad"] for r in rs), f"FAIL ({failed})" if failed else "ok"])
    head = (["backend", "op", "dtype", "quant", "fused != 2-pass", "scale ulp", "f32 rounding", "1 code", "bad",
             "result"] if full
            else ["backend", "op", "cases", "fused != 2-pass", "worst scale ulp", "worst 1-code %", "bad", "result"])
    lines.append(table(out, head))
    lines.append("fused != 2-pass: codes and scales differing from ma.quantize of the float32 result (must be 0); "
                 "scale ulp: float32 ulps from the float64 result's scale (MX: powers of two); 1 code: codes one "
                 "from the float64 quotient's that a correctly rounded float32 activation would not give (at most "
                 f"{100 * ONE_CODE_SHARE:g}% per case; --full also counts the float32 rounding's own); bad: two "
                 "codes or more, or a finite scale where the reference's is not.")
    failed = [r for r in rows if r["status"] != "pass"]
    for r in failed[:20]:
        lines.append(f"- {r['backend']} {r['op']}[{r['case']}] {r['dtype']} {r['quant']}: {r['status']} "
                     f"{r['error'] or ''} fused_diff={r['fused_diff']} one_code={r['one_code']} bad={r['bad']}")
    lines.append(f"quant {'PASSED' if report['passed'] else 'FAILED'}: {len(rows) - len(failed)} of {len(rows)} "
                 f"cases on {', '.join(report['backends'])}")
    return "\n".join(lines)
