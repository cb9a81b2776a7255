"""Fused bias (and per-channel scale) + activation + gain + clamp: `ma.bias_act` and `ma.bias_act_grad`.

    y = clip(act(x * scale + b) * gain, -clamp, clamp)

One kernel family, `bias_act:<act>` (every activation of the table but prelu, and `linear`), on x seen as
a 3-D view (outer, C, inner) with C = x.shape[dim]: b and scale are None, one value per channel (shape
(C,)), or x's shape seen the same way.  The backward writes dx and reduces db and dscale per channel
in the same pass (float64 sums); for a full-shape b or scale they are elementwise.  Clamped elements
get zero gradient (StyleGAN's rule: where |act(z) * gain| > clamp).  The float64 reference is composed
from the activation's.  The backward also runs from the forward's output (y=) where the activation, gain
and clamp allow it (`y_form_check`).  Host arrays go to the host backends as 3-D views; device arrays
(cuda) go as they are, with dim, to kernels that see them as strided views.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from . import _arrays, checks, core, elementwise
from . import dtypes as _dtypes
from ._layout import reshaped
from ._opdefs import BIAS_ACT, F32_MAX, CompositeDef, Param, composable
from .errors import YFormError
from .optable import LINEAR as LINEAR_SPEC
from .optable import OPS, OpSpec
from .plan import Blocks, Job, Plan, Result

LINEAR = LINEAR_SPEC.name


class BiasActCall:
    """One call's checked parameters: the activation (optable.LINEAR for linear), its parameters, the
    kernel's."""

    __slots__ = ("act", "act_p", "key", "kp", "dim")

    def __init__(self, act: OpSpec, act_p: dict, kp: dict, dim: int):
        self.act, self.act_p, self.kp, self.dim = act, act_p, kp, dim
        self.key = BIAS_ACT.key(act.kernel_key(act_p))

    def forward_ref(self, z: np.ndarray) -> np.ndarray:
        return self.act.forward(z, **self.act_p)

    def backward_ref(self, dy: np.ndarray, z: np.ndarray) -> np.ndarray:
        return self.act.backward(dy, z, **self.act_p)


DEFN = CompositeDef(
    "bias_act", "bias_act", "Fused bias (and scale) + activation + gain + clamp, in one pass.",
    "y = clip(act(x * scale + b) * gain, -clamp, clamp)",
    (Param("act", LINEAR, kind="act", doc="'linear' or an activation of the table but prelu; its parameters as "
           "keywords"),
     Param("dim", 1, kind="int", doc="the channel axis of x that b and scale run along"),
     Param("gain", 1.0, doc="multiplies the activation's output (StyleGAN: sqrt(2) for relu, lrelu, swish)"),
     Param("clamp", None, lo=0, doc="clip the result to [-clamp, clamp]; clipped elements get zero gradient")),
    lambda p, extra: (p["act"], dict(extra)), takes_act_params=True, module="BiasAct",
    cases=({"act": "relu", "gain": math.sqrt(2)}, {"act": "leaky_relu", "negative_slope": 0.2, "clamp": 256.0}),
)


def label(direction: str) -> str:
    return "bias_act()" if direction == "forward" else "bias_act_grad()"


def resolve(given: Mapping[str, Any], extra: Mapping[str, Any], fn: str) -> BiasActCall:
    own = {p.name: p.validate(fn, given.get(p.name, p.default)) for p in DEFN.params}
    name = own["act"]
    if name == LINEAR:
        if extra:
            raise TypeError(f"{fn}: unexpected keyword argument {sorted(extra)[0]!r}; linear's parameters: none")
        act, act_p = LINEAR_SPEC, {}
    else:
        act = OPS.get(name)
        if act is None or not composable(act.defn):
            valid = ", ".join([LINEAR] + [n for n, s in OPS.items() if composable(s.defn)])
            raise ValueError(f"{fn}: parameter 'act' must be 'linear' or an activation of the table but prelu, "
                             f"got {name!r}; valid: {valid}")
        act_p = elementwise.validated(act, dict(extra), fn)
    clamp = own["clamp"]
    kp = {**act_p, "gain": own["gain"], "clamp": math.inf if clamp is None else clamp}
    return BiasActCall(act, act_p, kp, own["dim"])


def kernel_key_of(op: str, params: Mapping[str, Any], fn: str) -> str | None:
    """The kernel key bias_act's parameters select (None for another op)."""
    if op != DEFN.name:
        return None
    names = DEFN.param_names
    return resolve({k: v for k, v in params.items() if k in names},
                   {k: v for k, v in params.items() if k not in names}, fn).key


def check_precision(call: BiasActCall, dtype: Any, fn: str) -> None:
    call.act.check_precision(call.act_p, dtype, fn)
    if getattr(dtype, "itemsize", 8) <= 4:
        for k in ("gain", "clamp"):
            v = call.kp[k]
            if v != math.inf and abs(v) > F32_MAX:
                raise ValueError(f"{fn}: parameter {k!r} = {v:g} does not fit float32, where {dtype} arrays "
                                 "are computed")


# ---- the y= form of the backward -----------------------------------------------------------------------
# dz = act'(z) * dy * gain read from the forward's output y = clip(act(z) * gain, -clamp, clamp), as
# StyleGAN's bias_act does (yy = y / gain; gradient 0 where y is not strictly inside (-clamp, clamp)):
# - act: "linear", or an activation whose definition has a y form (_opdefs: y_form) with its y condition
#   holding for these parameters (in float32 where the kernels compute float16 / float32 data);
# - gain: finite and nonzero, so that y / gain gives act(z) back;
# - an activation whose y form is its x formula read on y (y_form "same") and that is not positively
#   homogeneous (relu6, hardtanh: breakpoints away from 0) sees y / gain at its breakpoints, which only a
#   gain that is a power of two gives back exactly; for float16 data its float parameters (the breakpoints)
#   must also be float16 values (the stored y is);  relu and leaky_relu (breakpoint 0: a sign) take any gain;
# - clamp: any; the clipped elements are those with |y| >= clamp, clamp rounded as y is stored.  This
#   differs from the x form only where |act(z) * gain| == clamp exactly (the x form passes that gradient),
#   or where the storage rounding of y moves an element onto clamp;
# - scale: refused (dscale = sum(dz * x) needs x; pass x).  b is fine: db = sum(dz) needs no x.
# The y form is exact up to the storage rounding of y (dz is read at round(act(z) * gain) / gain).


def y_form_check(fn: str, call: BiasActCall, dtype: Any, scale: Any) -> None:
    """YFormError naming the argument where y= cannot give this call's gradient (the rules above)."""
    act, name = call.act, call.act.name
    if name != LINEAR:
        if act.backward_y is None:
            valid = ", ".join([LINEAR] + [n for n, s in OPS.items() if composable(s.defn) and s.backward_y])
            raise YFormError(f"{fn}: y= is not supported with act={name!r}: its derivative needs the input "
                             f"(x * scale + b); activations with a y form: {valid}")
        if not act.supports_y(call.act_p):
            raise YFormError(f"{fn}: y= with act={name!r} is only supported when {act.y_condition}")
        if dtype is not None and not act.supports_y(call.act_p, dtype):
            raise YFormError(f"{fn}: y= with act={name!r} is only supported when {act.y_condition}, in float32 "
                             f"(where the kernels compute {dtype})")
    gain = call.kp["gain"]
    if gain == 0 or not math.isfinite(gain):
        raise YFormError(f"{fn}: y= needs a finite nonzero gain (act(z) = y / gain), got parameter 'gain' = "
                         f"{gain!r}; pass x")
    if name != LINEAR and act.defn.y_form == "same" and not _homogeneous(call):
        if math.frexp(abs(gain))[0] != 0.5:
            raise YFormError(f"{fn}: y= with act={name!r} needs parameter 'gain' to be a power of two, got "
                             f"{gain!r}: {name}'s y form reads y / gain at its breakpoints, exact only then; "
                             "pass x")
        half = None if dtype is None else str(dtype).replace("torch.", "")
        if half in ("float16", "bfloat16"):
            for k in act.defn.float_params:
                v = call.act_p[k]
                stored = float(np.float16(v)) if half == "float16" else float(_dtypes.from_float64(v))
                if stored != float(np.float32(v)):
                    raise YFormError(f"{fn}: y= with act={name!r} on {half} needs parameter {k!r} to be a "
                                     f"{half} value (y is stored in {half}), got {v!r}; pass x")
    if scale is not None:
        raise YFormError(f"{fn}: y= with scale= is not supported: dscale = sum(dz * x) needs the input x; "
                         "pass x instead of y=")


_homogeneous_seen: dict[tuple, bool] = {}
_PROBES = np.array([-9.0, -6.0, -3.0, -1.5, -1.0, -0.4, -0.1, 0.0, 0.1, 0.4, 1.0, 1.5, 3.0, 6.0, 9.0])


def _homogeneous(call: BiasActCall) -> bool:
    """act(k z) == k act(z) for k > 0 (relu, leaky_relu), probed on the float64 reference: its derivative
    then reads only the sign of act(z), which y / gain keeps for any gain."""
    key = (call.act.name, tuple(sorted((k, repr(v)) for k, v in call.act_p.items())))
    hit = _homogeneous_seen.get(key)
    if hit is None:
        with np.errstate(all="ignore"):
            base = call.forward_ref(_PROBES)
            hit = all(np.allclose(call.forward_ref(_PROBES * k), base * k, rtol=1e-12, atol=0) for k in (0.3, 7.0))
        _homogeneous_seen[key] = hit
    return hit


def y_clamp(clamp: float, dtype: Any) -> float:
    """clamp as y holds it where the forward clipped: rounded to x's dtype (through float32 below float64),
    the largest finite value where that overflows (an inf would say 'no clamp'); inf stays inf."""
    if clamp == math.inf or np.dtype(dtype) == np.float64:
        return clamp
    t = np.dtype(dtype).type
    with np.errstate(over="ignore"):
        r = float(t(np.float32(clamp)))
    return float(np.finfo(t).max) if r == math.inf else r


def reference_backward_y(call: BiasActCall, dy: np.ndarray, y: np.ndarray, clamp: float | None = None) -> np.ndarray:
    """dz from y in float64 by the rules above (clamp: as y_clamp rounds it for y's dtype)."""
    with np.errstate(all="ignore"):
        dy, y = np.asarray(dy, np.float64), np.asarray(y, np.float64)
        gain = call.kp["gain"]
        c = call.kp["clamp"] if clamp is None else clamp
        e = dy * gain
        if c != math.inf:
            e = np.where(np.abs(y) >= c, 0.0, e)
        if call.act.name == LINEAR:
            return e
        return call.act.backward_y(e, y / gain, **call.act_p)


# ---- the float64 reference ----------------------------------------------------------------------------


def _z(x, b, s):
    z = x if s is None else x * s
    return z if b is None else z + b


def reference_forward(call: BiasActCall, x: np.ndarray, b: np.ndarray | None, s: np.ndarray | None) -> np.ndarray:
    """clip(act(x * s + b) * gain, -clamp, clamp) in float64 (b, s broadcast to x already, or None)."""
    with np.errstate(all="ignore"):
        f = [None if a is None else np.asarray(a, np.float64) for a in (x, b, s)]
        y = call.forward_ref(_z(*f)) * call.kp["gain"]
        c = call.kp["clamp"]
        return y if c == math.inf else np.clip(y, -c, c)


def reference_backward(call: BiasActCall, dy: np.ndarray, x: np.ndarray, b: np.ndarray | None,
                       s: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """(dx, dz) in float64 elementwise: dz = act'(z) * dy * gain, 0 where clipped; dx = dz * s.  db and
    dscale are sums of dz and dz * x over every axis but dim (or dz, dz * x for a full shape)."""
    with np.errstate(all="ignore"):
        dy, x = np.asarray(dy, np.float64), np.asarray(x, np.float64)
        b, s = (None if a is None else np.asarray(a, np.float64) for a in (b, s))
        z = _z(x, b, s)
        e = dy * call.kp["gain"]
        c = call.kp["clamp"]
        if c != math.inf:
            e = np.where(np.abs(call.forward_ref(z) * call.kp["gain"]) > c, 0.0, e)
        dz = call.backward_ref(e, z)
        return (dz if s is None else dz * s), dz


# ---- the plan -------------------------------------------------------------------------------------------


def axis_of(fn: str, shape: tuple[int, ...], dim: int) -> int:
    ndim = len(shape)
    if ndim == 0 or not -ndim <= dim < ndim:
        raise ValueError(f"{fn}: dim {dim} is out of range for x with {ndim} dims")
    return dim % ndim


def three(shape: tuple[int, ...], dim: int | None) -> tuple[int, int, int]:
    """(outer, C, inner) of x seen along dim (the whole array one channel when there is no dim)."""
    if dim is None:
        return 1, 1, int(np.prod(shape))
    return int(np.prod(shape[:dim])), shape[dim], int(np.prod(shape[dim + 1:]))


def _side(fn: str, name: str, a: Any, x: Any, dim: int, xn: str = "x") -> None:
    """b or scale is (C,) or x's shape, of x's dtype; TypeError / ValueError naming it."""
    if not hasattr(a, "dtype") or not hasattr(a, "shape"):
        raise TypeError(f"{fn}: {name} must be an array like x, got {type(a).__name__}")
    if checks.dtype_text(a) != checks.dtype_text(x):
        raise TypeError(f"{fn}: {name} has dtype {checks.dtype_text(a)} but {xn} has {checks.dtype_text(x)}; "
                        "they must match")
    shape = tuple(a.shape)
    if not (shape == tuple(x.shape) or len(shape) == 1 and shape[0] == x.shape[dim]):
        raise ValueError(f"{fn}: {name} has shape {shape}; expected ({x.shape[dim]},) to run along dim {dim} "
                         f"of {xn}, or {xn}'s shape {tuple(x.shape)}")


def channelwise(a: Any, x: Any) -> bool:
    """One value per channel (for 1-D x, the same thing as x's shape, and summed the same way)."""
    return a.ndim == 1 and (x.ndim == 1 or tuple(a.shape) != tuple(x.shape))


def rounded_sum(s: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """A float64 sum in the data's dtype, rounded once (a float16 sum beyond 65504 is inf, as NumPy would say;
    bfloat16 from float64 directly, not through float32)."""
    return _dtypes.cast_float64(s, dtype)


def forward(x: Any, b: Any, scale: Any, given: dict[str, Any], extra: dict[str, Any], out: Any,
            backend: str | None, quant: Any = None) -> Any:
    pl = plan("forward", {"x": x, "b": b, "scale": scale}, given, extra, out, backend)
    pl.quant = quant
    return core.run(pl)


def backward(dy: Any, x: Any, b: Any, scale: Any, given: dict[str, Any], extra: dict[str, Any], out: Any,
             backend: str | None, y: Any = None, quant: Any = None) -> Any:
    """dx, or (dx, db) with b, or (dx, db, dscale) with scale (db None without b); from the forward's
    output y instead of x where `y_form_check` allows it."""
    fn = label("backward")
    if y is not None and x is not None:
        raise ValueError(f"{fn}: pass the input x or the forward's output y=, not both")
    if y is None and x is None:
        raise TypeError(f"{fn} needs the input x (or, where the activation allows it, the forward's output y=)")
    main = {"x": x} if y is None else {"y": y}
    pl = plan("backward" if y is None else "backward_y", {**main, "b": b, "scale": scale, "dy": dy}, given, extra,
              out, backend)
    pl.quant = quant
    return core.run(pl)


def plan(direction: str, arrays: dict[str, Any], given: dict[str, Any], extra: dict[str, Any], out: Any,
         backend: str | None, partial: bool = False) -> Plan:
    fn = label("forward" if direction == "forward" else "backward")
    checks.check_backend(fn, backend)
    call = resolve(given, extra, fn)
    if direction == "backward_y":
        y = arrays["y"]
        y_form_check(fn, call, getattr(y, "dtype", None), arrays["scale"])
        if _arrays.kind_of(y) == "dask" or any(_arrays.kind_of(a) == "dask" for a in arrays.values()):
            raise TypeError(f"{fn}: y= is not supported on Dask arrays; pass x")
    return Plan(fn, f"bias_act ({call.key})", call.key, direction, call.kp, arrays, out, backend, FAMILY,
                (call, given, extra), partial)


class _BiasAct:
    """The family's side of the call core (multiact.plan.Family): x as a 3-D view (outer, C, inner) on the
    host, as it is (with dim) on a device."""

    join_dask = True  # host arrays beside a Dask array join it (else a call mixing them is refused)
    optional = frozenset({"b", "scale"})  # arrays that may be left out (None)
    masked = "masked arrays are not supported; pass np.ma.getdata(x)"

    def outs(self, plan: Plan) -> tuple:
        out = plan.out
        if out is None:
            return ()
        if plan.direction == "forward":
            return (out,)
        b, s = plan.arrays["b"], plan.arrays["scale"]
        n = 1 + (b is not None or s is not None) + (s is not None)
        if n == 1:
            return (out,)
        if not isinstance(out, (tuple, list)) or len(out) != n:
            what = "(dx, db)" if n == 2 else "(dx, db, dscale)"
            raise TypeError(f"{plan.fn}: out must be a tuple {what} matching the results, got {type(out).__name__}")
        if out[0] is None:
            raise TypeError(f"{plan.fn}: out[0] (dx) must be an array")
        return tuple(out)

    def returned(self, plan: Plan, values: list) -> Any:
        return values[0] if len(values) == 1 else tuple(values)

    def check(self, plan: Plan, dtype: Any) -> None:
        call = plan.state[0]
        check_precision(call, dtype, plan.fn)
        if plan.direction == "backward_y":
            y_form_check(plan.fn, call, dtype, plan.arrays["scale"])  # the storage dtype now known for sure

    def _prepare(self, plan: Plan, arrs: dict[str, Any]) -> tuple[str, Any, Any, Any, int | None]:
        fn, call = plan.fn, plan.state[0]
        xn = "y" if plan.direction == "backward_y" else "x"
        x, b, s = arrs[xn], arrs.get("b"), arrs.get("scale")
        dim = None if b is None and s is None else axis_of(fn, tuple(x.shape), call.dim)
        for name, a in (("b", b), ("scale", s)):
            if a is not None:
                _side(fn, name, a, x, dim, xn)
        if plan.direction != "forward":
            checks.same_as(fn, "dy", arrs["dy"], xn, x)
        return xn, x, b, s, dim

    def _results(self, plan: Plan, x: Any, b: Any, s: Any, dim: int | None, host: bool) -> tuple:
        """(dx, db, dscale) as the call returns them: db's place kept (None) where only scale is given; a
        per-channel db or dscale is a sum on the host, the kernel's own output on a device."""
        if plan.direction == "forward":
            return (Result("out", x),)
        if b is None and s is None:
            return (Result("out", x),)

        def side(name: str, a: Any) -> Result | None:
            if a is None:
                return None
            if host and channelwise(a, x):
                return Result(name, a, kernel=False, axes=(dim,), finish=functools.partial(rounded_sum, dtype=a.dtype))
            return Result(name, a)

        res = [Result("out[0]", x), side("out[1]", b)]
        if s is not None:
            res.append(side("out[2]", s))
        return tuple(res)

    def host(self, plan: Plan, arrs: dict[str, np.ndarray]) -> Job:
        call = plan.state[0]
        xn, x, b, s, dim = self._prepare(plan, arrs)
        o, c, i = three(x.shape, dim)
        b3, s3 = (None if a is None else a if channelwise(a, x) else a.reshape(o, c, i) for a in (b, s))
        x3 = x.reshape(o, c, i)
        results = self._results(plan, x, b, s, dim, host=True)
        if plan.direction == "forward":
            def fwd(kernel, arrays):
                _into(arrays, 0, (o, c, i), lambda r3: kernel(x3, b3, s3, r3))
                return {}

            return Job(x.dtype, results, call.kp, fwd)
        dy3 = arrs["dy"].reshape(o, c, i)
        k_b = 1 if b is not None else None  # the results' places of db and dscale
        k_s = 2 if s is not None else None
        kp = {**call.kp, "sum_db": k_b is not None and not results[1].kernel,
              "sum_dscale": k_s is not None and not results[2].kernel}
        if plan.direction == "backward_y":  # the kernel needs no b: dz comes from y alone; b only says db is wanted
            kp["clamp"] = y_clamp(call.kp["clamp"], x.dtype)
            b3 = s3 = None

        def bwd(kernel, arrays):
            views = [reshaped(arrays[0], (o, c, i))]
            for k in (k_b, k_s):
                full = k is not None and results[k].kernel
                views.append(reshaped(arrays[k], (o, c, i)) if full else (None, True))
            sums = kernel(dy3, x3, b3, s3, views[0][0], views[1][0], views[2][0])
            for k, (v, direct) in zip((0, k_b, k_s), views, strict=True):
                if v is not None and not direct:
                    arrays[k][...] = v.reshape(arrays[k].shape)
            values = {}
            for j, k in enumerate((k_b, k_s)):
                if k is not None and not results[k].kernel:
                    total = np.asarray(sums[j], np.float64)
                    values[k] = _keep(total, x.ndim, dim) if plan.partial else results[k].finish(total)
            return values

        return Job(x.dtype, results, kp, bwd)

    def device(self, plan: Plan, arrays: dict[str, Any]) -> Job:
        call = plan.state[0]
        xn, x, b, s, dim = self._prepare(plan, arrays)
        kp = {**call.kp, "dim": dim}
        results = self._results(plan, x, b, s, dim, host=False)
        if plan.direction == "forward":
            def fwd(kernel, res):
                kernel(x, b, s, res[0])
                return {}

            return Job(x.dtype, results, kp, fwd)
        if plan.direction == "backward_y":
            kp["clamp"] = y_clamp(call.kp["clamp"], np.dtype(checks.dtype_text(x)))
        y_form = plan.direction == "backward_y"
        dy = arrays["dy"]

        def bwd(kernel, res):
            db = res[1] if len(res) > 1 else None
            ds = res[2] if len(res) > 2 else None
            kernel(dy, x, None if y_form else b, None if y_form else s, res[0], db, ds)
            return {}

        return Job(x.dtype, results, kp, bwd)

    def blocks(self, plan: Plan, arrays: dict[str, Any]) -> Blocks:
        fn, call = plan.fn, plan.state[0]
        x = arrays["x"]
        if any(math.isnan(n) for n in x.shape):
            raise ValueError(f"{fn}: x has unknown chunk sizes (NaN); x.compute_chunk_sizes() first")
        b, s, dy = arrays.get("b"), arrays.get("scale"), arrays.get("dy")
        dim = None if b is None and s is None else axis_of(fn, tuple(x.shape), call.dim)
        ind = tuple(range(x.ndim))
        args: list[tuple[Any, tuple | None]] = [(x, ind)]
        if dy is not None:
            checks.same_as(fn, "dy", dy, "x", x)
            args.append((dy.rechunk(x.chunks), ind))
        sides = {}
        for name, a in (("b", b), ("scale", s)):
            if a is None:
                continue
            _side(fn, name, a, x, dim)
            per_channel = channelwise(a, x)
            sides[name] = a.rechunk((x.chunks[dim],) if per_channel else x.chunks)
            args.append((sides[name], (dim,) if per_channel else ind))
        names = ("x",) + (("dy",) if dy is not None else ()) + tuple(sides)
        rebuild = functools.partial(_chunk_plan, plan.direction, plan.state[1], plan.state[2], plan.backend, names)
        return Blocks(args, ind, rebuild, self._results(plan, x, b, s, dim, host=True), x)


FAMILY = _BiasAct()


def _into(arrays: list, k: int, shape: tuple[int, int, int], write: Any) -> None:
    """Let `write` fill result k through a 3-D view of its array, or a scratch array copied back."""
    v, direct = reshaped(arrays[k], shape)
    write(v)
    if not direct:
        arrays[k][...] = v.reshape(arrays[k].shape)


def _keep(total: np.ndarray, ndim: int, dim: int) -> np.ndarray:
    """A chunk's per-channel float64 sums as its block of the partials array: 1 on every axis but dim."""
    shape = [1] * ndim
    shape[dim] = total.size
    return total.reshape(shape)


def _chunk_plan(direction: str, given: dict, extra: dict, backend: str | None, names: tuple[str, ...],
                *blocks: Any) -> Plan:
    """The plan of one chunk: its blocks in the order Blocks gave them."""
    got = dict(zip(names, blocks, strict=True))
    arrays = {"x": got["x"], "b": got.get("b"), "scale": got.get("scale")}
    if direction != "forward":
        arrays["dy"] = got["dy"]
    return plan(direction, arrays, given, extra, None, backend, partial=True)


# ---- the public functions -----------------------------------------------------------------------------


def bias_act(x: Any, b: Any = None, act: str = LINEAR, *, dim: int = 1, scale: Any = None, gain: float = 1.0,
             clamp: float | None = None, out: Any = None, backend: str | None = None, quant: Any = None,
             **act_params: Any) -> Any:
    return forward(x, b, scale, {"act": act, "dim": dim, "gain": gain, "clamp": clamp}, act_params, out, backend,
                   quant)


def bias_act_grad(dy: Any, x: Any = None, b: Any = None, act: str = LINEAR, *, dim: int = 1, scale: Any = None,
                  gain: float = 1.0, clamp: float | None = None, y: Any = None, out: Any = None,
                  backend: str | None = None, quant: Any = None, **act_params: Any) -> Any:
    return backward(dy, x, b, scale, {"act": act, "dim": dim, "gain": gain, "clamp": clamp}, act_params, out,
                    backend, y, quant)


def _doc() -> str:
    lines = [f"    {p.name}: {p.range_text()} ({'optional' if p.default is None else f'default {p.default!r}'})"
             f"; {p.doc}" for p in DEFN.params]
    return "\n".join(lines)


bias_act.__doc__ = f"""{DEFN.summary}

    {DEFN.formula}

x: any shape; b, scale: None, one value per channel (shape (x.shape[dim],)), or x's shape.
Parameters:
{_doc()}
    **act_params: the activation's own parameters (PyTorch's names)

out: write the result here (out=x is in place); backend: run on this backend only.
quant: a multiact.Quant: return (codes, scales) of the float32 result instead (multiact.quantize's contract)."""

bias_act_grad.__doc__ = f"""Backward of bias_act: dx, and db (with b) and dscale (with scale).

Returns dx alone without b and scale; (dx, db) with b; (dx, db, dscale) with scale (db is None
without b).  Per-channel db and dscale are summed over every axis but dim in float64 and returned in
x's dtype; for a full-shape b or scale they are elementwise.  Clamped elements get zero gradient.
Parameters as bias_act's; out: a tuple matching the results (out[0] may be x: in place).

y=: the forward's output instead of x (bias_act_grad(dy, None, b, act, y=y, ...); b only says db is
wanted): for linear and the activations with a y form (their y condition holding), a finite nonzero
gain (a power of two for relu6 and hardtanh), any clamp (zero gradient where |y| >= clamp, StyleGAN's
rule: it differs from the x form only where act(z) * gain hits clamp exactly), and no scale (dscale
needs x).  Anything else is a YFormError naming the argument.
quant: a multiact.Quant: dx as (codes, scales) of its float32 values (multiact.quantize's contract), db and
dscale in float32: ((codes, scales), db) with b, ((codes, scales), db, dscale) with scale.
{_doc()}"""

FUNCTIONS = {"bias_act": bias_act, "bias_act_grad": bias_act_grad}
for _f in FUNCTIONS.values():
    _f.__module__ = "multiact"
del _f
