"""The consistency check every backend is held to: inputs, the float64 reference, the verdict.

Shared by the test suite and `multiact check`, so a user's machine runs exactly
what CI runs.  A result passes when, element by element,
NaN sits where the reference has NaN, +-inf where the reference (rounded to
the dtype) is +-inf, and otherwise |got - ref| <= ulp * spacing(ref) +
atol * eps * scale, with the op's Tolerance (scale = |x| for a forward; for a
backward |dy| (|g| + |x g'|) where the two terms of f' = g + x g' cancel around
a zero crossing of f', and 0 elsewhere: `crossings`).  Float parameters are rounded to the compute precision
first, since that is what every kernel compares against.  Results below the
smallest normal number may be off by up to that number (flush-to-zero SIMD and
subnormal intermediates).  Where x = +-0 (or the scale, dy, is) a zero result
must carry the reference's sign (PyTorch's choice, see `multiact.reference`);
the inputs start with `zero_pairs()` for that.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import dtypes as _dtypes
from .optable import OPS, REQUIRED, OpSpec, in_float32


def _finfo(dtype: Any) -> Any:
    """np.finfo, or ml_dtypes.finfo for bfloat16 (which NumPy's does not know)."""
    dtype = np.dtype(dtype)
    if _dtypes.is_bf16(dtype):
        import ml_dtypes

        return ml_dtypes.finfo(dtype)
    return np.finfo(dtype)


def _round(r: np.ndarray, dtype: Any) -> np.ndarray:
    """float64 values rounded once to dtype, as float64 (bfloat16 by `multiact.dtypes`: ml_dtypes' own
    float64 cast rounds twice, through float32)."""
    if _dtypes.is_bf16(np.dtype(dtype)):
        return _dtypes.from_float64(r).astype(np.float32).astype(np.float64)
    return r.astype(dtype).astype(np.float64)


def param_cases(spec: OpSpec) -> list[dict[str, Any]]:
    """The defaults (where the op has them all) and the op's own corners (its definition's `cases`)."""
    cases = [dict(c) for c in spec.defn.cases]
    if all(p.default is not REQUIRED for p in spec.params):
        cases.insert(0, {})
    return cases


def key_cases(spec: OpSpec, key: str) -> list[dict[str, Any]]:
    """The op's cases that select kernel key `key` (or just the variant's value where none does)."""
    return [c for c in param_cases(spec) if spec.kernel_key(_rounded(spec, c, np.float64)) == key] or [
        spec.defn.selecting(key)]


def case_id(params: dict[str, Any]) -> str:
    return ",".join(f"{k}={v}" for k, v in params.items()) or "defaults"


def specials(dtype: np.dtype) -> np.ndarray:
    """0, -0, +-1, +-100, +-1000, tiny, tiny/8 (subnormal), +-max, +-inf, NaN."""
    fi = _finfo(dtype)
    tiny = float(fi.tiny)
    vals = [0.0, -0.0, 1.0, -1.0, 100.0, -100.0, 1000.0, -1000.0, tiny, -tiny, tiny / 8, -tiny / 8,
            float(fi.max), -float(fi.max), np.inf, -np.inf, np.nan]
    with np.errstate(over="ignore"):
        return np.array(vals, dtype=np.float64).astype(dtype)


def zero_pairs(dtype: Any) -> tuple[np.ndarray, np.ndarray]:
    """(x, dy) where only the sign of zero tells results apart: x = +-0 each with dy = +-1, +-0,
    and moderate x (no derivative underflows there) with dy = +-0."""
    x = np.concatenate([np.repeat([0.0, -0.0], 4), np.tile([0.5, -0.5, 2.0, -2.0], 2)])
    dy = np.concatenate([np.tile([1.0, -1.0, 0.0, -0.0], 2), np.repeat([0.0, -0.0], 4)])
    return x.astype(dtype), dy.astype(dtype)


def sample_x(spec: OpSpec, params: dict[str, Any], dtype: Any, n: int = 600, seed: int = 0) -> np.ndarray:
    """Random normal values, a wide sweep, the specials, and each kink (within the dtype's range) with its
    neighbours and its half (the branch below a far kink, which the sweep does not reach)."""
    dtype = np.dtype(dtype)
    rng = np.random.default_rng(seed)
    kinks = []
    for k in spec.kinks(_rounded(spec, params, dtype)):
        if abs(k) > float(_finfo(dtype).max):
            continue
        kd = np.array(k, dtype=dtype)
        kinks += [kd, np.nextafter(kd, dtype.type(np.inf)), np.nextafter(kd, dtype.type(-np.inf)), kd / 2]
    wide = np.linspace(-30, 30, n // 3)
    parts = [rng.standard_normal(n) * 3, wide, np.array(kinks, dtype=np.float64).reshape(-1)]
    x = np.concatenate([p.astype(np.float64) for p in parts]).astype(dtype)
    return np.concatenate([x, specials(dtype)])


def _rounded(spec: OpSpec, params: dict[str, Any], dtype: Any) -> dict[str, Any]:
    """Validated params with floats rounded to the compute precision (float32 below float64)."""
    p = spec.validate(params) if spec.defn.array_param not in params else dict(params)  # a weight: as given
    if np.dtype(dtype) == np.float64:
        return p
    return in_float32(p)


def prelu_weight(x: np.ndarray, case: str, axis: int = 1) -> np.ndarray:
    """A weight for prelu's cases: one per channel (mixed signs) or a single one."""
    if case == "single":
        return np.array([0.25], dtype=x.dtype)
    c = x.shape[axis]
    return np.linspace(-0.5, 1.5, c).astype(x.dtype)


def reference(spec: OpSpec, direction: str, params: dict[str, Any], dtype: Any, *arrays: np.ndarray) -> Any:
    """The float64 reference on the exact input values."""
    p = _rounded(spec, params, dtype)
    a64 = [a.astype(np.float64) for a in arrays]
    fn = {"forward": spec.forward, "backward": spec.backward, "backward_y": spec.backward_y}.get(direction)
    if direction == "param_grad":
        fn = spec.param_grad[1]
    array = spec.defn.array_param
    if array:  # prelu's weight, in float64 too
        return fn(*a64, **{**p, array: p[array].astype(np.float64)})
    return fn(*a64, **p)


# ---- where a backward's absolute floor applies: around the zero crossings of f' ----------------------
#
# A backward is judged in ulps of its result, relatively, except where f' crosses zero away from a kink.
# Every op of the table whose derivative crosses zero so is x * gate(x) (gelu, silu, swish, fast_gelu,
# mish, hardswish), whose f' = g + x g' (g = f / x) is a sum of two terms that cancel there: a kernel that
# holds each term to an ulp of its own holds f' only to about eps (|g| + |x g'|) absolutely.  So where the
# terms cancel, |f'(x)| < (|g| + |x g'|) / CANCEL, around each zero crossing, the bound is relaxed by an
# absolute floor of atol eps |dy| (|g| + |x g'|) (the op's `Tolerance.bwd_atol` in the suite, FLOOR_ATOL in
# the sweeps).  The crossings and their neighbourhoods are derived from the op's float64 references (the
# forward and the backward; no list of ops): sign changes of f' on a grid of every magnitude, bisected,
# kept where f' goes to zero continuously (a jump across zero at a kink, leaky_relu's with a negative slope,
# is no crossing), each widened on both sides to where the terms' sum falls to CANCEL |f'|.
CANCEL = 2.0
_CROSSINGS: dict[tuple, tuple[tuple[float, float, float], ...]] = {}


def grad_terms(spec: OpSpec, p: dict[str, Any], x: np.ndarray) -> np.ndarray:
    """|g| + |x g'| at x (float64), g = f / x: the magnitudes of the two terms of f' = g + x g'."""
    x = np.asarray(x, dtype=np.float64)
    with np.errstate(all="ignore"):
        g = np.asarray(spec.forward(x, **p), dtype=np.float64) / x
        d = np.asarray(spec.backward(np.ones_like(x), x, **p), dtype=np.float64)
        return np.abs(g) + np.abs(d - g)


def _kappa(spec: OpSpec, p: dict[str, Any], x: np.ndarray) -> np.ndarray:
    """How far the terms of f' cancel: (|g| + |x g'|) / |f'| (inf at a zero, NaN where undefined)."""
    x = np.asarray(x, dtype=np.float64)
    with np.errstate(all="ignore"):
        d = np.abs(np.asarray(spec.backward(np.ones_like(x), x, **p), dtype=np.float64))
        return grad_terms(spec, p, x) / d


def crossings(spec: OpSpec, params: dict[str, Any], dtype: Any = np.float32) -> tuple[tuple[float, float, float], ...]:
    """(lo, x0, hi) for each zero crossing x0 of f' (parameters rounded to dtype's compute precision): the open
    interval (lo, hi) around x0 where the terms of f' cancel (`CANCEL`).  Empty for an op with an array
    parameter or a piecewise linear one (f' piecewise constant)."""
    d = spec.defn
    if d.array_param or d.piecewise_linear:
        return ()
    p = _rounded(spec, params, dtype)
    key = (spec.name, id(spec.forward), id(spec.backward), tuple(sorted(p.items())))
    hit = _CROSSINGS.get(key)
    if hit is None:
        hit = _CROSSINGS[key] = _find_crossings(spec, p)
    return hit


def _find_crossings(spec: OpSpec, p: dict[str, Any]) -> tuple[tuple[float, float, float], ...]:
    mags = np.logspace(-45, 38.6, 84 * 64)
    grid = np.concatenate([-mags[::-1], [0.0], mags])

    def fp(v):
        with np.errstate(all="ignore"):
            return float(np.asarray(spec.backward(np.ones(1), np.array([v], dtype=np.float64), **p))[0])

    with np.errstate(all="ignore"):
        s = np.sign(np.asarray(spec.backward(np.ones_like(grid), grid, **p), dtype=np.float64))
    out = []
    for i in np.flatnonzero(s[:-1] * s[1:] < 0):
        a, b = float(grid[i]), float(grid[i + 1])
        sa = s[i]
        for _ in range(2100):  # bisect to adjacent float64 values
            m = 0.5 * (a + b)
            if m in (a, b):
                break
            if np.sign(fp(m)) == sa:
                a = m
            else:
                b = m
        x0 = a if abs(fp(a)) <= abs(fp(b)) else b
        t = float(grad_terms(spec, p, np.array([a, b])).max())
        if not (np.isfinite(t) and max(abs(fp(a)), abs(fp(b))) <= 1e-6 * t):
            continue  # a jump across zero (a kink), not a crossing
        ends = []
        for side in (-1.0, 1.0):
            step = max(abs(x0), 1e-300) * 2.0 ** -30
            inner = 0.0
            for _ in range(4000):
                k = float(_kappa(spec, p, np.array([x0 + side * step]))[0])
                if not (k > CANCEL) or step > 1e38:
                    break
                inner, step = step, step * 1.05
            outer = step
            for _ in range(60):  # bisect kappa = CANCEL between inner and outer
                mid = 0.5 * (inner + outer)
                if float(_kappa(spec, p, np.array([x0 + side * mid]))[0]) > CANCEL:
                    inner = mid
                else:
                    outer = mid
            ends.append(x0 + side * outer)
        out.append((ends[0], x0, ends[1]))
    return tuple(out)


def cancel_terms(spec: OpSpec, params: dict[str, Any], dtype: Any, x: np.ndarray) -> np.ndarray:
    """|g| + |x g'| (`grad_terms`) where x lies around a zero crossing of f' (`crossings`), 0 elsewhere: the
    scale of a backward's absolute floor, per element."""
    with np.errstate(invalid="ignore"):  # NaN patterns
        xs = np.asarray(x).astype(np.float64)
    out = np.zeros(xs.shape)
    near = np.zeros(xs.shape, bool)
    for lo, _, hi in crossings(spec, params, dtype):
        near |= (xs > lo) & (xs < hi)
    if near.any():
        out[near] = grad_terms(spec, _rounded(spec, params, dtype), xs[near])
    return out


@dataclass
class Verdict:
    """The outcome of comparing one result with the reference."""

    passed: bool
    max_ulp: float
    max_abs: float
    n_bad: int
    bad: list[tuple[float, float, float]] = field(default_factory=list)  # (x, got, ref)
    max_of_bound: float = 0.0  # the largest |got - ref| / the op's bound over finite results (<= 1: within it)

    def describe(self) -> str:
        head = f"max error {self.max_ulp:.3g} ulp ({self.max_abs:.3g} abs), {self.n_bad} bad"
        rows = [f"  x={x!r}: got {g!r}, want {r!r}" for x, g, r in self.bad[:8]]
        return "\n".join([head, *rows])


# Where compare's cond(x) term (Tolerance.cond: celu, gelu, fast_gelu, swish, softplus, whose exponential's argument x
# / alpha, x^2 / 2, k x, beta x rounded to the compute precision costs cond(x) eps relative in the tail) is no longer
# allowed (issue 19): float32 on these backends' elementwise kernels, per op, where the tails carry the argument's
# rounding error (native C, numba) or evaluate in float64 (numpy), measured within 4 ulp on the subset and dense
# sweeps (`multiact check --subset|--dense`, results/accuracy-f32-*) and passing the shared suite without
# it (native softplus since its z = beta x carries its rounding error: it was 7.9 ulp at beta = 0.3, x = -100 in the
# suite, 61 at x = -214).  Still allowed: float64 everywhere (libm on the rounded float64 argument); the cuda
# backend's float32 formulas (the same pairs, but over libdevice's expf/erfcf: not re-verified on a GPU); onnxruntime
# and other peers (their own formulas); float16 and bfloat16 (computed in float32 and rounded once: the term is far
# inside their ulp, kept as their rule has it); the composites (gated, bias_act, second order: numpy's composite paths
# evaluate the activation in float32).
_COND_OPS = frozenset(n for n, s in OPS.items() if s.tol.cond is not None)
COND_FREE_F32: dict[str, frozenset[str]] = {"numba": _COND_OPS, "numpy": _COND_OPS, "native": _COND_OPS}


def compare(
    got: np.ndarray,
    ref: np.ndarray,
    x: np.ndarray,
    spec: OpSpec,
    direction: str,
    scale: np.ndarray | None = None,
    params: dict[str, Any] | None = None,
    slack: np.ndarray | None = None,
    zero_sign: np.ndarray | None = None,
    cond: bool = True,
) -> Verdict:
    """Judge `got` (in its dtype) against the float64 `ref` with the op's tolerance.  A composite op says
    more: `slack`, an absolute allowance per element (where its intermediate is subnormal), and
    `zero_sign`, where a zero result must carry the reference's sign (instead of x = 0 or scale = 0).
    cond=False drops the op's cond(x) term (`COND_FREE_F32`: where the tails were measured without it).
    direction "backward" allows its absolute floor only around the zero crossings of f' (`cancel_terms`);
    "backward2" (judged with `backward2_tolerance`) everywhere, f'' crossing zero between most kinks."""
    dtype = got.dtype
    tol = spec.tol
    g = got.astype(np.float64).reshape(-1)
    r = np.asarray(ref, dtype=np.float64).reshape(-1)
    xs = x.astype(np.float64).reshape(-1)
    zero_in = xs == 0  # where a zero result must carry the reference's sign
    if zero_sign is not None:
        zero_in = np.asarray(zero_sign, bool).reshape(-1)
    elif scale is not None:
        zero_in = zero_in | ((np.asarray(scale, dtype=np.float64).reshape(-1) == 0) & ~_underflows(
            spec, direction, xs, params, dtype))
    with np.errstate(over="ignore", invalid="ignore"):
        r_round = _round(r, dtype)
        spacing = np.spacing(np.abs(r_round.astype(dtype))).astype(np.float64)
        err = np.abs(g - r)
        atol = {"forward": tol.fwd_atol, "backward": tol.bwd_atol, "backward2": tol.bwd_atol,
                "backward_y": tol.y_atol}[direction]
        sc = np.abs(np.asarray(scale, dtype=np.float64).reshape(-1)) if scale is not None else np.abs(xs)
        sc = np.where(np.isfinite(sc), sc, 0.0)
        if direction == "backward" and atol:  # the floor only where the terms of f' cancel (`crossings`)
            sc = sc * cancel_terms(spec, params or {}, dtype, xs)
        eps = float(_finfo(dtype).eps)
        bound = tol.ulp(dtype.name) * spacing + atol * eps * sc
        if slack is not None:
            bound = bound + np.asarray(slack, dtype=np.float64).reshape(-1)
        if cond and tol.cond is not None and direction != "backward_y":
            cond = tol.cond(xs, _rounded(spec, params or {}, dtype)) if not spec.defn.array_param else 0.0
            bound = bound + np.where(np.isfinite(cond), cond, 0.0) * eps * np.abs(r)
        # Results below the smallest normal may be flushed or lose bits in subnormal intermediates.
        tiny = float(_finfo(dtype).tiny)
        bound = np.where(np.abs(r) < tiny, np.maximum(bound, tiny), bound)
        nan_ok = np.isnan(g) == np.isnan(r)
        inf_ref = np.isinf(r_round)
        inf_ok = np.where(inf_ref, g == r_round, ~np.isinf(g) | (g == r))
        finite = ~np.isnan(r) & ~inf_ref
        val_ok = np.where(finite, err <= bound, True)
        # |got - ref| cannot see the sign of zero
        sign_ok = np.where(zero_in & (r == 0), (g == 0) & (np.signbit(g) == np.signbit(r)), True)
        ok = nan_ok & inf_ok & val_ok & sign_ok
        ulps = np.where(finite & (spacing > 0), err / np.where(spacing > 0, spacing, 1), 0.0)
        of_bound = np.where(finite & (bound > 0), err / np.where(bound > 0, bound, 1), 0.0)
    bad_idx = np.flatnonzero(~ok)
    return Verdict(
        passed=bad_idx.size == 0,
        max_ulp=float(np.nanmax(ulps, initial=0.0)),
        max_abs=float(np.nanmax(np.where(finite, err, 0.0), initial=0.0)),
        n_bad=int(bad_idx.size),
        bad=[(float(xs[i]), float(g[i]), float(r[i])) for i in bad_idx[:20]],
        max_of_bound=float(np.nanmax(of_bound, initial=0.0)),
    )


def _underflows(spec: OpSpec, direction: str, xs: np.ndarray, params: dict[str, Any] | None, dtype: Any) -> np.ndarray:
    """Where the derivative itself is nonzero but below the compute precision's smallest normal (float32
    for float16): there dy = +-0 times it has no sign a kernel can know, as a flushed value has none."""
    if spec.defn.array_param or direction not in ("backward", "backward_y"):
        return np.zeros(xs.shape, bool)
    ref = spec.backward if direction == "backward" else spec.backward_y
    compute = np.float64 if np.dtype(dtype) == np.float64 else np.float32
    with np.errstate(all="ignore"):
        d = np.asarray(ref(np.ones_like(xs), xs, **_rounded(spec, params or {}, dtype)), dtype=np.float64)
    return (d != 0) & (np.abs(d) < float(np.finfo(compute).tiny))


def run_case(
    backend: str,
    op: str,
    direction: str,
    dtype: Any,
    params: dict[str, Any],
    to_kind: Any = None,
    from_kind: Any = None,
    n: int = 600,
) -> Verdict:
    """Call `backend` on the standard inputs for one (op, direction, dtype, params) and judge it.

    to_kind/from_kind move NumPy inputs to the backend's array kind and results back.
    """
    import multiact as ma

    spec = OPS[op]
    dtype = np.dtype(dtype)
    to_kind = to_kind or (lambda a: a)
    from_kind = from_kind or (lambda a: np.asarray(a))
    x0, dy0 = zero_pairs(dtype)
    x = np.concatenate([x0, sample_x(spec, params, dtype, n=n)])
    rng = np.random.default_rng(1)
    dy = np.concatenate([dy0, rng.standard_normal(x.size - x0.size).astype(dtype)])
    call_params = dict(params)
    x_in = x
    array = spec.defn.array_param
    if array:  # a weight per channel of a 2-D x (4 channels on axis 1), or a single one
        x_in = x[: x.size - x.size % 4].reshape(-1, 4)
        dy = dy[: x_in.size].reshape(x_in.shape)
        call_params[array] = prelu_weight(x_in, params[array])
    ref_params = dict(call_params)
    if array:
        ref_params = {array: call_params[array].reshape(1, -1) if call_params[array].size > 1
                      else call_params[array].reshape(1, 1), "axis": 1}
    cond = not (dtype == np.float32 and op in COND_FREE_F32.get(backend or "", ()))
    if direction == "forward":
        got = from_kind(ma.forward(op, to_kind(x_in), backend=backend, **call_params))
        return compare(got, reference(spec, "forward", ref_params, dtype, x_in), x_in, spec, direction, params=params,
                       cond=cond)
    if direction == "backward":
        got = from_kind(ma.backward(op, to_kind(dy), to_kind(x_in), backend=backend, **call_params))
        ref = reference(spec, "backward", ref_params, dtype, dy, x_in)
        return compare(got, ref, x_in, spec, direction, scale=dy, params=params, cond=cond)
    if direction == "backward_y":
        with np.errstate(all="ignore"):
            y = np.asarray(reference(spec, "forward", ref_params, dtype, x_in)).astype(dtype)
        got = from_kind(ma.backward(op, to_kind(dy), y=to_kind(y), backend=backend, **call_params))
        ref = reference(spec, "backward_y", ref_params, dtype, dy, y)
        return compare(got, ref, y, spec, direction, scale=dy.astype(np.float64) * y)
    raise ValueError(f"run_case: direction must be forward, backward or backward_y, got {direction!r}")


def directions(spec: OpSpec, params: dict[str, Any]) -> list[str]:
    """The elementwise directions this (op, params) has."""
    out = ["forward", "backward"]
    if spec.backward_y is not None and spec.defn.array_param not in params and spec.supports_y(spec.validate(params)):
        out.append("backward_y")
    return out


def case_failures(
    backend: str | None, op: str, params: dict[str, Any], dtype: Any, to_kind: Any = None, from_kind: Any = None,
    n: int = 600,
) -> list[str]:
    """Every elementwise direction of one case; the failures described (empty when all pass)."""
    out = []
    for direction in directions(OPS[op], params):
        v = run_case(backend, op, direction, dtype, params, to_kind, from_kind, n)
        if not v.passed:
            out.append(f"{direction}: {v.describe()}")
    return out


# ---- the gated family (glu, swiglu, geglu, reglu): two inputs, two outputs ----------------------------

# (dim, layout, activate) rotated over the cases, so that every combination meets many activations
# without the full product: the halves of dim -1 and of dim 0 of a 3-D array, interleaved, both gates.
_GATED_FORMS = tuple((dim, layout, activate) for dim in (-1, 0) for layout in ("halves", "interleaved")
                     for activate in ("first", "second"))


def gated_cases() -> list[tuple[str, dict[str, Any]]]:
    """(op, parameters) of the shared suite: glu with every activation of the table (but prelu) and each of
    its parameter cases, the named forms with their defaults and own cases, each in a rotating form, and
    every op in the two-input form (up=)."""
    from ._opdefs import COMPOSITES, composable

    cases: list[tuple[str, dict[str, Any]]] = []
    for spec in OPS.values():
        if composable(spec.defn):
            cases += [("glu", {"act": spec.name, **c}) for c in param_cases(spec)]
    for c in COMPOSITES:
        cases += [(c.name, dict(p)) for p in ({}, *c.cases)]
    out = []
    for i, (name, p) in enumerate(cases):
        dim, layout, activate = _GATED_FORMS[i % len(_GATED_FORMS)]
        form = {"dim": dim, "layout": layout, "activate": activate}
        out.append((name, {**form, **p}))
    out += [(c.name, {"up": True}) for c in COMPOSITES]
    return out


def _gated_inputs(spec: OpSpec, act_p: dict[str, Any], dtype: np.dtype, half: tuple[int, ...], seed: int):
    """(gate, up, dy) of shape `half`: gate from the activation's sample (kinks, specials), up and dy
    random with the specials (and +-0) mixed in."""
    n = int(np.prod(half))
    rng = np.random.default_rng(seed)
    x0, dy0 = zero_pairs(dtype)
    g = np.concatenate([x0, sample_x(spec, act_p, dtype, n=300)])
    g = np.resize(g, n)
    sp = specials(dtype)
    u = np.resize(np.concatenate([sp, rng.permutation(sp), (rng.standard_normal(n) * 3).astype(dtype)]), n)
    u = rng.permutation(u) if n > 2 * sp.size else u
    dy = np.resize(np.concatenate([dy0, rng.standard_normal(n).astype(dtype)]), n)
    return g.reshape(half).astype(dtype), u.reshape(half).astype(dtype), dy.reshape(half).astype(dtype)


def _widened(spec: OpSpec) -> OpSpec:
    """The activation's bound, one more ulp for the product with the other half."""
    from dataclasses import replace

    t = spec.tol
    return replace(spec, tol=replace(t, ulp32=t.ulp32 + 1, ulp64=t.ulp64 + 1, ulp16=t.ulp16 + 1))


def gated_failures(backend: str | None, op: str, params: dict[str, Any], dtype: Any, to_kind: Any = None,
                   from_kind: Any = None) -> list[str]:
    """One gated case, forward and backward, against the reference composed from the table's (float64 on
    the exact inputs); the failures described (empty when all pass).  `params` holds the op's parameters
    and the activation's; `up=True` asks for the two-input form."""
    import multiact as ma

    from . import gated
    from ._opdefs import COMPOSITE_DEFINITIONS

    cdef = COMPOSITE_DEFINITIONS[op]
    dtype = np.dtype(dtype)
    to_kind = to_kind or (lambda a: a)
    from_kind = from_kind or (lambda a: np.asarray(a))
    params = dict(params)
    two = params.pop("up", False)
    own = {k: v for k, v in params.items() if k in cdef.param_names}
    extra = {k: v for k, v in params.items() if k not in cdef.param_names}
    call = gated.resolve(cdef, own, extra, f"{op}()")
    act = _widened(call.act)
    dim = own.get("dim", -1)
    half = (37, 3, 7) if dim == -1 else (21, 3, 5)
    gate, up, dy = _gated_inputs(call.act, call.act_p, dtype, half, seed=len(params))
    fn, fgrad = getattr(ma, op), getattr(ma, f"{op}_grad")
    if two:
        first, second = (gate, up) if call.gate_first else (up, gate)
        y = from_kind(fn(to_kind(first), up=to_kind(second), backend=backend, **own, **extra))
        dfirst, dsecond = (from_kind(a) for a in fgrad(to_kind(dy), to_kind(first), up=to_kind(second),
                                                         backend=backend, **own, **extra))
        dgate, dup = (dfirst, dsecond) if call.gate_first else (dsecond, dfirst)
    else:
        full = list(half)
        full[dim] *= 2
        x = np.empty(full, dtype)
        a, b = gated.split(x, dim % x.ndim, call.layout)
        (a if call.gate_first else b)[...] = gate
        (b if call.gate_first else a)[...] = up
        y = from_kind(fn(to_kind(x), backend=backend, **own, **extra))
        dx = from_kind(fgrad(to_kind(dy), to_kind(x), backend=backend, **own, **extra))
        if dx.shape != x.shape:
            return [f"backward: dx has shape {dx.shape}, expected {x.shape}"]
        da, db = gated.split(dx, dim % x.ndim, call.layout)
        dgate, dup = (da, db) if call.gate_first else (db, da)
    kp = {**call.kp, **_rounded(call.act, call.act_p, dtype)}
    if dtype != np.float64 and kp["limit"] != np.inf:
        kp["limit"] = float(np.float32(kp["limit"]))
    ref_y, ref_dg, ref_du, slacks, signs = _gated_reference(call.act, kp, dtype, gate, up, dy)
    plain_dg, plain_du = gated.reference_backward(call.act, kp, dy, gate, up)
    reference_plain = {"forward y": gated.reference_forward(call.act, kp, gate, up), "backward dgate": plain_dg,
                       "backward dup": plain_du}
    g64, u64 = gated.clipped(gate.astype(np.float64), up.astype(np.float64), kp)
    with np.errstate(over="ignore"):
        g = g64.astype(dtype)
    dy64 = dy.astype(np.float64)
    failures = []
    with np.errstate(all="ignore"):
        checks = (("forward y", y, ref_y, "forward", g64 * u64, slacks[0], signs[0]),
                  ("backward dgate", dgate, ref_dg, "backward", dy64 * u64, None, None),
                  ("backward dup", dup, ref_du, "forward", dy64 * g64, slacks[1], signs[1]))
        for what, got, ref, direction, scale, slack, sign in checks:
            if got.shape != ref.shape:
                failures.append(f"{what}: shape {got.shape}, expected {ref.shape}")
                continue
            either = np.isnan(ref) & ~np.isnan(reference_plain[what])  # NaN or inf (_gated_reference)
            got = np.where(either & ~np.isfinite(got), np.nan, got).astype(got.dtype)  # (bfloat16 stays)
            v = compare(got, ref, g, act, direction, scale=scale, params=call.act_p, slack=slack, zero_sign=sign)
            if not v.passed:
                failures.append(f"{what}: {v.describe()}")
    return failures


def _gated_reference(act: OpSpec, kp: dict[str, Any], dtype: np.dtype, gate: np.ndarray, up: np.ndarray,
                     dy: np.ndarray) -> tuple[np.ndarray, ...]:
    """(y, dgate, dup, slacks of y and dup, zero-sign masks of y and dup) in float64, the intermediates
    held as kernels hold them: the activation's value and dy * u are values of the compute precision
    (float32 below float64) where they leave its range (overflow to inf, as PyTorch's silu(a) * b does);
    a subnormal activation value has lost bits before the product (slack: the smallest normal times the
    other factor), and one below the compute precision's smallest normal has no sign a kernel can know
    (a flushed value has none) and may be 0: its product with an infinite factor is NaN or inf, either
    accepted (the reference says NaN there, which `gated_failures` lets stand for either)."""
    from . import gated

    compute = np.float64 if dtype == np.float64 else np.float32
    big, tiny = float(np.finfo(compute).max), float(np.finfo(compute).tiny)
    p = {k: kp[k] for k in act.param_names}
    with np.errstate(all="ignore"):
        g, u = gated.clipped(gate.astype(np.float64), up.astype(np.float64), kp)
        d = dy.astype(np.float64)

        def held(v):
            return np.where(np.abs(v) > big, np.copysign(np.inf, v), v)

        a = held(act.forward(g, **p))
        du = d * u
        dgate = act.backward(held(du), g, **p)
        y, dup = a * u, d * a
        limit = kp["limit"]
        gate64, up64 = gate.astype(np.float64), up.astype(np.float64)  # a float16 compare would round limit
        dgate = np.where(gate64 > limit, 0.0, dgate)
        dup = np.where(np.abs(up64) > limit, 0.0, dup)
        sub = (np.abs(a) < tiny) & (a != 0)
        slack_y = np.where(sub, 2 * tiny * np.abs(np.where(np.isfinite(u), u, 0.0)), 0.0)
        slack_du = np.where(sub, 2 * tiny * np.abs(np.where(np.isfinite(d), d, 0.0)), 0.0)
        y = np.where(sub & np.isinf(u), np.nan, y)
        dtiny = np.abs(act.backward(np.ones_like(g), g, **p))
        dgate = np.where((dtiny < tiny) & (dtiny != 0) & np.isinf(du), np.nan, dgate)
        signed = ~sub  # the activation's value has a sign every kernel gives
        sign_y = (g == 0) | ((u == 0) & signed)
        sign_du = (g == 0) | ((d == 0) & signed)
    return y, dgate, dup, (slack_y, slack_du), (sign_y, sign_du)


# ---- bias_act: x, b and scale in; dx, db and dscale out ------------------------------------------------

# (dim, b, scale, gain, clamp) rotated over the cases: per-channel ("c") or full-shape ("full") b and
# scale along dims 1, -1 and 0, StyleGAN's gain, and a clamp that is hit.
_BIAS_FORMS = (
    {"dim": 1, "b": "c"}, {"dim": -1, "b": "c", "scale": "c"}, {"dim": 0, "b": "full"},
    {"dim": 1, "scale": "c", "gain": 2 ** 0.5}, {"dim": 1, "b": "c", "clamp": 2.0, "gain": 2 ** 0.5},
    {"dim": -1, "b": "full", "scale": "full"}, {"dim": 0}, {"dim": 1, "b": "c", "scale": "full", "clamp": 0.0},
)


def bias_act_cases() -> list[dict[str, Any]]:
    """Every activation (linear and the table's but prelu, each with its parameter cases) in a rotating
    form, and every form with a few activations."""
    from ._opdefs import composable
    from .optable import LINEAR

    cases = [{"act": LINEAR.name}]
    for spec in OPS.values():
        if composable(spec.defn):
            cases += [{"act": spec.name, **c} for c in param_cases(spec)]
    out = [{**_BIAS_FORMS[i % len(_BIAS_FORMS)], **c} for i, c in enumerate(cases)]
    out += [{**f, "act": act} for f in _BIAS_FORMS for act in ("leaky_relu", "gelu", "sigmoid")]
    return out


def bias_act_failures(backend: str | None, params: dict[str, Any], dtype: Any, to_kind: Any = None,
                      from_kind: Any = None) -> list[str]:
    """One bias_act case, forward and backward (dx, db, dscale), against the float64 composition; the
    failures described.  `params`: the op's and the activation's parameters, and "b" / "scale" as "c"
    (one per channel) or "full" (x's shape)."""
    import multiact as ma

    from . import fused_bias_act as B

    dtype = np.dtype(dtype)
    to_kind = to_kind or (lambda a: a)
    from_kind = from_kind or (lambda a: np.asarray(a))
    params = dict(params)
    kinds = {k: params.pop(k, None) for k in ("b", "scale")}
    own = {k: v for k, v in params.items() if k in B.DEFN.param_names}
    extra = {k: v for k, v in params.items() if k not in B.DEFN.param_names}
    call = B.resolve(own, extra, "bias_act()")
    shape = (6, 5, 7)
    dim = own.get("dim", 1) % 3
    rng = np.random.default_rng(sum(map(ord, str(sorted(params.items())))) % 1000)
    x0, dy0 = zero_pairs(dtype)
    n = int(np.prod(shape))
    x = np.resize(np.concatenate([x0, sample_x(call.act if call.act.name != "linear" else OPS["relu"],
                                               call.act_p if call.act.name != "linear" else {}, dtype, n=200)]), n)
    x = rng.permutation(x).reshape(shape).astype(dtype)
    dy = np.resize(np.concatenate([dy0, rng.standard_normal(n).astype(dtype)]), n).reshape(shape).astype(dtype)
    c = shape[dim]

    def side(kind, lo, hi):
        if kind is None:
            return None, None
        vals = rng.uniform(lo, hi, c if kind == "c" else shape).astype(dtype)
        if kind == "c":
            bshape = [1, 1, 1]
            bshape[dim] = c
            return vals, np.broadcast_to(vals.reshape(bshape), shape)
        return vals, vals

    b, b_full = side(kinds["b"], -1.0, 1.0)
    s, s_full = side(kinds["scale"], -2.0, 2.0)
    kw = {**own, **extra}
    y = from_kind(ma.bias_act(to_kind(x), None if b is None else to_kind(b), scale=None if s is None else to_kind(s),
                              backend=backend, **kw))
    grads = ma.bias_act_grad(to_kind(dy), to_kind(x), None if b is None else to_kind(b),
                             scale=None if s is None else to_kind(s), backend=backend, **kw)
    grads = grads if isinstance(grads, tuple) else (grads,)
    dx = from_kind(grads[0])
    db = None if b is None else from_kind(grads[1])
    ds = None if s is None else from_kind(grads[2])
    ref = _bias_act_reference(call, dtype, x, b_full, s_full, dy)
    act = _widened(call.act)
    failures = []
    with np.errstate(all="ignore"):
        gain = call.kp["gain"]
        checks = [("forward y", y, ref["y"], "forward", np.abs(ref["z"]) * abs(gain), ref["slack_y"]),
                  ("backward dx", dx, ref["dx"], "backward", np.abs(ref["e"] * (1.0 if s is None else s_full)),
                   ref["slack_dx"])]
        for what, got, want, direction, scale, slack in checks:
            if got.shape != want.shape:
                failures.append(f"{what}: shape {got.shape}, expected {want.shape}")
                continue
            v = compare(np.ascontiguousarray(got), want, ref["z"].astype(dtype), act, direction, scale=scale,
                        params=call.act_p, slack=slack, zero_sign=np.zeros(want.shape, bool))
            if not v.passed:
                failures.append(f"{what}: {v.describe()}")
        for what, got, elem, kind in (("backward db", db, ref["dz"], kinds["b"]),
                                      ("backward dscale", ds, ref["dz"] * x.astype(np.float64), kinds["scale"])):
            if got is None:
                continue
            bound_e = ref["bound_dz"] * (1.0 if what.endswith("db") else np.abs(x.astype(np.float64)))
            if kind == "c":
                axes = tuple(a for a in range(3) if a != dim)
                finite = np.isfinite(elem)
                want = np.where(finite, elem, 0).sum(axis=axes) + np.where(finite, 0, elem).sum(axis=axes)
                bound = np.where(finite, bound_e, 0).sum(axis=axes)
            else:
                want, bound = elem, bound_e
            r_round = _round(want, dtype)
            bound = bound + np.spacing(np.abs(r_round).astype(dtype)).astype(np.float64)
            g = np.asarray(got, np.float64)
            ok = np.where(np.isnan(want), np.isnan(g), np.where(np.isinf(r_round), g == r_round,
                                                                 np.abs(g - want) <= bound))
            if g.shape != want.shape or not ok.all():
                bad = np.flatnonzero(~ok.reshape(-1))[:4] if g.shape == want.shape else []
                failures.append(f"{what}: {len(bad)} bad, e.g. " + ", ".join(
                    f"got {g.reshape(-1)[i]!r} want {want.reshape(-1)[i]!r}" for i in bad))
    failures += _bias_act_y_failures(backend, call, kw, dtype, dim, dy, y, b, kinds["b"], to_kind, from_kind)
    return failures


def _bias_act_y_failures(backend, call, kw, dtype, dim, dy, y, b, bkind, to_kind, from_kind) -> list[str]:
    """The y= form on the backend's own forward output (without scale, which it refuses: its dz is what the
    x form multiplies by scale): where fused_bias_act allows it, dz and db against the float64 y reference
    (clamped elements exactly 0); elsewhere the YFormError."""
    import multiact as ma

    from . import fused_bias_act as B
    from . import registry
    from .errors import YFormError

    if backend is not None and not registry.module(backend).supports(call.key, "backward_y", dtype.name):
        return []  # a backend without the y form (the call would be a BackendError, not this suite's finding)
    try:
        B.y_form_check("bias_act_grad()", call, dtype, None)
    except YFormError as e:
        try:
            ma.bias_act_grad(to_kind(dy), None, None if b is None else to_kind(b), y=to_kind(y), backend=backend,
                             **kw)
        except YFormError as got:
            return [] if str(got) == str(e) else [f"y=: refused with {got}, expected {e}"]
        return [f"y=: accepted where it should raise YFormError ({e})"]
    grads = ma.bias_act_grad(to_kind(dy), None, None if b is None else to_kind(b), y=to_kind(y), backend=backend,
                             **kw)
    grads = grads if isinstance(grads, tuple) else (grads,)
    dz = np.asarray(from_kind(grads[0]), np.float64)
    clamp = B.y_clamp(call.kp["clamp"], dtype)
    compute = np.float64 if dtype == np.float64 else np.float32
    eps = float(np.finfo(compute).eps)
    failures = []
    with np.errstate(all="ignore"):
        y64 = y.astype(np.float64)
        want = B.reference_backward_y(call, dy, y, clamp)
        e = dy.astype(np.float64) * call.kp["gain"]
        a = np.abs(y64 / call.kp["gain"])
        # e and y / gain rounded once each in the compute precision, the y formula's few roundings (its
        # factor grows as (1 + |a|)^2 at most: tanh's 1 - a^2), then one rounding to the dtype
        bound = 16 * eps * np.abs(e) * (1 + a) ** 2 + np.spacing(np.abs(want).astype(dtype)).astype(np.float64)
        clipped = np.abs(y64) >= clamp if clamp != np.inf else np.zeros(y.shape, bool)
        ok = np.where(clipped, dz == 0, np.where(np.isnan(want), np.isnan(dz), np.where(
            np.isinf(want), dz == want, np.abs(dz - want) <= np.where(np.isfinite(bound), bound, np.inf))))
        if dz.shape != want.shape or not ok.all():
            bad = np.flatnonzero(~ok.reshape(-1))[:4] if dz.shape == want.shape else []
            failures.append(f"y= dz: {int((~ok).sum())} bad, e.g. " + ", ".join(
                f"y {y.reshape(-1)[i]!r}: got {dz.reshape(-1)[i]!r} want {want.reshape(-1)[i]!r}" for i in bad))
        if b is not None:
            got = np.asarray(from_kind(grads[1]), np.float64)
            if bkind == "c":
                axes = tuple(k for k in range(3) if k != dim)
                fin = np.isfinite(want)
                ref = np.where(fin, want, 0).sum(axis=axes) + np.where(fin, 0, want).sum(axis=axes)
                bnd = np.where(fin, bound, 0).sum(axis=axes)
            else:
                ref, bnd = want, bound
            bnd = bnd + np.spacing(np.abs(ref).astype(dtype)).astype(np.float64)
            r_round = _round(ref, dtype)
            okb = np.where(np.isnan(ref), np.isnan(got), np.where(np.isinf(r_round), got == r_round,
                                                                   np.abs(got - ref) <= bnd))
            if got.shape != ref.shape or not okb.all():
                failures.append(f"y= db: got {got.reshape(-1)[:4]!r}, want {ref.reshape(-1)[:4]!r}")
    return failures


def _bias_act_reference(call: Any, dtype: np.dtype, x: np.ndarray, b: np.ndarray | None, s: np.ndarray | None,
                        dy: np.ndarray) -> dict[str, np.ndarray]:
    """The float64 composition on z as kernels hold it: x * scale + b rounded to the compute precision
    (float32 below float64); `slack_*`: the effect of z's last bit, or of x * scale's where a kernel fuses
    x * scale + b into one rounding (FMA), measured on the reference itself; `bound_dz`: dz's elementwise
    bound, for the sums."""
    compute = np.float64 if dtype == np.float64 else np.float32
    eps = float(np.finfo(compute).eps)
    act, p, gain, clamp = call.act, call.act_p, call.kp["gain"], call.kp["clamp"]
    with np.errstate(all="ignore"):
        xc = x.astype(compute)
        xs = xc if s is None else xc * s.astype(compute)
        z = (xs if b is None else xs + b.astype(compute)).astype(np.float64)
        # z's error: its own last bit, or x * scale's where a kernel fuses x * scale + b (FMA) and b cancels it
        z_err = 2 * eps * (np.abs(z) + np.abs(xs.astype(np.float64)))
        d = dy.astype(np.float64)

        def fwd(zz):
            y = act.forward(zz, **p) * gain
            return y if clamp == np.inf else np.clip(y, -clamp, clamp)

        e = d * gain
        if clamp != np.inf:
            e = np.where(np.abs(act.forward(z, **p) * gain) > clamp, 0.0, e)

        def bwd(zz):
            return act.backward(e, zz, **p)

        def wiggle(f):
            base = f(z)
            out = np.zeros_like(base)
            for k in (-1, 1):
                out = np.maximum(out, np.abs(f(z + k * z_err) - base))
            return np.where(np.isfinite(out), out, 0.0)

        dz = bwd(z)
        sf = 1.0 if s is None else s.astype(np.float64)
        tol = act.tol.ulp(dtype.name) + 1
        spacing = np.spacing(np.abs(dz).astype(dtype)).astype(np.float64)
        floor = act.tol.bwd_atol * eps * np.abs(e) * cancel_terms(act, p, dtype, z)  # around f''s zero crossings
        bound_dz = tol * np.where(np.isfinite(spacing), spacing, 0) + floor + wiggle(bwd)
        return {"z": z, "y": fwd(z), "dx": dz * sf, "dz": dz, "e": e, "slack_y": wiggle(fwd),
                "slack_dx": wiggle(bwd) * np.abs(sf), "bound_dz": bound_dz}


# ---- second order: backward2, g * dy * f''(x) ------------------------------------------------------------

# The bound of a second derivative, beyond the op's own: one more product (g * dy) and a longer formula
# (ulps), and an absolute floor in eps * |g * dy| (f'' crosses zero away from any kink for most smooth
# ops: sigmoid at 0, gelu at +-sqrt(2), swish and mish twice; near there no formula is relatively
# accurate in the compute precision).
BWD2_EXTRA_ULP = 2
BWD2_ATOL = 8


def backward2_tolerance(spec: OpSpec) -> OpSpec:
    """The op with its tolerance widened for backward2 (judged by `compare` as a backward with scale
    |g * dy|): BWD2_EXTRA_ULP more ulps, and an absolute floor of at least BWD2_ATOL eps * |g * dy|."""
    from dataclasses import replace

    t = spec.tol
    e = BWD2_EXTRA_ULP
    tol = replace(t, ulp32=t.ulp32 + e, ulp64=t.ulp64 + e, ulp16=t.ulp16 + 1,
                  bwd_atol=max(t.bwd_atol, 0.0) + BWD2_ATOL)
    return replace(spec, tol=tol)


def backward2_reference(spec: OpSpec, params: dict[str, Any], dtype: Any, g: np.ndarray, dy: np.ndarray,
                        x: np.ndarray) -> np.ndarray:
    """The float64 reference of backward2 on the exact input values (parameters rounded to the compute
    precision, prelu's weight as given)."""
    p = _rounded(spec, params, dtype)
    a64 = [a.astype(np.float64) for a in (g, dy, x)]
    array = spec.defn.array_param
    if array:
        return spec.backward2(*a64, **{**p, array: p[array].astype(np.float64)})
    return spec.backward2(*a64, **p)


def backward2_zero_sign(spec: OpSpec, params: dict[str, Any], dtype: Any, g: np.ndarray, dy: np.ndarray,
                        x: np.ndarray) -> np.ndarray:
    """Where a zero backward2 result must carry the reference's sign: on a piece where f'' is identically
    0 (the reference gives +0 whatever g and dy are: relu's, elu's x > 0, softplus's linear branch), away
    from its ends by a few ulps, and
    where g * dy is +-0 and f''(x) is a normal number of the compute precision (float32 below float64).
    Elsewhere a zero's sign is the formula's (tanh''(+-0) is -+0 or +-0), not the contract's."""
    compute = np.float64 if np.dtype(dtype) == np.float64 else np.float32
    ones, nan = np.ones(x.shape), np.full(x.shape, np.nan)
    eps = float(np.finfo(compute).eps)
    with np.errstate(all="ignore"):
        x64 = x.astype(np.float64)
        # on the piece at x and a few ulps of the compute precision either side: at a branch boundary
        # computed in float32 (softplus's beta * x = threshold) a kernel may land on either piece
        ident = np.ones(x.shape, bool)
        for f in (1.0, 1 + 4 * eps, 1 - 4 * eps):
            ident &= backward2_reference(spec, params, dtype, ones, nan, x64 * f) == 0
        d2 = np.abs(backward2_reference(spec, params, dtype, ones, ones, x))
        gdy0 = (g.astype(np.float64) * dy.astype(np.float64)) == 0
    return ident | (gdy0 & np.isfinite(d2) & (d2 >= float(np.finfo(compute).tiny)))


def backward2_inputs(spec: OpSpec, params: dict[str, Any], dtype: Any, n: int = 600
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, Any], dict[str, Any]]:
    """(g, dy, x, call parameters, reference parameters): the suite's x (zero pairs, the op's sample with
    its kinks and the specials), dy and g random normal with +-0 beside x = +-0; prelu on 4 channels."""
    dtype = np.dtype(dtype)
    x0, dy0 = zero_pairs(dtype)
    x = np.concatenate([x0, sample_x(spec, params, dtype, n=n)])
    rng = np.random.default_rng(2)
    dy = np.concatenate([dy0, rng.standard_normal(x.size - x0.size).astype(dtype)])
    g0 = np.resize(np.array([1.0, -1.0, 0.5, -2.0, -0.0]), x0.size).astype(dtype)
    g = np.concatenate([g0, rng.standard_normal(x.size - x0.size).astype(dtype)])
    call_params, ref_params = dict(params), dict(params)
    array = spec.defn.array_param
    if array:  # a weight per channel of a 2-D x (4 channels on axis 1), or a single one
        m = x.size - x.size % 4
        x, dy, g = (a[:m].reshape(-1, 4) for a in (x, dy, g))
        call_params[array] = prelu_weight(x, params[array])
        w = call_params[array]
        ref_params = {array: w.reshape(1, -1) if w.size > 1 else w.reshape(1, 1), "axis": 1}
    return g, dy, x, call_params, ref_params


def run_backward2_case(backend: str | None, op: str, dtype: Any, params: dict[str, Any], to_kind: Any = None,
                       from_kind: Any = None, n: int = 600) -> Verdict:
    """Call `ma.backward2` on `backend` with the standard inputs for one (op, dtype, params) and judge it
    against the float64 reference with `backward2_tolerance` (scale |g * dy|)."""
    import multiact as ma

    spec = OPS[op]
    dtype = np.dtype(dtype)
    to_kind = to_kind or (lambda a: a)
    from_kind = from_kind or (lambda a: np.asarray(a))
    g, dy, x, call_params, ref_params = backward2_inputs(spec, params, dtype, n)
    got = from_kind(ma.backward2(op, to_kind(g), to_kind(dy), to_kind(x), backend=backend, **call_params))
    ref = backward2_reference(spec, ref_params, dtype, g, dy, x)
    sign = backward2_zero_sign(spec, ref_params, dtype, g, dy, x)
    with np.errstate(over="ignore"):
        scale = g.astype(np.float64) * dy.astype(np.float64)
    return compare(got, ref, x, backward2_tolerance(spec), "backward2", scale=scale, params=params,
                   zero_sign=sign)


def backward2_failures(backend: str | None, op: str, params: dict[str, Any], dtype: Any, to_kind: Any = None,
                       from_kind: Any = None, n: int = 600) -> list[str]:
    """One backward2 case; the failure described (empty when it passes)."""
    v = run_backward2_case(backend, op, dtype, params, to_kind, from_kind, n)
    return [] if v.passed else [f"backward2: {v.describe()}"]


# ---- bfloat16: every one of the 65,536 inputs --------------------------------------------------------
#
# bfloat16 has few enough values to try them all: x is every bit pattern (NaNs, +-inf, subnormals, +-0
# included), dy a fixed random bfloat16 array, and each result is judged against the float64 reference
# on the exact inputs rounded once to bfloat16 (`multiact.dtypes.f64_to_bf16_bits`): equal, or one
# bfloat16 ulp from it where the float32 computation's own error straddles a rounding boundary (counted:
# `Bf16Verdict.one_ulp`); NaN where the reference is NaN (a quiet NaN) and nowhere else; at x = +-inf
# exactly the reference's limit; a zero result at x = +-0 with the reference's sign.  Results whose
# reference is below the smallest normal may be off by up to it (flush-to-zero SIMD), as for the other
# dtypes.  The share of one-ulp results a case may have is the op's `Tolerance.bf16_one_ulp` (0.1%, but
# where an op's table entry says why not).

_BF16_TINY = 2.0 ** -126


def bf16_all() -> np.ndarray:
    """Every bfloat16 bit pattern, in order, as a bfloat16 array."""
    return np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(_dtypes._load())


def bf16_dy(n: int = 1 << 16, seed: int = 7) -> np.ndarray:
    """The fixed random dy of the exhaustive check (normal, scale 2), as bfloat16."""
    return _dtypes.from_float64(np.random.default_rng(seed).standard_normal(n) * 2.0)


@dataclass
class Bf16Verdict:
    """The outcome of one exhaustive bfloat16 case."""

    op: str
    direction: str
    params: dict[str, Any]
    n: int  # results judged
    one_ulp: int  # finite results one bfloat16 ulp from the correctly rounded reference
    n_bad: int
    bad: list[tuple[float, int, int]] = field(default_factory=list)  # (x, got bits, want bits)
    limit: float = 1e-3  # the share of one-ulp results allowed (the op's Tolerance.bf16_one_ulp)

    @property
    def passed(self) -> bool:
        # the share is a fact of the whole set of inputs; a sample of a few hundred may hold two of them
        allowed = self.limit * self.n if self.n >= 1 << 16 else max(self.limit * self.n, 2)
        return self.n_bad == 0 and self.one_ulp <= allowed

    def describe(self) -> str:
        head = (f"{self.op} {self.direction} {case_id(self.params)}: {self.one_ulp} of {self.n} one ulp off "
                f"({100 * self.one_ulp / max(self.n, 1):.3f}%, allowed {100 * self.limit:.1f}%), {self.n_bad} bad")
        return "\n".join([head, *(f"  x={x!r}: got 0x{g:04x}, want 0x{w:04x}" for x, g, w in self.bad[:8])])


def _ordered(bits: np.ndarray) -> np.ndarray:
    """bfloat16 bits as integers in the order of their values (+0 and -0 both 0), for ulp distances."""
    b = bits.astype(np.int32)
    mag = b & 0x7FFF
    return np.where(b & 0x8000, -mag, mag)


def judge_bf16(got: np.ndarray, ref: np.ndarray, x: np.ndarray, zero_in: np.ndarray | None = None
               ) -> tuple[int, int, np.ndarray]:
    """(results judged, one-ulp count, indices of bad results) of bfloat16 results `got` against the float64
    `ref` (see the section's comment); x: the inputs (float32), whose +-inf must give the limit exactly."""
    gb = np.ascontiguousarray(got).view(np.uint16).reshape(-1)
    r = np.asarray(ref, dtype=np.float64).reshape(-1)
    with np.errstate(invalid="ignore"):  # signalling NaNs among the patterns
        xs = np.asarray(x).astype(np.float64).reshape(-1)
    want = _dtypes.f64_to_bf16_bits(r)
    g_nan = (gb & 0x7FFF) > 0x7F80
    r_nan = np.isnan(r)
    dist = np.abs(_ordered(gb) - _ordered(want))
    g = _dtypes.bf16_bits_to_f32(gb).astype(np.float64)
    with np.errstate(invalid="ignore"):
        sub_ok = (np.abs(r) < _BF16_TINY) & (np.abs(g - r) <= _BF16_TINY)
    exact_needed = np.isinf(xs) | np.isinf(r)
    zero_in = (xs == 0) if zero_in is None else zero_in.reshape(-1)
    sign_bad = zero_in & (r == 0) & ((gb & 0x7FFF) == 0) & ((gb >> 15) != np.signbit(r))
    ok = np.where(r_nan, g_nan & ((gb & 0x0040) != 0),
                  ~g_nan & ((dist == 0) | (~exact_needed & ((dist == 1) | sub_ok))) & ~sign_bad)
    one = int(np.count_nonzero(~r_nan & ~exact_needed & (dist == 1) & ~sub_ok))
    return int(r.size), one, np.flatnonzero(~ok)


def bf16_cases() -> list[tuple[str, dict[str, Any], str]]:
    """(op, parameters, direction) of the exhaustive check: every op of the table with its parameter cases
    (`param_cases`), each elementwise direction it has there (`directions`, y-forms included) and its
    parameter gradient."""
    out = []
    for spec in OPS.values():
        for c in param_cases(spec):
            out += [(spec.name, c, d) for d in directions(spec, c)]
            if spec.param_grad is not None:
                out.append((spec.name, c, "param_grad"))
    return out


def bf16_key(op: str, params: dict[str, Any]) -> str:
    """The kernel key a case runs (what a backend's support table is asked about)."""
    spec = OPS[op]
    return spec.kernel_key(spec.defaults() if spec.defn.array_param in params else spec.validate(params))


def run_bf16_case(backend: str | None, op: str, params: dict[str, Any], direction: str,
                  x: np.ndarray | None = None, cache: dict | None = None, to_kind: Any = None,
                  from_kind: Any = None) -> Bf16Verdict:
    """One exhaustive case (x: every bfloat16 pattern unless a sample is given); `cache` keeps the float64
    references between backends (they do not depend on the backend); to_kind/from_kind move the NumPy
    inputs to the backend's array kind and its results back (as for `run_case`)."""
    import multiact as ma

    to = to_kind or (lambda a: a)
    back = from_kind or (lambda a: a)

    spec = OPS[op]
    x = bf16_all() if x is None else x
    dy = bf16_dy(x.size)
    call = dict(params)
    x_in, dy_in = x, dy
    array = spec.defn.array_param
    if array:  # a weight per channel of (-1, 4), or a single one
        x_in, dy_in = x.reshape(-1, 4), dy.reshape(-1, 4)
        w64 = np.array([0.25]) if params[array] == "single" else np.linspace(-0.5, 1.5, 4)
        call[array] = _dtypes.from_float64(w64)
    x32, dy32 = _dtypes.to_float32(x_in), _dtypes.to_float32(dy_in)
    ref_params = dict(call)
    if array:
        w32 = _dtypes.to_float32(call[array])
        ref_params = {array: w32.reshape(1, -1) if w32.size > 1 else w32.reshape(1, 1), "axis": 1}
    key = (op, case_id(params), direction, x.size)
    hit = None if cache is None else cache.get(key)
    with np.errstate(all="ignore"):
        if direction == "backward_y":
            y = _dtypes.from_float64(reference(spec, "forward", ref_params, np.float32, x32))
            y32 = _dtypes.to_float32(y)
            ref = hit if hit is not None else reference(spec, "backward_y", ref_params, np.float32, dy32, y32)
            got = back(ma.backward(op, to(dy_in), y=to(y), backend=backend, **call))
            x_judged, zero_in = y32, (y32 == 0) | (dy32 == 0)
        elif direction == "param_grad":
            ref = hit if hit is not None else np.asarray(
                reference(spec, "param_grad", ref_params, np.float32, dy32, x32), dtype=np.float64)
            got = np.asarray(back(ma.param_grad(op, spec.param_grad[0], to(dy_in), to(x_in), backend=backend,
                                                **call)))
            x_judged, zero_in = np.zeros(ref.shape), np.zeros(ref.shape, bool)
        else:
            args = (x32,) if direction == "forward" else (dy32, x32)
            ref = hit if hit is not None else reference(spec, direction, ref_params, np.float32, *args)
            got = back(ma.forward(op, to(x_in), backend=backend, **call) if direction == "forward"
                       else ma.backward(op, to(dy_in), to(x_in), backend=backend, **call))
            x_judged = x32
            zero_in = (x32 == 0) if direction == "forward" else (x32 == 0) | (dy32 == 0)
    if cache is not None:
        cache[key] = ref
    if not _dtypes.is_bf16(np.asarray(got).dtype):
        raise TypeError(f"{op} {direction} on bfloat16 returned {np.asarray(got).dtype}")
    n, one, bad = judge_bf16(got, ref, x_judged, zero_in)
    gb, wb = np.asarray(got).view(np.uint16).reshape(-1), _dtypes.f64_to_bf16_bits(np.asarray(ref)).reshape(-1)
    with np.errstate(invalid="ignore"):
        xs = np.asarray(x_judged).astype(np.float64).reshape(-1)
    return Bf16Verdict(op, direction, dict(params), n, one, int(bad.size),
                       [(float(xs[i]) if xs.size > i else 0.0, int(gb[i]), int(wb[i])) for i in bad[:20]],
                       spec.tol.bf16_one_ulp)
