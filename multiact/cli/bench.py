"""Side-by-side timing of multiact's backends and its peers on the same arrays, in one run.

For each (op, params, dtype, size, threads, direction) every implementation is
bound to the same input arrays; a plain copy of the same number of bytes is
timed with them as the bandwidth limit.  Calls are warmed up, then timed in
rounds that visit the implementations in a rotating order (so a noisy neighbour
or a clock change hits all of them alike); a sample is the mean of enough calls
to last a couple of milliseconds; the result is the median and the
interquartile range of the samples.  Allocating calls and calls into a
preallocated `out` are separate rows.

The figures say how far they can be trusted: a configuration whose rows spread (IQR over the
median) by more than `max_spread` is timed again, up to `resample` times, and a row still noisy is
flagged; every ratio comes with the range its quartiles allow; a figure faster than the copy of the
same bytes (which no elementwise kernel can beat from memory) is flagged with the likely reason;
`load_warning` says when other processes hold the cores.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import numpy as np

from .. import registry
from .._opdefs import COMPOSITE_DEFINITIONS
from ..consistency import param_cases
from ..fused_bias_act import DEFN as _BIAS_DEFN
from ..optable import OPS, REQUIRED, get
from . import peers as P

# The ops a bare `multiact bench` compares: the common ones, which every peer has.
DEFAULT_OPS = ("relu", "leaky_relu", "gelu", "gelu:approximate=tanh", "silu", "sigmoid", "tanh", "elu", "softplus",
               "mish", "hardswish")
DEFAULT_SIZES = (1 << 10, 1 << 16, 1 << 20, 1 << 24)
# backward_y: the gradient from the forward output y (what autograd saves for sigmoid, tanh, elu...);
# forward_backward: a forward and its backward, one after the other (torch's peer: autograd).
DIRECTIONS = ("forward", "backward", "backward_y", "forward_backward")
SHORT_DIRECTION = {"forward": "fwd", "backward": "bwd", "backward_y": "bwd_y", "forward_backward": "fwd+bwd"}
# Arrays read + written per element in each direction (the copy baseline moves as many bytes).
STREAMS = {"forward": 2, "backward": 3, "backward_y": 3, "forward_backward": 5}
MAX_SPREAD = 0.25  # a row whose IQR exceeds this fraction of its median is timed again, then flagged
RESAMPLE = 2  # how many times a noisy configuration is timed again
BELOW_COPY = "below copy (streaming stores / cache)"
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    """'1K' -> 1024, '16M' -> 16777216, '3000' -> 3000 (K and M are powers of two)."""
    t = text.strip().upper()
    unit = t[-1] if t and t[-1] in _UNITS else ""
    try:
        n = int(float(t[: len(t) - len(unit)]) * _UNITS[unit])
    except ValueError:
        raise ValueError(f"bad size {text!r}: use a number with an optional K or M suffix, e.g. 64K") from None
    if n < 1:
        raise ValueError(f"bad size {text!r}: must be at least 1")
    return n


def size_label(n: int) -> str:
    for unit in ("G", "M", "K"):
        if n % _UNITS[unit] == 0:
            return f"{n // _UNITS[unit]}{unit}"
    return str(n)


BIAS_ACT = "bias_act"
# The gated ops (glu, swiglu, geglu, reglu): timed on (rows, 2 * hidden) along dim=-1, hidden up to 4096.
GATED = tuple(name for name, c in COMPOSITE_DEFINITIONS.items() if c.family == "gated")
# Elements read + written per element of x: the output (and dy) are half of x.
_GATED_STREAMS = {"forward": 1.5, "backward": 2.5, "forward_backward": 4.0}
# bias_act's shapes: dim=1 of an NCHW array (H*W = 64*64, 64 channels where the size allows), or dim=-1
# with the transformer's hidden size 4096 (StyleGAN's and Megatron's uses).
BIAS_ACT_DIMS = {1: "NCHW", -1: "last"}


@dataclass(frozen=True)
class OpCase:
    """An op with the parameters it is timed with ('gelu:approximate=tanh' on the command line;
    'bias_act:act=gelu:dim=1': the fused op, its activation and that activation's parameters)."""

    op: str
    params: tuple[tuple[str, Any], ...]

    @property
    def label(self) -> str:
        if self.op == BIAS_ACT:
            p = dict(self.params)
            act = OpCase(p["act"], tuple((k, v) for k, v in self.params if k not in _BIAS_OWN)).label \
                if p["act"] in OPS else p["act"]
            shown = [f"{k}={p[k]}" for k in _BIAS_OWN if k not in ("act", "dim") and p[k] != _BIAS_DEFAULTS[k]]
            return f"bias_act({','.join([act, *shown, 'dim=' + str(p['dim'])])})"
        if self.op in GATED:
            own = {p.name: p.default for p in COMPOSITE_DEFINITIONS[self.op].params}
            shown = [f"{k}={v}" for k, v in self.params if k not in own or own[k] != v]
            return self.op + (f"({','.join(shown)})" if shown else "")
        spec = OPS[self.op]
        shown = [f"{k}={v}" for k, v in self.params if k != spec.defn.array_param and spec.defaults().get(k, None) != v]
        return self.op + (f"({','.join(shown)})" if shown else "")

    def streams(self, direction: str) -> float:
        """Arrays of x's size read + written in this direction (the copy baseline moves as many bytes)."""
        return _GATED_STREAMS[direction] if self.op in GATED else STREAMS[direction]

    def call_params(self, dtype: np.dtype) -> dict[str, Any]:
        array = OPS[self.op].defn.array_param if self.op in OPS else None
        if array:  # one slope, as on a 1-D array
            return {array: np.array([0.25], dtype=dtype)}
        return dict(self.params)

    def act_params(self) -> dict[str, Any]:
        """The activation's own parameters (bias_act's act_params; an op's params)."""
        return {k: v for k, v in self.params if k not in _BIAS_OWN} if self.op == BIAS_ACT else dict(self.params)


# bias_act's own parameters (act, dim, gain, clamp) and their defaults, from its definition
_BIAS_OWN = _BIAS_DEFN.param_names
_BIAS_DEFAULTS = {p.name: p.default for p in _BIAS_DEFN.params}


def parse_op(text: str) -> OpCase:
    """'gelu' -> gelu with its defaults; 'gelu:approximate=tanh' or 'softplus:beta=2:threshold=5' sets parameters;
    'bias_act:act=gelu:approximate=tanh:dim=-1' the fused op (dim 1, NCHW, by default)."""
    name, *items = text.strip().split(":")
    given: dict[str, Any] = {}
    for item in items:
        k, eq, v = item.partition("=")
        if not eq:
            raise ValueError(f"bad op parameter {item!r} in {text!r}: use name=value")
        given[k.strip()] = _value(v.strip())
    if name.strip() == BIAS_ACT:
        return _parse_bias_act(given, text)
    if name.strip() in GATED:
        return _parse_gated(name.strip(), given, text)
    spec = get(name.strip())
    if spec.defn.array_param:
        return OpCase(spec.name, ((spec.defn.array_param, "single"),))  # one slope, as on a 1-D array
    if not items and any(p.default is REQUIRED for p in spec.params):
        given = dict(param_cases(spec)[0])
    return OpCase(spec.name, tuple(spec.validate(given).items()))


def parse_ops(text: str) -> list[OpCase]:
    """parse_op, except that 'bias_act...' without dim= gives both layouts (dim=1 NCHW, dim=-1)."""
    if text.strip().split(":")[0].strip() == BIAS_ACT and not any(
            item.partition("=")[0].strip() == "dim" for item in text.split(":")[1:]):
        return [parse_op(f"{text}:dim={d}") for d in BIAS_ACT_DIMS]
    return [parse_op(text)]


def _parse_bias_act(given: dict[str, Any], text: str) -> OpCase:
    """Checked through bias_act's own definition (and its activation's), as `ma.bias_act` checks them."""
    from ..fused_bias_act import resolve

    if "dim" in given:
        d = given["dim"]
        if not (isinstance(d, float) and d.is_integer() and int(d) in BIAS_ACT_DIMS):
            raise ValueError(f"bad dim {d!r} in {text!r}: multiact bench times bias_act along dim=1 (NCHW) or "
                             "dim=-1 (the last axis)")
        given["dim"] = int(d)
    own = {k: v for k, v in given.items() if k in _BIAS_OWN}
    extra = {k: v for k, v in given.items() if k not in _BIAS_OWN}
    fn = f"multiact bench --op {text}"
    call = resolve(own, extra, fn)  # ValueError/TypeError naming what is wrong
    checked = {p.name: p.validate(fn, own.get(p.name, p.default)) for p in _BIAS_DEFN.params}
    return OpCase(BIAS_ACT, tuple({**checked, "act": call.act.name, **call.act_p}.items()))


def _parse_gated(name: str, given: dict[str, Any], text: str) -> OpCase:
    """Checked through the op's definition and its activation's, as `ma.<name>` checks them."""
    from ..gated import resolve

    cdef = COMPOSITE_DEFINITIONS[name]
    fn = f"multiact bench --op {text}"
    if "dim" in given and given["dim"] != -1:
        raise ValueError(f"bad dim {given['dim']!r} in {text!r}: multiact bench times {name} along dim=-1 "
                         "(rows, 2 * hidden)")
    given.pop("dim", None)
    for p in cdef.params:
        v = given.get(p.name)
        if p.kind == "int" and isinstance(v, float) and v.is_integer():
            given[p.name] = int(v)
    own = {k: v for k, v in given.items() if k in cdef.param_names}
    extra = {k: v for k, v in given.items() if k not in cdef.param_names}
    call = resolve(cdef, own, extra, fn)  # ValueError/TypeError naming what is wrong
    checked = {p.name: p.validate(fn, own.get(p.name, p.default)) for p in cdef.params}
    return OpCase(name, tuple(checked.items()) + (tuple(call.act_p.items()) if cdef.takes_act_params else ()))


def gated_shape(n: int) -> tuple[int, int]:
    """(rows, 2 * hidden) for n elements of x, hidden up to 4096; ValueError if n does not split so."""
    width = min(8192, n)
    if n % width or width % 2:
        raise ValueError(f"bad size {size_label(n)} for a gated op: use a power of two (e.g. 64K, 16M), so that "
                         "it splits into (rows, 2 * hidden)")
    return n // width, width


def bias_act_shape(n: int, dim: int) -> tuple[int, ...]:
    """The shape bias_act is timed on for n elements: (N, C, H, W) with H*W up to 64*64 and C up to 64
    for dim=1; (rows, 4096) for dim=-1 (fewer columns below 4096 elements).  ValueError if n does not fit."""
    if dim == 1:
        hw = min(4096, max(1, n // 64))
        c = max(1, min(64, n // hw))
        side = int(round(hw ** 0.5))
        shape = (n // (c * hw), c, side, hw // side) if side * (hw // side) == hw else (n // (c * hw), c, hw)
    else:
        hidden = min(4096, n)
        shape = (n // hidden, hidden)
    if int(np.prod(shape)) != n:
        raise ValueError(f"bad size {size_label(n)} for bias_act: use a power of two (e.g. 64K, 16M), so that it "
                         f"splits into {'(N, C, H, W)' if dim == 1 else '(rows, 4096)'}")
    return shape


def _value(v: str) -> Any:
    try:
        return float(v)
    except ValueError:
        return v


@dataclass
class Row:
    """One implementation timed on one configuration."""

    op: str
    direction: str
    dtype: str
    size: int
    threads: int
    mode: str  # "alloc" | "out"
    impl: str
    kind: str  # "backend" | "peer" | "baseline"
    median_s: float
    q1_s: float
    q3_s: float
    calls_per_sample: int
    samples: list[float] = field(default_factory=list)
    bytes: int = 0
    note: str = ""
    copy_s: float | None = None
    best_peer_s: float | None = None
    copy_q: tuple[float, float] | None = None  # the copy's quartiles (q1, q3), for the ratio's range
    best_peer_q: tuple[float, float] | None = None  # the best peer's quartiles
    attempts: int = 1  # times the configuration was timed (more than 1: it was noisy and re-sampled)
    flags: dict[str, str] = field(default_factory=dict)  # flag -> why ("noisy", BELOW_COPY)
    shape: tuple[int, ...] | None = None  # the array's shape where it is not 1-D (bias_act)

    @property
    def ns_per_element(self) -> float:
        return self.median_s / self.size * 1e9

    @property
    def gb_per_s(self) -> float:
        return self.bytes / self.median_s / 1e9

    @property
    def spread(self) -> float:
        """Interquartile range relative to the median."""
        return (self.q3_s - self.q1_s) / self.median_s

    @property
    def vs_copy(self) -> float | None:
        return None if not self.copy_s else self.median_s / self.copy_s

    @property
    def vs_copy_range(self) -> tuple[float, float] | None:
        """The range of vs_copy the quartiles allow: (q1 / copy's q3, q3 / copy's q1)."""
        return None if not self.copy_q else (self.q1_s / self.copy_q[1], self.q3_s / self.copy_q[0])

    @property
    def speedup(self) -> float | None:
        """Best peer's time over this one (multiact's rows only)."""
        return None if self.kind != "backend" or not self.best_peer_s else self.best_peer_s / self.median_s

    @property
    def speedup_range(self) -> tuple[float, float] | None:
        """The range of speedup the quartiles allow: (peer's q1 / our q3, peer's q3 / our q1)."""
        if self.speedup is None or not self.best_peer_q:
            return None
        return self.best_peer_q[0] / self.q3_s, self.best_peer_q[1] / self.q1_s

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Row:
        """A row back from `as_dict()` (a saved --json run)."""
        names = {f.name for f in fields(cls)}
        got = {k: v for k, v in d.items() if k in names}
        for k in ("copy_q", "best_peer_q", "shape"):  # JSON made them lists
            if got.get(k) is not None:
                got[k] = tuple(got[k])
        return cls(**got)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(ns_per_element=self.ns_per_element, gb_per_s=self.gb_per_s, spread=self.spread,
                 vs_copy=self.vs_copy, vs_copy_range=self.vs_copy_range, speedup_vs_best_peer=self.speedup,
                 speedup_range=self.speedup_range)
        return d


def time_interleaved(fns: Sequence[Callable[[], Any]], samples: int = 7, sample_s: float = 2e-3,
                     budget_s: float = 3.0) -> list[tuple[list[float], int]]:
    """Per function: (seconds per call of each sample, calls per sample), rounds in rotating order."""
    calls: list[tuple[int, float]] = []
    pre: list[list[float]] = []
    for f in fns:  # warm up (first calls compile, build sessions, fault pages in), then calibrate
        t0 = time.perf_counter()
        f()
        one = time.perf_counter() - t0
        if one < 0.1:  # a slow call's first run is a fair estimate; time fast ones in growing batches
            n = 1
            while True:
                t0 = time.perf_counter()
                for _ in range(n):
                    f()
                took = time.perf_counter() - t0
                if took >= sample_s / 2 or n >= 1 << 20:
                    break
                n *= 4
            one = took / n
        one = max(one, 1e-8)
        calls.append((max(1, round(sample_s / one)), one))
        # A call of half a second or more: its warm-up is within noise of a timed call; keep it as a sample.
        # (Rounds then skip it once it has enough samples: 3, or 2 for calls of a second or more.)
        pre.append([one] if one >= 0.5 else [])
    per_round = sum(n * one for n, one in calls)
    rounds = max(3, min(samples, int(budget_s / max(per_round, 1e-9))))
    out: list[list[float]] = pre
    for r in range(rounds):
        for j in range(len(fns)):
            i = (j + r) % len(fns)
            if len(out[i]) >= (2 if calls[i][1] >= 1.0 else rounds):
                continue  # a call of a second or more: two samples say enough, and keep the run short
            f, n = fns[i], calls[i][0]
            t0 = time.perf_counter()
            for _ in range(n):
                f()
            out[i].append((time.perf_counter() - t0) / n)
    return [(s, c[0]) for s, c in zip(out, calls, strict=True)]


def host_backends(names: Sequence[str] | None = None) -> tuple[list[str], dict[str, str]]:
    """(available backends that take NumPy arrays, {name: why not} for the rest asked about)."""
    chosen, skipped = [], {}
    for name in names or registry.BACKEND_NAMES:
        registry.check_name(name)
        ok, why = registry.availability(name)
        mod = registry.module(name)
        if not ok:
            skipped[name] = why
        elif "numpy" not in mod.KINDS:
            skipped[name] = f"runs on {', '.join(mod.KINDS)} arrays, not NumPy arrays"
        else:
            chosen.append(name)
    return chosen, skipped


def _compose(name: str, fwd: P.Bound | str, bwd: P.Bound | str, note: str = "") -> P.Bound | str:
    """A forward and its backward called one after the other (forward_backward)."""
    if isinstance(fwd, str):
        return fwd
    if isinstance(bwd, str):
        return bwd
    fa, ba, fi, bi = fwd.alloc, bwd.alloc, fwd.into, bwd.into
    into = None if fi is None or bi is None else (lambda: (fi(), bi()))
    return P.Bound(name, lambda: (fa(), ba()), into, note)


def _backend_bound(name: str, op: OpCase, direction: str, arrays, out, params) -> P.Bound | str:
    import multiact as ma

    if direction == "forward_backward":
        return _compose(name, _backend_bound(name, op, "forward", arrays[1:], out, params),
                        _backend_bound(name, op, "backward", arrays, out, params))
    mod = registry.module(name)
    if not mod.supports(op.op, direction, out.dtype.name):
        return f"{name} has no {op.op} {direction} kernel for {out.dtype}"
    if direction == "forward":
        f = getattr(ma, op.op)
        (x,) = arrays
        return P.Bound(name, lambda: f(x, backend=name, **params), lambda: f(x, out=out, backend=name, **params))
    g = getattr(ma, f"{op.op}_grad")
    if direction == "backward_y":
        dy, y = arrays
        return P.Bound(name, lambda: g(dy, y=y, backend=name, **params),
                       lambda: g(dy, y=y, out=out, backend=name, **params))
    dy, x = arrays
    return P.Bound(name, lambda: g(dy, x, backend=name, **params), lambda: g(dy, x, out=out, backend=name, **params))


def _bias_act_backend(name: str, op: OpCase, direction: str, arrays, out) -> P.Bound | str:
    """ma.bias_act / ma.bias_act_grad on one backend; arrays (x, b) forward, (dy, x, b) otherwise; out (y, db)."""
    import multiact as ma

    if direction == "forward_backward":
        return _compose(name, _bias_act_backend(name, op, "forward", arrays[1:], out),
                        _bias_act_backend(name, op, "backward", arrays, out))
    p = dict(op.params)
    act, dim = p.pop("act"), p.pop("dim")
    own = {"dim": dim, "gain": p.pop("gain"), "clamp": p.pop("clamp")}
    from ..fused_bias_act import resolve

    key = resolve({"act": act, **own}, p, "bias_act()").key
    if not registry.module(name).supports(key, direction, out[0].dtype.name):
        return f"{name} has no {key} {direction} kernel for {out[0].dtype}"
    if direction == "forward":
        x, b = arrays
        return P.Bound(name, lambda: ma.bias_act(x, b, act, backend=name, **own, **p),
                       lambda: ma.bias_act(x, b, act, out=out[0], backend=name, **own, **p))
    dy, x, b = arrays
    return P.Bound(name, lambda: ma.bias_act_grad(dy, x, b, act, backend=name, **own, **p),
                   lambda: ma.bias_act_grad(dy, x, b, act, out=out, backend=name, **own, **p))


def _gated_backend(name: str, op: OpCase, direction: str, arrays, out) -> P.Bound | str:
    """ma.<gated op> / its _grad on one backend; arrays (x,) forward, (dy, x) otherwise; out (y, dx)."""
    import multiact as ma

    if direction == "forward_backward":
        return _compose(name, _gated_backend(name, op, "forward", arrays[1:], out),
                        _gated_backend(name, op, "backward", arrays, out))
    from ..gated import resolve

    cdef = COMPOSITE_DEFINITIONS[op.op]
    p = dict(op.params)
    own = {k: v for k, v in p.items() if k in cdef.param_names}
    extra = {k: v for k, v in p.items() if k not in cdef.param_names}
    key = resolve(cdef, own, extra, f"{op.op}()").key
    if not registry.module(name).supports(key, direction, out[0].dtype.name):
        return f"{name} has no {key} {direction} kernel for {out[0].dtype}"
    if direction == "forward":
        f, (x,) = getattr(ma, op.op), arrays
        return P.Bound(name, lambda: f(x, backend=name, **p), lambda: f(x, out=out[0], backend=name, **p))
    g, (dy, x) = getattr(ma, f"{op.op}_grad"), arrays
    return P.Bound(name, lambda: g(dy, x, backend=name, **p), lambda: g(dy, x, out=out[1], backend=name, **p))


def bind(impl: str, op: OpCase, direction: str, arrays: tuple[np.ndarray, ...], out: Any,
         threads: int) -> P.Bound | str:
    """Implementation 'backend:NAME' or 'peer:NAME' bound to `arrays` ((x,), (dy, x), or (dy, y) for
    backward_y; bias_act: (x, b) or (dy, x, b)) and `out` (bias_act: (y or dx, db)), or why not."""
    kind, _, name = impl.partition(":")
    if kind not in ("backend", "peer"):
        raise ValueError(f"implementation must be 'backend:NAME' or 'peer:NAME', got {impl!r}")
    if op.op == BIAS_ACT:
        if kind == "backend":
            return _bias_act_backend(name, op, direction, arrays, out)
        p = dict(op.params)
        return P.make_bias_act(name, p["act"], op.act_params(), p["dim"], p["gain"], p["clamp"], direction, arrays,
                               threads)
    if op.op in GATED:
        if kind == "backend":
            return _gated_backend(name, op, direction, arrays, out)
        from ..gated import resolve

        cdef = COMPOSITE_DEFINITIONS[op.op]
        p = dict(op.params)
        call = resolve(cdef, {k: v for k, v in p.items() if k in cdef.param_names},
                       {k: v for k, v in p.items() if k not in cdef.param_names}, f"{op.op}()")
        return P.make_gated(name, op.op, call.act.name, call.act_p, call.gate_first, p["layout"], p.get("limit"),
                            direction, arrays, threads)
    params = op.call_params(out.dtype)
    if kind == "backend":
        return _backend_bound(name, op, direction, arrays, out, params)
    if not P.covers(name, op.op, direction):
        return f"no peer: {name} has no {op.op} {direction}"
    return P.make(name, op.op, direction, params, arrays, out, threads)


def _copy_bound(n_elements: int, dtype: np.dtype) -> Callable[[], Any]:
    src = np.ones(n_elements, dtype=dtype)
    dst = np.empty_like(src)
    return lambda: np.copyto(dst, src)


def _y_of(op: OpCase, x: np.ndarray) -> np.ndarray:
    """The forward output a backward_y starts from."""
    import multiact as ma

    return getattr(ma, op.op)(x, backend="numpy", **op.call_params(x.dtype))


def _case_arrays(op: OpCase, direction: str, x: np.ndarray, dy: np.ndarray, out: np.ndarray) -> tuple[tuple, Any]:
    """(the arrays a call takes, its out) from flat x, dy, out of the same size."""
    if op.op in GATED:
        rows, width = gated_shape(x.size)
        xs, dxo = x.reshape(rows, width), out.reshape(rows, width)
        dys, yo = dy[: x.size // 2].reshape(rows, width // 2), out[: x.size // 2].reshape(rows, width // 2)
        return ((xs,) if direction == "forward" else (dys, xs)), (yo, dxo)
    if op.op == BIAS_ACT:
        dim = dict(op.params)["dim"]
        shape = bias_act_shape(x.size, dim)
        xs, dys, outs = (a.reshape(shape) for a in (x, dy, out))
        c = shape[dim]
        b = np.linspace(-0.5, 0.5, c).astype(x.dtype)
        outs = (outs, np.empty(c, x.dtype))
        return ((xs, b) if direction == "forward" else (dys, xs, b)), outs
    if direction == "forward":
        return (x,), out
    if direction == "backward_y":
        return (dy, _y_of(op, x)), out
    return (dy, x), out


def run(
    ops: Sequence[OpCase],
    dtypes: Sequence[str] = ("float32",),
    sizes: Sequence[int] = DEFAULT_SIZES,
    threads: Sequence[int] | None = None,
    directions: Sequence[str] = ("forward", "backward"),
    backends: Sequence[str] | None = None,
    peers: Sequence[str] = P.PEERS,
    modes: Sequence[str] = ("alloc",),
    samples: int = 7,
    budget_s: float = 2.0,
    progress: Callable | None = None,
    resample: int = RESAMPLE,
    max_spread: float = MAX_SPREAD,
) -> dict[str, Any]:
    """Time everything asked for; returns {"rows": [Row...], "skipped": [...], "missing_peers": {...}}.

    A configuration with a row whose spread exceeds max_spread is timed again (all its rows, so that
    ratios stay within one interleaved run), up to `resample` more times; the least noisy try is kept."""
    import multiact as ma

    chosen, skipped_backends = host_backends(backends)
    peer_ok = {p: P.available(p) for p in peers}
    missing = {p: why for p, (ok, why) in peer_ok.items() if not ok}
    live_peers = [p for p in peers if peer_ok[p][0]]
    thread_list = list(threads or [ma.get_num_threads()])
    for op in ops:  # a size that does not split: say so before timing
        for n in sizes:
            if op.op == BIAS_ACT:
                bias_act_shape(n, dict(op.params)["dim"])
            elif op.op in GATED:
                gated_shape(n)
    configs = [(op, dt, n, t, d) for op in ops for dt in dtypes for n in sizes for t in thread_list for d in directions]
    rows: list[Row] = []
    skipped: list[dict[str, str]] = []
    old_threads = ma.get_num_threads()
    rng = np.random.default_rng(0)
    data: dict[tuple[str, int], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    items = progress(configs, len(configs)) if progress else configs
    try:
        with np.errstate(all="ignore"):
            for op, dt, n, t, d in items:
                key = (dt, n)
                if key not in data:
                    data.clear()  # one size at a time in memory
                    x = (rng.standard_normal(n, dtype=np.float32) * 3).astype(dt)
                    dy = rng.standard_normal(n, dtype=np.float32).astype(dt)
                    data[key] = (x, dy, np.empty_like(x))
                x, dy, out = data[key]
                if d == "backward_y" and (op.op not in OPS or OPS[op.op].backward_y is None):
                    skipped.append({"impl": "all", "case": f"{op.label} {d} {dt}", "why": f"{op.op} has no y-form"})
                    continue
                arrays, o = _case_arrays(op, d, x, dy, out)
                small = _case_arrays(op, d, x[:64], dy[:64], out[:64])
                rows += _one_config(op, d, np.dtype(dt), n, t, arrays, o, small, chosen, live_peers, modes,
                                    samples, budget_s, skipped, resample, max_spread)
    finally:
        ma.set_num_threads(old_threads)
    return {"rows": rows, "skipped": skipped, "skipped_backends": skipped_backends, "missing_peers": missing}


def _one_config(op, direction, dtype, n, threads, arrays, out, small, backends, peers, modes, samples, budget_s,
                skipped, resample, max_spread):
    import multiact as ma

    ma.set_num_threads(threads)
    bounds: list[tuple[str, P.Bound]] = []
    where = f"{op.label} {direction} {dtype.name}"
    for kind, name in [("backend", b) for b in backends] + [("peer", p) for p in peers]:
        res = bind(f"{kind}:{name}", op, direction, arrays, out, threads)
        if isinstance(res, str):
            skipped.append({"impl": name, "case": where, "why": res})
            continue
        bounds.append((kind, res))
        # Once on 64 elements first, so that JIT compilation and session set-up are not mistaken for a slow call.
        warm = bind(f"{kind}:{name}", op, direction, *small, threads)
        for f in () if isinstance(warm, str) else (warm.alloc, warm.into):
            if f is not None:
                f()
    nbytes = int(op.streams(direction) * n) * dtype.itemsize
    fns: list[Callable[[], Any]] = [_copy_bound(max(1, int(op.streams(direction) * n) // 2), dtype)]
    labels: list[tuple[str, str, str, str]] = [("copy", "baseline", "out", "")]
    for kind, b in bounds:
        for mode in modes:
            f = b.alloc if mode == "alloc" else b.into
            if f is None:
                skipped.append({"impl": b.name, "case": where, "why": f"no {mode} form"})
                continue
            fns.append(f)
            labels.append((b.name, kind, mode, b.note))
    shape = tuple(arrays[-2].shape) if op.op == BIAS_ACT else tuple(arrays[-1].shape) if op.op in GATED else None
    meta = dict(op=op.label, direction=direction, dtype=dtype.name, size=n, threads=threads, bytes=nbytes, shape=shape)
    return timed_rows(fns, labels, meta, samples, budget_s, resample, max_spread)


def timed_rows(fns: Sequence[Callable[[], Any]], labels: Sequence[tuple[str, str, str, str]], meta: dict[str, Any],
               samples: int = 7, budget_s: float = 2.0, resample: int = RESAMPLE,
               max_spread: float = MAX_SPREAD) -> list[Row]:
    """One configuration timed (fns[0] the copy baseline), its rows linked to the copy and the best peer
    and flagged; timed again, all together, while a row spreads by more than max_spread (at most
    `resample` more times; the least noisy try is kept)."""
    best: tuple[float, list[Row]] | None = None
    tries = 0
    while tries <= max(0, resample):
        tries += 1
        made = []
        for (name, kind, mode, note), (s, calls) in zip(labels, time_interleaved(fns, samples, budget_s=budget_s),
                                                        strict=True):
            q1, med, q3 = np.percentile(s, [25, 50, 75])
            made.append(Row(impl=name, kind=kind, mode=mode, note=note, median_s=float(med), q1_s=float(q1),
                            q3_s=float(q3), calls_per_sample=calls, samples=[float(v) for v in s], **meta))
        worst = max(r.spread for r in made)
        if best is None or worst < best[0]:
            best = (worst, made)
        if worst <= max_spread:
            break
    assert best is not None
    made = best[1]
    copy = made[0]
    for r in made:
        r.attempts = tries
        r.copy_s, r.copy_q = copy.median_s, (copy.q1_s, copy.q3_s)
        if r.kind == "backend":
            peer_rows = [q for q in made if q.kind == "peer" and q.mode == r.mode]
            if peer_rows:
                fastest = min(peer_rows, key=lambda q: q.median_s)
                r.best_peer_s, r.best_peer_q = fastest.median_s, (fastest.q1_s, fastest.q3_s)
    flag(made, max_spread)
    return made


def relink(rows: Sequence[Row], max_spread: float = MAX_SPREAD) -> None:
    """Rows of a run saved before ranges and flags were recorded (a --json file): each configuration's
    copy and best-peer quartiles set from its own rows, and its flags, as a fresh run has them."""
    groups: dict[tuple, list[Row]] = {}
    for r in rows:
        groups.setdefault((r.op, r.direction, r.dtype, r.size, r.threads), []).append(r)
    for made in groups.values():
        copy = next((r for r in made if r.kind == "baseline"), None)
        for r in made:
            if copy is not None and r.copy_q is None:
                r.copy_s, r.copy_q = copy.median_s, (copy.q1_s, copy.q3_s)
            peer_rows = [q for q in made if q.kind == "peer" and q.mode == r.mode]
            if r.kind == "backend" and peer_rows and r.best_peer_q is None:
                fastest = min(peer_rows, key=lambda q: q.median_s)
                r.best_peer_s, r.best_peer_q = fastest.median_s, (fastest.q1_s, fastest.q3_s)
        if not any(r.flags for r in made):
            flag(made, max_spread)


def flag(rows: Sequence[Row], max_spread: float = MAX_SPREAD) -> None:
    """Mark the rows whose figures should not be read as they stand: 'noisy' (IQR over max_spread of the
    median), and BELOW_COPY (faster than np.copyto of the same bytes), each with its reason."""
    copy = next((r for r in rows if r.kind == "baseline"), None)
    llc = last_level_cache()
    per_core = cache_sizes().get(2)
    for r in rows:
        if r.spread > max_spread:
            again = f" after {r.attempts} timings" if r.attempts > 1 else ""
            r.flags["noisy"] = f"IQR {r.spread:.0%} of the median (over {max_spread:.0%}){again}"
        if r.kind == "baseline" or copy is None or r.median_s >= copy.median_s:
            continue
        if llc and r.bytes <= (per_core or llc):
            why = (f"cache: its {_bytes(r.bytes)} read + written fit in the {_bytes(per_core or llc)} "
                   f"{'L2' if per_core else 'last-level'} cache, where the copy's time is call overhead and cache "
                   "bandwidth, not the memory limit")
        elif llc and r.bytes <= llc:
            why = (f"cache or streaming stores: its {_bytes(r.bytes)} read + written may fit in the {_bytes(llc)} "
                   "last-level cache (shared with the other cores), and a kernel that writes with non-temporal "
                   "stores skips the read-for-ownership of the destination that the copy's stores pay")
        else:
            why = ("streaming stores: beyond the cache a kernel that writes with non-temporal stores skips the "
                   "read-for-ownership of the destination that the copy's stores pay")
        if max(r.spread, copy.spread) > max_spread:
            why += f"; or noise (IQR {r.spread:.0%}, the copy's {copy.spread:.0%})"
        r.flags[BELOW_COPY] = why


@functools.lru_cache(maxsize=1)
def cache_sizes() -> dict[int, int]:
    """{level: bytes} of CPU 0's data/unified caches (Linux sysfs); {} where they cannot be read."""
    base = "/sys/devices/system/cpu/cpu0/cache"
    sizes: dict[int, int] = {}
    try:
        for entry in sorted(os.listdir(base)):
            if not entry.startswith("index"):
                continue
            if _read(base, entry, "type") == "Instruction":
                continue
            text = _read(base, entry, "size").upper()
            mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
            sizes[int(_read(base, entry, "level"))] = int(text.rstrip("KMG")) * mult
    except (OSError, ValueError):
        return sizes
    return sizes


def _read(*path: str) -> str:
    with open(os.path.join(*path), encoding="ascii") as f:
        return f.read().strip()


def last_level_cache() -> int | None:
    """Bytes of CPU 0's largest cache, or None where it cannot be read."""
    sizes = cache_sizes()
    return max(sizes.values()) if sizes else None


def _bytes(n: int) -> str:
    for unit, k in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= k:
            return f"{n / k:.3g} {unit}"
    return f"{n} B"


def load_warning(cpu: dict[str, Any], before: Sequence[float] | None = None) -> str | None:
    """A warning when the 1-minute load average is at or above the CPUs this process may use (from a
    `sysinfo.cpu()` dict, this run's or a saved one's; with `before`, the load average before the run
    too, either reaching it warns), else None: other work then holds the cores, and a sample can stall
    for a scheduler tick."""
    load = cpu.get("load_average")
    ncpu = cpu.get("usable_cpus") or cpu.get("logical_cpus")
    if not load or not ncpu or max(load[0], before[0] if before else 0.0) < ncpu:
        return None
    said = f"{load[0]:.2f}" if not before else f"{before[0]:.2f} before the run, {load[0]:.2f} after,"
    return (f"WARNING: load average {said} >= {ncpu} usable CPU{'s' if ncpu > 1 else ''}: other processes "
            "hold the cores, so timings are noisy and ratios unreliable (noisy rows are flagged); rerun on an idle "
            "machine")


def header(cpu: dict[str, Any] | None = None) -> str:
    """The first line of `multiact bench` output: the CPU the figures were measured on (this machine's,
    or the `cpu` dict a saved run recorded)."""
    from . import sysinfo

    cpu = sysinfo.cpu() if cpu is None else cpu
    usable = f", {cpu['usable_cpus']} of {cpu['logical_cpus']} CPUs usable" if "usable_cpus" in cpu else ""
    return f"# CPU: {sysinfo.summary(cpu)}{usable}"


def plot(rows: Sequence[Row], path: str, title: str | None = None, note: str = "",
         cpu: dict[str, Any] | None = None, metric: str = "time") -> None:
    """Time per call (metric="time", default) or GB/s ("gbps") against size on log axes, one panel per
    (op, direction, dtype).

    Colour: the implementation; solid: allocating calls, dashed: into a preallocated out=; marker: thread
    count, hollow where the row is flagged noisy; band: the interquartile range; dotted grey: np.copyto of
    the same bytes, the bandwidth limit.
    """
    if metric not in ("time", "gbps"):
        raise ValueError(f"plot(): metric must be 'time' or 'gbps', got {metric!r}")
    per_call = metric == "time"

    def value(r: Row, t: float) -> float:
        return t * 1e6 if per_call else r.bytes / t / 1e9

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    from . import sysinfo

    panels: dict[tuple[str, str, str], list[Row]] = {}
    for r in rows:
        panels.setdefault((r.op, r.direction, r.dtype), []).append(r)
    keys = list(panels)
    ops = list(dict.fromkeys(k[0] for k in keys))
    cols = list(dict.fromkeys((k[1], k[2]) for k in keys))
    if len(ops) * len(cols) != len(keys) or len(cols) > 4:  # ragged: just wrap
        ncols = min(4, len(keys))
        grid = {k: divmod(i, ncols) for i, k in enumerate(keys)}
        nrows = (len(keys) + ncols - 1) // ncols
    else:
        ncols, nrows = len(cols), len(ops)
        grid = {k: (ops.index(k[0]), cols.index((k[1], k[2]))) for k in keys}
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.4 * ncols + 0.6, 3.3 * nrows + 1.4), squeeze=False)
    impls = list(dict.fromkeys(display_name(r, long=True) for r in rows if r.kind != "baseline"))
    spare = iter(("#aec7e8", "#98df8a", "#ffbb78", "#c5b0d5", "#c49c94", "#000000"))
    colors = {name: _COLORS.get(name) or next(spare, "k") for name in impls}
    threads = sorted({r.threads for r in rows})
    markers = dict(zip(threads, "osD^v<>ph", strict=False))
    modes = sorted({r.mode for r in rows if r.kind != "baseline"})
    for key, rs in panels.items():
        ax = axes[grid[key]]
        series: dict[tuple, list[Row]] = {}
        for r in rs:
            if r.kind == "baseline" and r.threads != threads[0]:
                continue  # np.copyto is single-threaded: one line is enough
            series.setdefault((r.kind, display_name(r, long=True), r.mode, r.threads), []).append(r)
        for (kind, name, mode, thr), pts in series.items():
            pts.sort(key=lambda r: r.size)
            xs = [r.size for r in pts]
            ys = [value(r, r.median_s) for r in pts]
            if kind == "baseline":
                ax.plot(xs, ys, color="0.55", ls=":", lw=1.6)
                continue
            backend = kind == "backend"
            ax.plot(xs, ys, color=colors[name], lw=2.4 if backend else 1.4, marker=markers[thr],
                    ms=5.5 if backend else 4.5, ls="--" if mode == "out" else "-")
            noisy = [(x, y) for x, y, r in zip(xs, ys, pts, strict=True) if "noisy" in r.flags]
            if noisy:  # hollow: this point's IQR is over the limit even after re-sampling
                ax.plot(*zip(*noisy, strict=True), ls="", marker=markers[thr], ms=9, mfc="white",
                        mec=colors[name], mew=1.5)
            lo = [value(r, r.q1_s) for r in pts]
            hi = [value(r, r.q3_s) for r in pts]
            ax.fill_between(xs, lo, hi, color=colors[name], alpha=0.12, lw=0)
        sizes = sorted({r.size for r in rs})
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(sizes)
        ax.set_xticklabels([size_label(n) for n in sizes])
        ax.set_title(f"{key[0]} {SHORT_DIRECTION.get(key[1], key[1])} ({key[2]})", fontsize=11)
        ax.grid(True, which="major", alpha=0.3)
        ax.set_xlabel("elements (log scale)", fontsize=9)
        ax.set_ylabel("us per call" if per_call else "GB/s (read + written)", fontsize=9)
    for i in range(nrows):
        for j in range(ncols):
            if (i, j) not in grid.values():
                axes[i, j].set_visible(False)
    handles = [Line2D([], [], color=colors[n], lw=2.4 if n.startswith("multiact") else 1.4) for n in impls]
    labels = list(impls)
    handles.append(Line2D([], [], color="0.55", ls=":", lw=1.6))
    labels.append("np.copyto, same bytes")
    if len(modes) > 1:
        handles += [Line2D([], [], color="k", ls="-"), Line2D([], [], color="k", ls="--")]
        labels += ["allocating", "into out="]
    if len(threads) > 1:
        handles += [Line2D([], [], color="k", ls="", marker=markers[t]) for t in threads]
        labels += [f"{t} thread{'s' if t > 1 else ''}" for t in threads]
    ncol = min(len(labels), max(3, 2 * ncols + 1))
    legend_rows = (len(labels) + ncol - 1) // ncol
    cpu = sysinfo.cpu() if cpu is None else cpu  # a saved run's plot names the CPU it was measured on
    thr = ",".join(str(t) for t in threads)
    better = "lower is better" if per_call else "higher is better"
    fig.suptitle(title or f"multiact bench, {cpu.get('usable_cpus', '?')} CPUs, {thr} threads{note}; "
                 f"{better}; band: interquartile range; hollow: noisy\n{sysinfo.summary(cpu)}", fontsize=11)
    bottom = (0.35 + 0.28 * legend_rows) / fig.get_figheight()
    fig.legend(handles, labels, loc="lower center", ncol=ncol, fontsize=9, frameon=False)
    fig.tight_layout(rect=(0, bottom, 1, 1 - 0.7 / fig.get_figheight()))  # two title lines
    _save_small(fig, path)
    plt.close(fig)


def _save_small(fig: Any, path: str) -> None:
    """PNG with a 256-colour palette where Pillow is there (a few times smaller; line plots lose nothing)."""
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    try:
        from PIL import Image

        img = Image.open(io.BytesIO(buf.getvalue())).convert("RGB")
        img.quantize(colors=256, method=Image.Quantize.MEDIANCUT).save(path, optimize=True)
    except Exception:  # no Pillow, or an old one: the plain PNG
        with open(path, "wb") as f:
            f.write(buf.getvalue())


# Fixed colours, so that plots from different runs and machines read alike.
_COLORS = {
    "multiact native": "#1f77b4", "multiact numba": "#2ca02c", "multiact numpy": "#17becf",
    "multiact onnxruntime": "#9467bd", "multiact cuda": "#bcbd22", "multiact ascend": "#e377c2",
    "PyTorch": "#d62728", "ONNX Runtime": "#ff7f0e", "NumPy formula": "#8c564b",
    "multiact ma.<op>(tensor)": "#1f77b4", "multiact.torch.<op>(tensor)": "#2ca02c",
}

PEER_LABELS = {"torch": "PyTorch", "onnxruntime": "ONNX Runtime", "numpy": "NumPy formula"}
# --framework torch's multiact rows: ma.<op>(tensor) and multiact.torch's function (autograd).
ENTRY_LABELS = {"ma.f(t)": "multiact ma.<op>(tensor)", "mt.f(t)": "multiact.torch.<op>(tensor)"}


def display_name(r: Row, long: bool = False) -> str:
    """'ma:numba' for a backend, the peer's name for a peer ('np formula' for the NumPy one)."""
    if r.kind == "backend":
        if r.impl in ENTRY_LABELS:  # --framework torch: multiact's entry points, not a backend
            return ENTRY_LABELS[r.impl] if long else r.impl
        return f"multiact {r.impl}" if long else f"ma:{r.impl}"
    if r.kind == "peer":
        return PEER_LABELS.get(r.impl, r.impl) if long else {"numpy": "np formula"}.get(r.impl, r.impl)
    return "np.copyto" if long else "copy"
