"""The gated family (glu, swiglu, geglu, reglu): from the caller's arguments to a `gated:<act>` kernel.

A gated op is an activation of the table times a second array, so it is one elementwise kernel of two
inputs (gate, up) and, in the backward, two outputs (dgate, dup).  Every layout reduces to views: the
halves of x along `dim`, its even and odd elements (interleaved), or two arrays (the two-input form);
`activate` only says which view is the gate.  The kernels see views and never copy; the backward of
the one-input form writes both halves of dx in the same pass.  The float64 reference is composed
from the table's references, so the family adds no formula of its own.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from . import checks, core, elementwise
from ._opdefs import COMPOSITE_DEFINITIONS, F32_MAX, GATED, CompositeDef, composable
from .dequant import DOC as DEQUANT_DOC
from .optable import FAMILY_KEYS, OPS, OpSpec, value_key
from .plan import Blocks, Job, Plan, Result


class GatedCall:
    """One call's checked parameters: the activation, its parameters, and the kernel's."""

    __slots__ = ("act", "act_p", "key", "kp", "dim", "gate_first", "layout")

    def __init__(self, act: OpSpec, act_p: dict, key: str, kp: dict, dim: int, gate_first: bool, layout: str):
        self.act, self.act_p, self.key, self.kp = act, act_p, key, kp
        self.dim, self.gate_first, self.layout = dim, gate_first, layout


def label(cdef: CompositeDef, direction: str) -> str:
    return f"{cdef.name}()" if direction == "forward" else f"{cdef.name}_grad()"


_PLAIN = (int, float, str, type(None))
_resolved: dict[tuple, GatedCall] = {}


def resolve(cdef: CompositeDef, given: Mapping[str, Any], extra: Mapping[str, Any], fn: str) -> GatedCall:
    """Check the op's own parameters, pick its activation and check the activation's; ValueError or
    TypeError naming the parameter and `fn`.  Calls with plain values (numbers, str, None) are remembered
    by value (+0.0 and -0.0 apart); anything else (a tensor, a 0-d array) is read afresh each call."""
    try:
        key = (cdef.name, fn, *((k, type(v), value_key(v)) for k, v in given.items()),
               *((k, type(v), value_key(v)) for k, v in sorted(extra.items())))
        plain = all(type(v) in _PLAIN for v in (*given.values(), *extra.values()))
    except TypeError:
        plain = False
    if plain:
        hit = _resolved.get(key)
        if hit is None:
            hit = _resolve(cdef, given, extra, fn)
            if len(_resolved) < 4096:
                _resolved[key] = hit
        return hit
    return _resolve(cdef, given, extra, fn)


def _resolve(cdef: CompositeDef, given: Mapping[str, Any], extra: Mapping[str, Any], fn: str) -> GatedCall:
    own = {p.name: p.validate(fn, given.get(p.name, p.default)) for p in cdef.params}
    name, act_given = cdef.activation(own, extra)
    act = OPS.get(name) if isinstance(name, str) else None
    if act is None or not composable(act.defn):
        valid = ", ".join(n for n, s in OPS.items() if composable(s.defn))
        raise ValueError(f"{fn}: parameter 'act' must be an activation of the table but prelu, got {name!r}; "
                         f"valid: {valid}")
    if extra and not cdef.takes_act_params:  # the generated signatures refuse these before here
        raise TypeError(f"{fn}: unexpected keyword arguments {sorted(extra)}")
    act_p = elementwise.validated(act, act_given, fn)
    limit = own.get("limit")
    kp = {**act_p, "limit": math.inf if limit is None else limit, "shift": 0.0 if limit is None else 1.0}
    return GatedCall(act, act_p, GATED.key(act.kernel_key(act_p)), kp, own["dim"], own["activate"] == "first",
                     own["layout"])


def kernel_key_of(op: str, params: Mapping[str, Any], fn: str) -> str | None:
    """The kernel key a gated op's parameters select (None for an op that is not one)."""
    cdef = COMPOSITE_DEFINITIONS.get(op)
    if cdef is None:
        return None
    given = {k: v for k, v in params.items() if k in cdef.param_names}
    extra = {k: v for k, v in params.items() if k not in cdef.param_names}
    if extra and not cdef.takes_act_params:
        raise TypeError(f"{fn}: unexpected parameters for {op}: {sorted(extra)}")
    return resolve(cdef, given, extra, fn).key


def check_precision(call: GatedCall, dtype: Any, fn: str) -> None:
    call.act.check_precision(call.act_p, dtype, fn)
    if getattr(dtype, "itemsize", 8) <= 4 and call.kp["limit"] != math.inf and call.kp["limit"] > F32_MAX:
        raise ValueError(f"{fn}: parameter 'limit' = {call.kp['limit']:g} does not fit float32, where "
                         f"{dtype} arrays are computed")


def split_axis(fn: str, shape: tuple[int, ...], dim: int, layout: str) -> int:
    ndim = len(shape)
    if ndim == 0 or not -ndim <= dim < ndim:
        raise ValueError(f"{fn}: dim {dim} is out of range for x with {ndim} dims")
    dim %= ndim
    if shape[dim] % 2:
        raise ValueError(f"{fn}: x.shape[{dim}] = {shape[dim]} must be even, to split into the two halves "
                         f"({layout})")
    return dim


def split(x: Any, dim: int, layout: str) -> tuple[Any, Any]:
    """The two views (first, second) of x along `dim` (normalised, of even length)."""
    half = x.shape[dim] // 2
    head = (slice(None),) * dim
    if layout == "interleaved":
        return x[head + (slice(0, None, 2),)], x[head + (slice(1, None, 2),)]
    return x[head + (slice(0, half),)], x[head + (slice(half, None),)]


def pair(call: GatedCall, first: Any, second: Any) -> tuple[Any, Any]:
    """(gate, up) from the two views."""
    return (first, second) if call.gate_first else (second, first)


# ---- the float64 reference, composed from the table's -------------------------------------------------


def clipped(gate: np.ndarray, up: np.ndarray, kp: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    limit = kp["limit"]
    g = np.where(gate > limit, limit, gate)  # NaN stays NaN
    u = np.where(up > limit, limit, np.where(up < -limit, -limit, up))
    return g, (u + kp["shift"] if kp["shift"] else u)  # adding 0.0 would turn -0 into +0


def reference_forward(act: OpSpec, kp: Mapping[str, Any], gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """act(min(gate, limit)) * (clamp(up, -limit, limit) + shift), in float64."""
    p = _act_params(act, kp)
    with np.errstate(all="ignore"):
        g, u = clipped(np.asarray(gate, np.float64), np.asarray(up, np.float64), kp)
        return act.forward(g, **p) * u


def reference_backward(act: OpSpec, kp: Mapping[str, Any], dy: np.ndarray, gate: np.ndarray,
                       up: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(dgate, dup) in float64, as autograd of the composition gives them (the product's backward, then
    the activation's: dgate = act_backward(dy * u, g)); zero where the clip is hit."""
    p = _act_params(act, kp)
    with np.errstate(all="ignore"):
        gate, up, dy = (np.asarray(a, np.float64) for a in (gate, up, dy))
        g, u = clipped(gate, up, kp)
        dgate = act.backward(dy * u, g, **p)
        dup = dy * act.forward(g, **p)
        limit = kp["limit"]
        return np.where(gate > limit, 0.0, dgate), np.where(np.abs(up) > limit, 0.0, dup)


def _act_params(act: OpSpec, kp: Mapping[str, Any]) -> dict[str, Any]:
    return {k: kp[k] for k in act.param_names}


# ---- the plan -------------------------------------------------------------------------------------------


def check_form(fn: str, given: Mapping[str, Any], up: Any) -> None:
    """dim and layout belong to the one-input form."""
    if up is not None and (given.get("layout", "halves") != "halves" or given.get("dim", -1) != -1):
        raise ValueError(f"{fn}: with up= (the two-input form) x and up are the two halves already: dim and "
                         "layout apply to the one-input form only")


def forward(cdef: CompositeDef, x: Any, up: Any, given: dict[str, Any], extra: dict[str, Any], out: Any,
            backend: str | None, quant: Any = None, dequant: Any = None) -> Any:
    """y = act(gate) * up: half of x along dim (one-input form), or x's shape (two-input form); (codes, scales)
    with quant= (a multiact.Quant); an int32 x read through dequant= (a multiact.Dequant)."""
    pl = plan(cdef, "forward", x, up, None, given, extra, out, backend)
    pl.quant, pl.dequant = quant, dequant
    return core.run(pl)


def backward(cdef: CompositeDef, dy: Any, x: Any, up: Any, given: dict[str, Any], extra: dict[str, Any],
             out: Any, backend: str | None) -> Any:
    """dx (x's shape: both halves written in one pass), or (dgate, dup) for the two-input form."""
    return core.run(plan(cdef, "backward", x, up, dy, given, extra, out, backend))


def plan(cdef: CompositeDef, direction: str, x: Any, up: Any, dy: Any, given: dict[str, Any], extra: dict[str, Any],
         out: Any, backend: str | None, partial: bool = False) -> Plan:
    fn = label(cdef, direction)
    checks.check_backend(fn, backend)
    check_form(fn, given, up)
    call = resolve(cdef, given, extra, fn)
    arrays = {"x": x, "up": up} if direction == "forward" else {"x": x, "up": up, "dy": dy}
    state = (cdef, call, given, extra)
    return Plan(fn, f"{cdef.name} ({call.key})", call.key, direction, call.kp, arrays, out, backend, FAMILY, state,
                partial)


def _views(fn: str, call: GatedCall, x: Any, up: Any) -> tuple[Any, Any, int | None]:
    """(gate, up, dim) of x's halves along dim, or of the two arrays (dim None)."""
    if up is not None:
        checks.same_as(fn, "up", up, "x", x)
        return (*pair(call, x, up), None)
    dim = split_axis(fn, tuple(x.shape), call.dim, call.layout)
    return (*pair(call, *split(x, dim, call.layout)), dim)


class _Gated:
    """The family's side of the call core (multiact.plan.Family)."""

    join_dask = False  # host arrays beside a Dask array join it (else a call mixing them is refused)
    optional = frozenset({"up"})  # arrays that may be left out (None)
    masked = ("masked arrays are not supported by the gated ops; pass np.ma.getdata(x) and combine the masks of "
              "the two halves yourself")

    def outs(self, plan: Plan) -> tuple:
        out, up = plan.out, plan.arrays["up"]
        if out is None:
            return ()
        if plan.direction == "forward" or up is None:
            return (out,)
        if not isinstance(out, (tuple, list)) or len(out) != 2:
            raise TypeError(f"{plan.fn}: with up= out must be a pair (dgate, dup), got {type(out).__name__}")
        return tuple(out)

    def returned(self, plan: Plan, values: list) -> Any:
        return values[0] if len(values) == 1 else tuple(values)

    def check(self, plan: Plan, dtype: Any) -> None:
        check_precision(plan.state[1], dtype, plan.fn)

    def host(self, plan: Plan, arrs: dict[str, Any]) -> Job:
        return self._job(plan, arrs)

    def device(self, plan: Plan, arrays: dict[str, Any]) -> Job:
        return self._job(plan, arrays)

    def _job(self, plan: Plan, arrs: dict[str, Any]) -> Job:
        """The same views for every kind: halves of x (or x and up) are slices, which any array library has."""
        fn, call = plan.fn, plan.state[1]
        x, up = arrs["x"], arrs.get("up")
        gate, upv, dim = _views(fn, call, x, up)
        if plan.direction == "forward":
            def fwd(kernel, arrays):
                kernel(gate, upv, arrays[0])
                return {}

            return Job(x.dtype, (Result("out", gate),), call.kp, fwd)
        dy = arrs["dy"]
        checks.same_as(fn, "dy", dy, "the result", gate)
        if up is None:
            def bwd(kernel, arrays):
                kernel(dy, gate, upv, *pair(call, *split(arrays[0], dim, call.layout)))
                return {}

            return Job(x.dtype, (Result("out", x),), call.kp, bwd)

        def bwd_pair(kernel, arrays):  # the gradients in the order of the arguments (x, up)
            kernel(dy, gate, upv, *pair(call, arrays[0], arrays[1]))
            return {}

        return Job(x.dtype, (Result("out[0]", x), Result("out[1]", up)), call.kp, bwd_pair)

    def blocks(self, plan: Plan, arrays: dict[str, Any]) -> Blocks:
        fn = plan.fn
        cdef, call, given, extra = plan.state
        x, up, dy = arrays["x"], arrays.get("up"), arrays.get("dy")
        ind = tuple(range(x.ndim))
        rebuild = functools.partial(_chunk_plan, cdef.name, plan.direction, given, extra, plan.backend,
                                    tuple(arrays))
        if up is not None:  # two arrays aligned blockwise, like an elementwise op's
            for n, a in arrays.items():
                _same_known(fn, n, a, "x", x)
            res = (Result("out", x),) if dy is None else (Result("out[0]", x), Result("out[1]", up))
            return Blocks([(a, ind) for a in arrays.values()], ind, rebuild, res, x)
        if x.ndim and -x.ndim <= call.dim < x.ndim and math.isnan(x.shape[call.dim % x.ndim]):
            raise ValueError(f"{fn}: x.shape[{call.dim}] is unknown (NaN chunks); the gated ops split x along dim, "
                             "so its length must be known: x.compute_chunk_sizes() first")
        dim = split_axis(fn, tuple(x.shape), call.dim, call.layout)
        x = x.rechunk({dim: -1})  # each chunk holds the whole dim axis: both halves
        if dy is None:
            return Blocks([(x, ind)], ind, rebuild, (Result("out", x),), x, adjust={dim: _half})
        half = tuple(n // 2 if i == dim else n for i, n in enumerate(x.shape))
        _same_known(fn, "dy", dy, "the result", _Like(x.dtype, half))
        # dy's dim axis has a label of its own (half x's length, one chunk): concatenate hands the whole block
        dy_ind = tuple(x.ndim if i == dim else i for i in ind)
        return Blocks([(x, ind), (dy.rechunk({dim: -1}), dy_ind)], ind, rebuild, (Result("out", x),), x,
                      concatenate=True)


FAMILY = _Gated()


class _Like:
    """A dtype and a shape (the result a dy must match)."""

    def __init__(self, dtype: Any, shape: tuple):
        self.dtype, self.shape = dtype, shape


def _same_known(fn: str, name: str, a: Any, ref_name: str, ref: Any) -> None:
    """checks.same_as where both shapes are known (a Dask array's may have NaN lengths)."""
    if any(isinstance(n, float) and math.isnan(n) for n in (*a.shape, *ref.shape)):
        if str(a.dtype) != str(ref.dtype):
            raise TypeError(f"{fn}: {name} has dtype {a.dtype} but {ref_name} has {ref.dtype}; they must match")
        return
    checks.same_as(fn, name, a, ref_name, ref)


def _half(n: int) -> int:
    return n // 2


def _chunk_plan(name: str, direction: str, given: dict, extra: dict, backend: str | None, names: tuple[str, ...],
                *blocks: Any) -> Plan:
    """The plan of one chunk: x (and up), and for a backward dy, in the order Blocks gave them."""
    got = dict(zip(names, blocks, strict=True))
    return plan(COMPOSITE_DEFINITIONS[name], direction, got["x"], got.get("up"), got.get("dy"), given, extra, None,
                backend, partial=True)


# ---- the public functions, generated from the definitions ---------------------------------------------

_FWD = """
def {name}(x{pos}, *, up=None{kw}, out=None, backend=None, quant=None, dequant=None{star}):
    return _forward(_cdef, x, up, {pdict}, {extra}, out, backend, quant, dequant)
"""
_BWD = """
def {name}_grad(dy, x{pos}, *, up=None{kw}, out=None, backend=None{star}):
    return _backward(_cdef, dy, x, up, {pdict}, {extra}, out, backend)
"""

_POSITIONAL = ("dim", "approximate")  # after x, as the signatures and F.glu(x, dim) have them


def _param_doc(cdef: CompositeDef) -> str:
    lines = []
    for p in cdef.params:
        default = "optional" if p.default is None else f"default {p.default!r}"
        lines.append(f"    {p.name}: {p.range_text()} ({default}){'; ' + p.doc if p.doc else ''}")
    if cdef.takes_act_params:
        lines.append("    **act_params: the activation's own parameters (PyTorch's names)")
    return "\n".join(lines)


def _make(cdef: CompositeDef) -> dict[str, Any]:
    pos = [p for p in cdef.params if p.name in _POSITIONAL]
    kw = [p for p in cdef.params if p.name not in _POSITIONAL]
    fields = {
        "name": cdef.name,
        "pos": "".join(f", {p.name}={p.default!r}" for p in pos),
        "kw": "".join(f", {p.name}={p.default!r}" for p in kw),
        "star": ", **act_params" if cdef.takes_act_params else "",
        "pdict": "{" + ", ".join(f"{p.name!r}: {p.name}" for p in cdef.params) + "}",
        "extra": "act_params" if cdef.takes_act_params else "{}",
    }
    ns: dict[str, Any] = {"_cdef": cdef, "_forward": forward, "_backward": backward}
    exec(compile(_FWD.format(**fields) + _BWD.format(**fields), f"<multiact.{cdef.name}>", "exec"), ns)  # noqa: S102
    params = _param_doc(cdef)
    common = ("up: the second array (the two-input form: x is then the gate and up multiplies it);\n"
              "out: write the result here; backend: run on this backend only.")
    quant = "\nquant: a multiact.Quant: return (codes, scales) of the float32 result instead (forward only)."
    fwd, bwd = ns[cdef.name], ns[f"{cdef.name}_grad"]
    fwd.__doc__ = f"{cdef.summary}\n\n    {cdef.formula}\n\nParameters:\n{params}\n\n{common}{quant}{DEQUANT_DOC}"
    bwd.__doc__ = (f"Backward of {cdef.name}: dx with x's shape (both halves, one pass), or (dgate, dup) with "
                   f"up=.\n\nParameters:\n{params}\n\n{common} out is dx, or a pair (dgate, dup) with up=.")
    for f in (fwd, bwd):
        f.__module__ = "multiact"
    return {fwd.__name__: fwd, bwd.__name__: bwd}


FUNCTIONS: dict[str, Any] = {}
for _cdef in COMPOSITE_DEFINITIONS.values():
    FUNCTIONS.update(_make(_cdef))
del _cdef

__all__ = ["FAMILY_KEYS", "FUNCTIONS", "reference_backward", "reference_forward", "resolve", "split"]
