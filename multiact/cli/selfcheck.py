"""`multiact check`: the shared consistency suite, run on this machine, over every backend it has.

Each (op, parameter case, direction, dtype) is run on every chosen backend with
the standard inputs of `multiact.consistency` (random values, a wide sweep,
NaN, +-inf, subnormals, +-max, each kink and its neighbours) and judged against
the float64 reference with the op's tolerance.  The backends' results are also
compared with each other (ONNX Runtime among them where its backend is
available): the largest difference in ULP between two backends says how far
apart a user's results can be when the choice of backend changes.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from .. import consistency as C
from .. import registry, vocab
from ..optable import FLOAT_DTYPES, OPS, Tolerance


@dataclass
class CheckRow:
    """One backend on one (op, params, direction, dtype)."""

    backend: str
    op: str
    case: str
    direction: str
    dtype: str
    status: str  # "pass" | "FAIL" | "error" | "unsupported"
    max_ulp: float = 0.0
    max_abs: float = 0.0
    tol_used: float | None = None  # worst error / tolerance: <= 1 passes (None: not run)
    n_bad: int = 0
    bad_kinds: list[str] = field(default_factory=list)  # NaN, +inf, subnormal, overflow, kink, ...
    bad: list[tuple[float, float, float]] = field(default_factory=list)  # (x, got, want)
    vs: dict[str, float] = field(default_factory=dict)  # other backend -> err/tol taking its result as the reference
    vs_ulp: dict[str, float] = field(default_factory=dict)  # other backend -> max ulp between the two
    error: str = ""

    @property
    def failed(self) -> bool:
        return self.status in ("FAIL", "error")


def _movers(kind: str) -> tuple[Callable, Callable] | None:
    """(to_kind, from_kind) for a device kind, from whichever library can do it here; None if none can."""
    if kind == "numpy":
        return (lambda a: a), (lambda a: np.asarray(a))
    if kind == "cuda":
        try:
            from numba import cuda

            if cuda.is_available():
                return cuda.to_device, (lambda a: a.copy_to_host() if hasattr(a, "copy_to_host") else np.asarray(a))
        except Exception:
            pass
        try:
            import cupy

            return cupy.asarray, cupy.asnumpy
        except Exception:
            return None
    if kind == "npu":
        try:
            import torch
            import torch_npu  # noqa: F401

            return (lambda a: torch.from_numpy(a).to("npu")), (lambda a: a.cpu().numpy())
        except Exception:
            return None
    return None


def choose_backends(names: Sequence[str] | None) -> tuple[list[tuple[str, str]], dict[str, str]]:
    """([(backend, array kind)] to check, {backend: why it is not checked})."""
    chosen, skipped = [], {}
    for name in names or registry.BACKEND_NAMES:
        registry.check_name(name)
        ok, why = registry.availability(name)
        if not ok:
            skipped[name] = f"not available: {why}"
            continue
        kinds = registry.module(name).KINDS
        kind = "numpy" if "numpy" in kinds else next((k for k in kinds if _movers(k)), None)
        if kind is None:
            skipped[name] = f"runs on {', '.join(kinds)} arrays and no installed library can make them here"
            continue
        chosen.append((name, kind))
    return chosen, skipped


def _classify(x: float, got: float, want: float, dtype: np.dtype, kinks: Sequence[float]) -> str:
    """Which special value a failing input is."""
    fi = np.finfo(dtype)
    if np.isnan(x):
        return "NaN"
    if np.isinf(x):
        return "+inf" if x > 0 else "-inf"
    if x == 0:
        return "zero"
    if abs(x) < float(fi.tiny):
        return "subnormal"
    if abs(x) >= float(fi.max) / 2 or (np.isinf(got) != np.isinf(want)) or abs(x) >= 1000:
        return "overflow"
    xd = dtype.type(x)
    for k in kinks:
        kd = dtype.type(k)
        if xd in (kd, np.nextafter(kd, dtype.type(np.inf)), np.nextafter(kd, dtype.type(-np.inf))):
            return "kink"
    return "ordinary"


def _special_masks(v: np.ndarray, dtype: np.dtype, kinks: Sequence[float]) -> dict[str, np.ndarray]:
    """Where the special inputs sit in a sample."""
    fi = np.finfo(dtype)
    a = np.abs(v)
    with np.errstate(invalid="ignore"):
        masks = {
            "NaN": np.isnan(v), "+inf": v == np.inf, "-inf": v == -np.inf, "zero": v == 0,
            "subnormal": (a > 0) & (a < float(fi.tiny)), "overflow": np.isfinite(v) & (a >= 1000),
        }
    near = np.zeros(v.shape, bool)
    for k in kinks:
        kd = dtype.type(k)
        for t in (kd, np.nextafter(kd, dtype.type(np.inf)), np.nextafter(kd, dtype.type(-np.inf))):
            near |= v == t
    masks["kink"] = near
    return masks


def _prepared(spec, params, direction, dtype, inputs):
    """(ref, x the verdict is keyed on, scale, params for compare) from the inputs run_case sent."""
    array = spec.defn.array_param
    if array:  # as run_case builds it: a weight along axis 1 of the (n, 4) input
        w = C.prelu_weight(inputs[-1], params[array])
        params = {array: w.reshape(1, -1) if w.size > 1 else w.reshape(1, 1), "axis": 1}
    if direction == "forward":
        (x,) = inputs
        return np.asarray(C.reference(spec, direction, params, dtype, x)), x, None, params
    dy, x = inputs
    ref = np.asarray(C.reference(spec, direction, params, dtype, dy, x))
    if direction == "backward":
        return ref, x, dy, params
    return ref, x, dy.astype(np.float64) * x, None  # backward_y: keyed on y, scale dy * y


def _judge_subsets(spec, params, direction, dtype, inputs, got, kinks) -> dict[str, C.Verdict]:
    """Per special category: the shared compare() on just those elements (a Verdict lists only the first few)."""
    ref, where, scale, cparams = _prepared(spec, params, direction, dtype, inputs)
    ref = ref.astype(np.float64).reshape(-1)
    flat = where.reshape(-1)
    sc = None if scale is None else np.asarray(scale).reshape(-1)
    out = {}
    for name, m in _special_masks(flat, dtype, kinks).items():
        if m.any():
            v = C.compare(got.reshape(-1)[m], ref[m], flat[m], spec, direction,
                          scale=None if sc is None else sc[m], params=cparams)
            if not v.passed:
                out[name] = v
    return out


def _scaled(tol: Tolerance, k: float) -> Tolerance:
    cond = None if tol.cond is None else (lambda x, p, _c=tol.cond: _c(x, p) * k)
    return replace(tol, ulp16=tol.ulp16 * k, ulp32=tol.ulp32 * k, ulp64=tol.ulp64 * k, fwd_atol=tol.fwd_atol * k,
                   bwd_atol=tol.bwd_atol * k, y_atol=tol.y_atol * k, cond=cond)


def tolerance_used(spec, params, direction, dtype, inputs, got, ref: np.ndarray | None = None) -> float:
    """The worst element's error as a fraction of the op's tolerance (1 = at the limit; inf = NaN/inf misplaced).

    Against the float64 reference, or against `ref` (another backend's result) when given.  Found by
    bisection on a scaled tolerance with the shared compare(), so it is exactly the suite's rule.
    """
    ref64, where, scale, cparams = _prepared(spec, params, direction, dtype, inputs)
    if ref is not None:
        ref64 = ref.astype(np.float64)

    def ok(k: float) -> bool:
        return C.compare(got, ref64, where, replace(spec, tol=_scaled(spec.tol, k)), direction, scale=scale,
                         params=cparams).passed

    if ok(1e-12):  # (not 0: spacing(max) is inf, and 0 * inf would fail an exact result)
        return 0.0
    if not ok(1e9):
        return float("inf")
    hi = 1.0
    while not ok(hi):
        hi *= 16
    while hi > 1e-6 and ok(hi / 16):
        hi /= 16
    lo = hi / 16
    for _ in range(14):  # about 3 significant digits
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if ok(mid) else (mid, hi)
    return hi


def ulp_between(a: np.ndarray, b: np.ndarray) -> float:
    """Largest difference in ULP of their dtype between two results (NaN/inf placement must agree)."""
    a64, b64 = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    if a64.shape != b64.shape:
        return float("inf")
    nan_a, nan_b = np.isnan(a64), np.isnan(b64)
    if (nan_a != nan_b).any():
        return float("inf")
    ok = ~nan_a & (a64 != b64)
    if not ok.any():
        return 0.0
    a64, b64 = a64[ok], b64[ok]
    if (np.isinf(a64) | np.isinf(b64)).any():
        return float("inf")
    tiny = float(np.finfo(a.dtype).tiny)
    big = np.maximum(np.abs(a64), np.abs(b64))
    keep = big >= tiny  # both below the smallest normal: flush-to-zero is tolerated
    if not keep.any():
        return 0.0
    spacing = np.spacing(big[keep].astype(a.dtype)).astype(np.float64)
    return float(np.max(np.abs(a64[keep] - b64[keep]) / spacing))


def plan(ops: Sequence[str] | None, dtypes: Sequence[str] | None) -> list[tuple[str, dict, str, str]]:
    """Every (op, params, direction, dtype) to check."""
    out = []
    for op in ops or OPS:
        spec = OPS[op]
        for params in C.param_cases(spec):
            for direction in C.directions(spec, params):
                for dt in dtypes or FLOAT_DTYPES:
                    out.append((op, params, direction, dt))
    return out


def run(
    backends: Sequence[str] | None = None,
    ops: Sequence[str] | None = None,
    dtypes: Sequence[str] | None = None,
    progress: Callable | None = None,
) -> dict[str, Any]:
    """Run the check; returns {"rows": [CheckRow], "skipped_backends": {...}, "passed": bool}."""
    for op in ops or ():
        if op not in OPS:
            raise ValueError(f"unknown op {op!r}; valid ops: {', '.join(OPS)}")
    dtypes = vocab.dtypes(dtypes) if dtypes else None  # any spelling; ValueError naming the valid dtypes
    for dt in dtypes or ():
        if dt not in FLOAT_DTYPES:  # bfloat16: every one of its inputs, by run_bf16 (`multiact check` runs both)
            raise ValueError(f"dtype {dt!r} is checked over every input by run_bf16; this suite runs "
                             f"{', '.join(FLOAT_DTYPES)}")
    chosen, skipped = choose_backends(backends)
    cases = plan(ops, dtypes)
    rows: list[CheckRow] = []
    items = progress(cases, len(cases)) if progress else cases
    with np.errstate(all="ignore"):
        for op, params, direction, dt in items:
            rows += _one_case(chosen, op, params, direction, dt)
    return {
        "rows": rows,
        "backends": [b for b, _ in chosen],
        "skipped_backends": skipped,
        "passed": bool(chosen) and not any(r.failed for r in rows),
    }


def _one_case(chosen, op, params, direction, dt) -> list[CheckRow]:
    spec = OPS[op]
    case = C.case_id(params)
    made: list[CheckRow] = []
    results: dict[str, tuple[np.ndarray, list[np.ndarray]]] = {}
    kinks = spec.kinks(C._rounded(spec, params, dt)) if not spec.defn.array_param else (0.0,)
    for name, kind in chosen:
        row = CheckRow(name, op, case, direction, dt, "pass")
        made.append(row)
        mod = registry.module(name)
        try:
            supported = mod.supports(op, direction, dt)
        except Exception as e:
            supported, row.error = False, f"supports() raised {type(e).__name__}: {e}"
        if not supported:
            row.status = "error" if row.error else "unsupported"
            continue
        to_kind, from_kind = _movers(kind)
        captured: list[np.ndarray] = []
        inputs: list[np.ndarray] = []

        def keep(a, _from=from_kind, _cap=captured):
            _cap.append(np.asarray(_from(a)))
            return _cap[-1]

        def send(a, _to=to_kind, _inp=inputs):
            _inp.append(a)
            return _to(a)

        try:
            v = C.run_case(name, op, direction, dt, params, to_kind=send, from_kind=keep)
        except Exception as e:
            row.status, row.error = "error", f"{type(e).__name__}: {e}"
            continue
        if captured:
            results[name] = (captured[-1], inputs)
        row.max_ulp, row.max_abs, row.n_bad = v.max_ulp, v.max_abs, v.n_bad
        if captured:
            row.tol_used = tolerance_used(spec, params, direction, np.dtype(dt), inputs, captured[-1])
        row.bad = [(float(x), float(g), float(w)) for x, g, w in v.bad[:8]]
        if not v.passed:
            row.status = "FAIL"
            dtype = np.dtype(dt)
            row.bad_kinds = sorted({_classify(x, g, w, dtype, kinks) for x, g, w in v.bad})
            if captured:  # every failing special value, with one example each
                special = _judge_subsets(spec, params, direction, dtype, inputs, captured[-1], kinks)
                row.bad_kinds = sorted(set(row.bad_kinds) | set(special))
                examples = [v.bad[0] for v in special.values() if v.bad]
                row.bad = (examples + [b for b in row.bad if b not in examples])[:8]
    by_name = {r.backend: r for r in made}
    for a, b in itertools.permutations(sorted(results), 2):
        (got_a, inputs), (got_b, _) = results[a], results[b]
        by_name[a].vs[b] = tolerance_used(spec, params, direction, np.dtype(dt), inputs, got_a, ref=got_b)
        by_name[a].vs_ulp[b] = ulp_between(got_a, got_b)
    return made


def as_json(report: dict[str, Any]) -> dict[str, Any]:
    """The report as plain JSON data (inf as the string "inf")."""

    def clean(v: Any) -> Any:
        if isinstance(v, float) and not np.isfinite(v):
            return str(v)
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [clean(x) for x in v]
        return v

    rows = [clean(asdict(r)) for r in report["rows"]]
    failed = [r for r in rows if r["status"] in ("FAIL", "error")]
    return {
        "passed": report["passed"],
        "backends": report["backends"],
        "skipped_backends": report["skipped_backends"],
        "counts": {s: sum(r["status"] == s for r in rows) for s in ("pass", "FAIL", "error", "unsupported")},
        "failures": failed,
        "rows": rows,
    }


# ---- bfloat16: every one of the 65,536 inputs ---------------------------------------------------------


def run_bf16(backends: Sequence[str] | None = None, ops: Sequence[str] | None = None,
             progress: Callable | None = None, sample: np.ndarray | None = None) -> dict[str, Any]:
    """The exhaustive bfloat16 check (`consistency.run_bf16_case`) on the host backends that claim bfloat16:
    {"rows": [dict], "backends": [...], "skipped_backends": {...}, "passed": bool}.  A backend that claims no
    bfloat16 kernel for a case is "unsupported" there (the registry falls through to the next one)."""
    for op in ops or ():
        if op not in OPS:
            raise ValueError(f"unknown op {op!r}; valid ops: {', '.join(OPS)}")
    chosen, skipped = choose_backends(backends)
    host = [b for b, kind in chosen if kind == "numpy"]
    for b, kind in chosen:
        if kind != "numpy":
            skipped[b] = f"the bfloat16 check runs on host backends; {b} runs on {kind} arrays"
    cases = [c for c in C.bf16_cases() if not ops or c[0] in ops]
    rows: list[dict[str, Any]] = []
    refs: dict = {}
    items = progress(cases, len(cases)) if progress else cases
    for op, params, direction in items:
        for b in host:
            row = {"backend": b, "op": op, "case": C.case_id(params), "direction": direction, "n": 0,
                   "one_ulp": 0, "n_bad": 0, "allowed": OPS[op].tol.bf16_one_ulp, "status": "unsupported",
                   "bad": [], "error": ""}
            rows.append(row)
            if not registry.module(b).supports(C.bf16_key(op, params), direction, "bfloat16"):
                continue
            try:
                v = C.run_bf16_case(b, op, params, direction, x=sample, cache=refs)
            except Exception as e:
                row.update(status="error", error=f"{type(e).__name__}: {e}")
                continue
            row.update(n=v.n, one_ulp=v.one_ulp, n_bad=v.n_bad, status="pass" if v.passed else "FAIL",
                       bad=[f"x={x!r}: got 0x{g:04x}, want 0x{w:04x}" for x, g, w in v.bad[:8]])
    return {"rows": rows, "backends": host, "skipped_backends": skipped,
            "passed": bool(host) and not any(r["status"] in ("FAIL", "error") for r in rows)}
