"""What multiact is compared with: the same activation in PyTorch (CPU), ONNX Runtime and plain NumPy.

One table per peer, keyed by op name: an op a peer does not have says "no peer"
rather than something approximate.  `make()` binds a peer's op to the caller's
arrays once (tensors wrap the NumPy memory, sessions and IOBindings are built
up front), so that a timed call is only the call.  Peers are imported only
when asked for, and a peer that is not installed is reported as missing.

- torch: `torch.nn.functional` for allocating calls, `torch.ops.aten.<op>.out`
  and `aten.<op>_backward.grad_input` for the preallocated ones.  Where autograd
  saves the output y, the backward_y direction times that y-form; sigmoid's and
  tanh's only backward in PyTorch is the y-form, so their "backward" row times it
  too (labelled "backward from y").
- onnxruntime: a one-node ONNX graph per op (opset 20), forward only (its
  standard package has no gradient kernels); `out=` through IOBinding.
- numpy: the one-line NumPy formula a user would write, with `out=` on its
  last ufunc where that is the whole result.  Single-threaded.

forward_backward times a forward and its backward together: torch's through
autograd (what a training step runs), NumPy's as the two formulas.  bias_act's
peer (`make_bias_act`) is torch's unfused equivalent, `F.<act>(x + b.view(...))`
(times gain, clamped) and, for the backward, its autograd backward with db's sum.
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import _arrays
from .._opdefs import COMPOSITE_DEFINITIONS, SELU_ALPHA, SELU_SCALE
from ..optable import OPS, REQUIRED

PEERS = ("torch", "onnxruntime", "numpy")
_find_spec = importlib.util.find_spec  # one place to look (tests pretend a peer is missing here)
_INSTALL = {"torch": "pip install torch", "onnxruntime": "pip install onnx onnxruntime", "numpy": ""}


@dataclass
class Bound:
    """An implementation bound to one set of arrays: zero-argument callables to time."""

    name: str
    alloc: Callable[[], Any] | None  # returns a fresh result
    into: Callable[[], Any] | None  # writes the preallocated out
    note: str = ""


def available(peer: str) -> tuple[bool, str]:
    """(installed, reason) without importing the peer."""
    if peer not in PEERS:
        raise ValueError(f"unknown peer {peer!r}; valid peers: {', '.join(PEERS)}")
    mods = {"torch": ("torch",), "onnxruntime": ("onnxruntime", "onnx"), "numpy": ("numpy",)}[peer]
    missing = [m for m in mods if _find_spec(m) is None]
    if missing:
        return False, f"not installed ({', '.join(missing)} missing; {_INSTALL[peer]})"
    return True, "installed"


def covers(peer: str, op: str, direction: str) -> bool:
    """Whether the peer has this op and direction (independent of params and dtype)."""
    table = {"torch": TORCH_OPS, "onnxruntime": _ORT_OPS, "numpy": _NUMPY_FWD}[peer]
    if peer == "numpy" and direction in ("backward", "forward_backward"):
        return op in _NUMPY_BWD
    if peer == "onnxruntime" and direction != "forward":
        return False
    if peer == "numpy" and direction == "backward_y":
        return False
    return op in table


def make(peer: str, op: str, direction: str, params: dict[str, Any], arrays: tuple[np.ndarray, ...],
         out: np.ndarray, threads: int) -> Bound | str:
    """The peer's op bound to `arrays` ((x,), (dy, x), or (dy, y) for backward_y) and `out`, or why there is none."""
    ok, why = available(peer)
    if not ok:
        return why
    if not covers(peer, op, direction):
        return f"no peer: {peer} has no {op} {direction}"
    differs = reproduces(peer, op, params)
    if differs:
        return differs
    return {"torch": _torch, "onnxruntime": _ort, "numpy": _numpy}[peer](op, direction, params, arrays, out, threads)


_reproduces: dict[tuple, str | None] = {}


def reproduces(peer: str, op: str, params: dict[str, Any]) -> str | None:
    """None where the peer's forward computes the op at these parameters, else why not.

    At the op's defaults every peer does (tests/test_cli.py checks it); at other values a peer that has no
    such parameter (torch's F.selu has no alpha; ONNX's HardSigmoid is bound at 1/6) would time another
    function, so its forward is checked on a probe against the float64 reference first."""
    spec = OPS[op]
    defaults = spec.defaults()
    if all(params.get(k, v) == v for k, v in defaults.items()) or spec.defn.array_param:  # the caller's weight
        return None
    key = (peer, op, tuple(sorted((k, v) for k, v in params.items() if k in defaults)))
    if key not in _reproduces:
        x = np.linspace(-6, 6, 97, dtype=np.float32) + np.float32(0.013)
        got = {"torch": _torch, "onnxruntime": _ort, "numpy": _numpy}[peer](op, "forward", params, (x,),
                                                                            np.empty_like(x), 1)
        want = spec.forward(x.astype(np.float64), **params)
        shown = ", ".join(f"{k}={v}" for k, v in params.items() if k in defaults and v != defaults[k])
        why = f"no peer: {peer}'s {op} does not take {shown}"
        if not isinstance(got, str):
            with np.errstate(all="ignore"):
                res = np.asarray(got.alloc(), dtype=np.float64)
            if np.allclose(res, want, rtol=2e-3, atol=2e-3, equal_nan=True):
                why = None
        _reproduces[key] = why
    return _reproduces[key]


# ---- PyTorch ----------------------------------------------------------------
# Every op's torch spelling is its definition's (`OpDef.torch`): the function, its arguments, and aten's
# forward, backward and backward-from-y kernels as calls; a kernel's into-out overload is whichever aten has.

_TENSORS = ("dy", "x", "y")  # the arrays an aten call names; the others are parameters, literals, 1 / parameter


def _aten(torch: Any, call: str, p: dict[str, Any]) -> tuple[Callable, Callable | None] | None:
    """(alloc(*tensors), into(*tensors, o)) for an aten call of `OpDef.torch` ("elu_backward(dy, alpha, 1, 1,
    False, x)"), its tensors in the call's order; into is None where aten has no out= overload; None where aten
    has no such kernel."""
    if not call:
        return None
    import ast

    node = ast.parse(call, mode="eval").body
    kernel = getattr(torch.ops.aten, node.func.id, None)
    if kernel is None:
        return None

    def value(v: ast.expr) -> Any:
        if isinstance(v, ast.Constant):
            return v.value
        if isinstance(v, ast.Name):
            return p.get(v.id)
        if isinstance(v, ast.BinOp) and isinstance(v.op, ast.Div):
            return value(v.left) / value(v.right)
        raise ValueError(f"aten call {call!r}: cannot read {ast.unparse(v)}")

    slots = [isinstance(a, ast.Name) and a.id in _TENSORS for a in node.args]
    consts = [None if s else value(a) for s, a in zip(slots, node.args, strict=True)]
    kw = {k.arg: value(k.value) for k in node.keywords}

    def args(ts: tuple) -> list:
        it = iter(ts)
        return [next(it) if s else c for s, c in zip(slots, consts, strict=True)]

    def alloc(*ts):
        return kernel(*args(ts), **kw)

    overloads = kernel.overloads()
    if "grad_input" in overloads:
        def into(*ts):
            return kernel.grad_input(*args(ts[:-1]), **kw, grad_input=ts[-1])
    elif "out" in overloads:
        def into(*ts):
            return kernel.out(*args(ts[:-1]), **kw, out=ts[-1])
    else:
        into = None
    return alloc, into


def torch_kernels(torch: Any, op: str, p: dict[str, Any]) -> dict[str, tuple[Callable, Callable | None]]:
    """torch's kernels of op at parameters p, from its definition: {fwd: (alloc(x), into(x, o)), bwd: (alloc(dy,
    x), into(dy, x, o)), bwd_y: (alloc(dy, y), into(dy, y, o))}, the directions torch has; into None where aten
    has no out= overload."""
    t = OPS[op].defn.torch
    fn = getattr(torch.nn.functional if t.namespace == "torch.nn.functional" else torch, t.fn)
    args, kwargs = [p.get(n) for n in t.args], {n: p.get(n) for n in t.kwargs}
    out_fwd = _aten(torch, t.aten_forward(), p)
    entry = {"fwd": (lambda x: fn(x, *args, **kwargs), None if out_fwd is None else out_fwd[1])}
    for direction, call in (("bwd", t.backward), ("bwd_y", t.backward_y)):
        kernels = _aten(torch, call, p)
        if kernels is not None:
            entry[direction] = kernels
    return entry


# The ops torch has a function for (its definition's `torch`) at their defaults; prelu's per-axis weight is not
# torch's.
TORCH_OPS = {op for op, spec in OPS.items() if spec.defn.torch_computes(spec.defaults())}


def _torch(op, direction, params, arrays, out, threads) -> Bound | str:
    import torch

    torch.set_num_threads(threads)
    if not OPS[op].defn.torch_computes(params):  # F.selu, F.hardsigmoid: PyTorch's constants only
        return f"no peer: torch's {op} has no parameters (PyTorch's constants only)"
    entry = torch_kernels(torch, op, params)
    if direction == "forward_backward":
        return _torch_autograd(torch, entry["fwd"][0], arrays, out.dtype, f"{op} {direction}")
    pair = entry.get({"forward": "fwd", "backward": "bwd", "backward_y": "bwd_y"}[direction])
    ts = [_tensor(torch, a) for a in arrays]
    note = ""
    if pair is None and direction == "backward" and "bwd_y" in entry:
        pair = entry["bwd_y"]  # torch has only the y-form: time it from y = op(x), as autograd does
        ts[1] = entry["fwd"][0](ts[1])
        note = "backward from y"
    if pair is None:
        return f"no peer: torch has no {op} {direction} kernel"
    alloc, into = pair
    o = _tensor(torch, out)
    try:
        alloc(*ts)  # reject what this torch build cannot run in this dtype
        if into is not None:
            into(*ts, o)
    except (RuntimeError, TypeError, NotImplementedError) as e:
        return f"no peer: torch {op} {direction} failed in {out.dtype}: {str(e).splitlines()[0]}"
    return Bound("torch", lambda: alloc(*ts), None if into is None else (lambda: into(*ts, o)), note)


def _torch_autograd(torch: Any, fwd: Callable, arrays: tuple[np.ndarray, ...], dtype: np.dtype,
                    what: str) -> Bound | str:
    """fwd(x) and autograd's backward from dy, on tensors that share the arrays' memory ((dy, x))."""
    dy, x = (_tensor(torch, a) for a in arrays)
    xg = x.detach().requires_grad_(True)

    def step():
        (dx,) = torch.autograd.grad(fwd(xg), (xg,), dy)
        return dx

    try:
        step()
    except (RuntimeError, TypeError, NotImplementedError) as e:
        return f"no peer: torch {what} failed in {dtype}: {str(e).splitlines()[0]}"
    return Bound("torch", step, None, "autograd")


def _tensor(torch: Any, a: Any) -> Any:
    """A tensor on the array's memory (a tensor as it is; NumPy bfloat16 as a torch bfloat16 view)."""
    if isinstance(a, torch.Tensor):
        return a
    return _arrays.bf16_tensor(a) if a.dtype.kind == "V" else torch.from_numpy(a)


def torch_forward(op: str, params: dict[str, Any]) -> Callable | None:
    """torch's own allocating function for op with these parameters (F.gelu(x, approximate=...)), or None."""
    import torch

    if op not in TORCH_OPS:
        return None
    return torch_kernels(torch, op, params)["fwd"][0]


def torch_autograd(fwd: Callable, dy: Any, x: Any, what: str) -> Bound | str:
    """fwd(x) and autograd's backward from dy (tensors or arrays), as a training step runs them; or why not."""
    import torch

    return _torch_autograd(torch, fwd, (dy, x), x.dtype, what)


def _bias_view(torch: Any, b: Any, ndim: int, dim: int) -> Any:
    """b (C,) as a view that broadcasts along dim of an ndim array, as the unfused code writes it."""
    shape = [1] * ndim
    shape[dim] = -1
    return b.view(shape)


def make_bias_act(peer: str, act: str, act_params: dict[str, Any], dim: int, gain: float, clamp: float | None,
                  direction: str, arrays: tuple[np.ndarray, ...], threads: int) -> Bound | str:
    """The unfused equivalent of bias_act (torch: `F.<act>(x + b.view(...))`, times gain, clamped), bound to
    arrays (x, b) for the forward and (dy, x, b) otherwise; or why there is none.  Allocating calls only.

    backward: act's backward from z = x + b (what autograd saved) and db = dz summed over every axis but dim;
    forward_backward: the forward and autograd's backward to x and b."""
    ok, why = available(peer)
    if not ok:
        return why
    if peer != "torch":
        return f"no peer: {peer} has no unfused bias_act here (torch's is the reference)"
    if act != "linear" and act not in TORCH_OPS:
        return f"no peer: torch has no {act}"
    differs = None if act == "linear" else reproduces("torch", act, act_params)
    if differs:
        return differs
    import torch

    torch.set_num_threads(threads)
    entry = {"fwd": (lambda z: z, None), "bwd": (lambda d, z: d, None)} if act == "linear" else \
        torch_kernels(torch, act, act_params)
    f = entry["fwd"][0]
    ts = [_tensor(torch, a) for a in arrays]
    ndim = ts[-2].ndim
    axis = dim % ndim
    others = tuple(i for i in range(ndim) if i != axis)

    def finish(y):
        y = y if gain == 1.0 else y * gain
        return y if clamp is None else y.clamp(-clamp, clamp)

    if direction == "forward":
        x, b = ts
        bv = _bias_view(torch, b, ndim, axis)
        call = lambda: finish(f(x + bv))  # noqa: E731
        note = "unfused"
    elif direction == "backward":
        dy, x, b = ts
        z = x + _bias_view(torch, b, ndim, axis)
        if "bwd" in entry:
            g, saved = entry["bwd"][0], z
        elif "bwd_y" in entry:  # torch's sigmoid/tanh backward is from y: autograd saves y = act(z)
            g, saved = entry["bwd_y"][0], f(z)
        else:
            return f"no peer: torch has no {act} backward kernel"
        kept = None if clamp is None else (f(z) * gain).abs() <= clamp  # clipped elements get no gradient

        def call():
            d = dy if gain == 1.0 else dy * gain
            if kept is not None:
                d = d * kept
            dz = g(d, saved)
            return dz, dz.sum(others)

        note = "unfused, from saved z"
    else:
        dy, x, b = ts
        xg, bg = x.detach().requires_grad_(True), b.detach().requires_grad_(True)

        def call():
            y = finish(f(xg + _bias_view(torch, bg, ndim, axis)))
            return torch.autograd.grad(y, (xg, bg), dy)

        note = "unfused, autograd"
    try:
        call()
    except (RuntimeError, TypeError, NotImplementedError) as e:
        return f"no peer: torch bias_act({act}) {direction} failed in {arrays[0].dtype}: {str(e).splitlines()[0]}"
    return Bound("torch", call, None, note)


# torch's F.glu: glu at its definition's defaults (a sigmoid of the second half gating the first)
_F_GLU = {q.name: q.default for q in COMPOSITE_DEFINITIONS["glu"].params}


def make_gated(peer: str, op: str, act: str, act_params: dict[str, Any], gate_first: bool, layout: str,
               limit: float | None, direction: str, arrays: tuple[Any, ...], threads: int) -> Bound | str:
    """torch's equivalent of a gated op along the last axis (F.glu for glu's own form, else the unfused
    `F.<act>(gate) * up` of the two halves), bound to (x,) forward and (dy, x) otherwise; or why there is none.

    backward: from the saved halves and act(gate), as autograd's: dgate = act'(gate) * dy * up, dup = dy *
    act(gate), concatenated; forward_backward: the forward and autograd's backward."""
    ok, why = available(peer)
    if not ok:
        return why
    if peer != "torch":
        return f"no peer: {peer} has no {op} here (torch's is the reference)"
    if act not in TORCH_OPS:
        return f"no peer: torch has no {act}"
    if layout != "halves" or limit is not None:
        return f"no peer: torch has no {op} with layout={layout!r}, limit={limit}"
    differs = reproduces("torch", act, act_params)
    if differs:
        return differs
    import torch

    torch.set_num_threads(threads)
    entry = torch_kernels(torch, act, act_params)
    f = entry["fwd"][0]
    own_glu = act == _F_GLU["act"] and gate_first == (_F_GLU["activate"] == "first")  # torch's F.glu is this form

    def fwd(x):
        if own_glu:
            return torch.nn.functional.glu(x, -1)
        a, b = x.chunk(2, -1)
        gate, up = (a, b) if gate_first else (b, a)
        return f(gate) * up

    ts = [_tensor(torch, a) for a in arrays]
    note = "F.glu" if own_glu else "unfused"
    if direction == "forward":
        (x,) = ts
        call = lambda: fwd(x)  # noqa: E731
    elif direction == "backward":
        dy, x = ts
        a, b = x.chunk(2, -1)
        gate, up = (a, b) if gate_first else (b, a)
        fg = f(gate)
        if own_glu:
            call = lambda: torch.ops.aten.glu_backward(dy, x, -1)  # noqa: E731
            g = saved = None
        elif "bwd" in entry:
            g, saved = entry["bwd"][0], gate
        elif "bwd_y" in entry:
            g, saved = entry["bwd_y"][0], fg
        else:
            return f"no peer: torch has no {act} backward kernel"

        if not own_glu:
            def call():
                dgate, dup = g(dy * up, saved), dy * fg
                return torch.cat((dgate, dup) if gate_first else (dup, dgate), -1)

        note += "" if own_glu else ", from saved halves"
    else:
        dy, x = ts
        xg = x.detach().requires_grad_(True)

        def call():
            return torch.autograd.grad(fwd(xg), (xg,), dy)[0]

        note += ", autograd"
    try:
        call()
    except (RuntimeError, TypeError, NotImplementedError) as e:
        return f"no peer: torch {op} {direction} failed in {ts[-1].dtype}: {str(e).splitlines()[0]}"
    return Bound("torch", call, None, note)


# ---- ONNX Runtime -------------------------------------------------------------

def _one(t: str, **attrs: Any) -> tuple[list[tuple[str, list[str], dict]], dict[str, float]]:
    return [(t, ["x"], attrs)], {}


# op -> (parameters -> [(op_type, inputs, attributes)] from input "x" to output "y", and scalar initializers;
# None: no peer at these parameters)
_ORT_NODES: dict[str, Callable[[dict[str, Any]], Any]] = {
    "relu": lambda p: _one("Relu"),
    "relu6": lambda p: ([("Clip", ["x", "lo", "hi"], {})], {"lo": 0.0, "hi": 6.0}),
    "hardtanh": lambda p: ([("Clip", ["x", "lo", "hi"], {})], {"lo": p["min_val"], "hi": p["max_val"]}),
    "leaky_relu": lambda p: _one("LeakyRelu", alpha=p["negative_slope"]),
    "elu": lambda p: _one("Elu", alpha=p["alpha"]),
    "selu": lambda p: _one("Selu", alpha=p.get("alpha", SELU_ALPHA), gamma=p.get("scale", SELU_SCALE)),
    "celu": lambda p: _one("Celu", alpha=p["alpha"]),
    "gelu": lambda p: _one("Gelu", approximate=p["approximate"]),
    "silu": lambda p: ([("Sigmoid", ["x"], {}), ("Mul", ["x", "t0"], {})], {}),
    "sigmoid": lambda p: _one("Sigmoid"),
    "tanh": lambda p: _one("Tanh"),
    "hardswish": lambda p: _one("HardSwish"),
    "hardsigmoid": lambda p: _one("HardSigmoid", alpha=p.get("alpha", 1 / 6), beta=p.get("beta", 0.5)),
    "softplus": lambda p: _one("Softplus") if p["beta"] == 1.0 else None,
    "softsign": lambda p: _one("Softsign"),
    "mish": lambda p: _one("Mish"),
    "softshrink": lambda p: _one("Shrink", bias=p["lambd"], lambd=p["lambd"]),
    "hardshrink": lambda p: _one("Shrink", bias=0.0, lambd=p["lambd"]),
}


def _ort_nodes(op: str, p: dict[str, Any]) -> tuple[list[tuple[str, list[str], dict]], dict[str, float]] | None:
    """[(op_type, inputs, attributes)] from input "x" to output "y", and scalar initializers; None: no peer."""
    nodes = _ORT_NODES.get(op)
    return None if nodes is None else nodes(p)


# The ops ONNX Runtime runs as its own operators (those _ort_nodes spells, at their default parameters).
_ORT_OPS = {op for op, spec in OPS.items()
            if all(p.default is not REQUIRED for p in spec.params) and _ort_nodes(op, spec.validate({})) is not None}
_sessions: dict[tuple, Any] = {}


def _ort_session(op: str, params: dict[str, Any], dtype: np.dtype, threads: int) -> Any:
    key = (op, tuple(sorted(params.items())), dtype.name, threads)
    if key in _sessions:
        return _sessions[key]
    import onnx
    import onnxruntime as ort
    from onnx import helper

    nodes, consts = _ort_nodes(op, params)
    elem = helper.np_dtype_to_tensor_dtype(dtype)
    made = []
    for i, (t, ins, attrs) in enumerate(nodes):
        outname = "y" if i == len(nodes) - 1 else f"t{i}"
        made.append(helper.make_node(t, ins, [outname], **attrs))
    inits = [helper.make_tensor(k, elem, [], [v]) for k, v in consts.items()]
    graph = helper.make_graph(
        made, f"multiact_peer_{op}", [helper.make_tensor_value_info("x", elem, ["N"])],
        [helper.make_tensor_value_info("y", elem, ["N"])], inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=10)
    onnx.checker.check_model(model)
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    # Spinning workers would steal the cores from the implementations timed right after.
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    _sessions[key] = sess
    return sess


def _ort(op, direction, params, arrays, out, threads) -> Bound | str:
    if _ort_nodes(op, params) is None:
        return f"no peer: ONNX has no {op} with these parameters"
    import onnxruntime as ort

    if out.dtype.kind == "V":
        return "no peer: onnxruntime's CPU provider has no bfloat16 arithmetic"
    try:
        sess = _ort_session(op, params, out.dtype, threads)
    except Exception as e:  # e.g. Celu has no float16 kernel
        return f"no peer: onnxruntime cannot run {op} in {out.dtype}: {str(e).splitlines()[0][:120]}"
    (x,) = arrays
    flat_x, flat_o = x.reshape(-1), out.reshape(-1)
    binding = sess.io_binding()
    binding.bind_ortvalue_input("x", ort.OrtValue.ortvalue_from_numpy(flat_x))
    binding.bind_ortvalue_output("y", ort.OrtValue.ortvalue_from_numpy(flat_o))
    feed = {"x": flat_x}
    return Bound("onnxruntime", lambda: sess.run(["y"], feed)[0], lambda: sess.run_with_iobinding(binding))


# ---- NumPy formulas ------------------------------------------------------------

def _sig(x):
    return 1 / (1 + np.exp(-x))


def _erf() -> Callable | None:
    if importlib.util.find_spec("scipy") is None:
        return None
    from scipy.special import erf

    return erf


_K, _C = math.sqrt(2 / math.pi), 0.044715


def _gelu_fwd(x, p, out=None):
    if p["approximate"] == "tanh":
        return np.multiply(0.5 * x, 1 + np.tanh(_K * (x + _C * x**3)), out=out)
    return np.multiply(0.5 * x, 1 + _erf()(x * (1 / math.sqrt(2))), out=out)


def _needs_erf(p: dict[str, Any]) -> bool:
    return p["approximate"] == "none"


def _gelu_bwd(dy, x, p, out=None):
    if p["approximate"] == "tanh":
        t = np.tanh(_K * (x + _C * x**3))
        return np.multiply(dy, 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * _K * (1 + 3 * _C * x * x), out=out)
    pdf = np.exp(-0.5 * x * x) * (1 / math.sqrt(2 * math.pi))
    return np.multiply(dy, 0.5 * (1 + _erf()(x * (1 / math.sqrt(2)))) + x * pdf, out=out)


_gelu_fwd.needs_erf = _gelu_bwd.needs_erf = _needs_erf  # type: ignore[attr-defined]  # scipy's, at these params

# f(x, p, out) -> result; `out` given only where the formula's last ufunc produces the whole result.
_NUMPY_FWD: dict[str, Callable] = {
    "relu": lambda x, p, out=None: np.maximum(x, 0, out=out),
    "relu6": lambda x, p, out=None: np.clip(x, 0, 6, out=out),
    "leaky_relu": lambda x, p, out=None: np.where(x > 0, x, x * p["negative_slope"]),
    "elu": lambda x, p, out=None: np.where(x > 0, x, p["alpha"] * np.expm1(x)),
    "selu": lambda x, p, out=None: SELU_SCALE * np.where(x > 0, x, SELU_ALPHA * np.expm1(x)),
    "celu": lambda x, p, out=None: np.where(x > 0, x, p["alpha"] * np.expm1(x / p["alpha"])),
    "gelu": _gelu_fwd,
    "fast_gelu": lambda x, p, out=None: np.multiply(x, _sig(1.702 * x), out=out),
    "silu": lambda x, p, out=None: np.multiply(x, 1 / (1 + np.exp(-x)), out=out),
    "swish": lambda x, p, out=None: np.multiply(x, _sig(p["beta"] * x), out=out),
    "hardswish": lambda x, p, out=None: np.multiply(x, np.clip(x + 3, 0, 6) / 6, out=out),
    "hardsigmoid": lambda x, p, out=None: np.clip(x / 6 + 0.5, 0, 1, out=out),
    "sigmoid": lambda x, p, out=None: np.divide(1, 1 + np.exp(-x), out=out),
    "logsigmoid": lambda x, p, out=None: np.negative(np.logaddexp(0, -x), out=out),
    "tanh": lambda x, p, out=None: np.tanh(x, out=out),
    "hardtanh": lambda x, p, out=None: np.clip(x, p["min_val"], p["max_val"], out=out),
    "softplus": lambda x, p, out=None: np.where(x * p["beta"] > p["threshold"], x,
                                                np.log1p(np.exp(x * p["beta"])) / p["beta"]),
    "softsign": lambda x, p, out=None: np.divide(x, 1 + np.abs(x), out=out),
    "mish": lambda x, p, out=None: np.multiply(x, np.tanh(np.log1p(np.exp(x))), out=out),
    "softshrink": lambda x, p, out=None: np.where(x > p["lambd"], x - p["lambd"],
                                                  np.where(x < -p["lambd"], x + p["lambd"], 0)),
    "hardshrink": lambda x, p, out=None: np.where(np.abs(x) > p["lambd"], x, 0),
    "tanhshrink": lambda x, p, out=None: np.subtract(x, np.tanh(x), out=out),
    "threshold": lambda x, p, out=None: np.where(x > p["threshold"], x, p["value"]),
}

_NUMPY_BWD: dict[str, Callable] = {
    "relu": lambda d, x, p, out=None: np.multiply(d, x > 0, out=out),
    "relu6": lambda d, x, p, out=None: np.multiply(d, (x > 0) & (x < 6), out=out),
    "leaky_relu": lambda d, x, p, out=None: np.multiply(d, np.where(x > 0, 1, p["negative_slope"]), out=out),
    "elu": lambda d, x, p, out=None: np.multiply(d, np.where(x > 0, 1, p["alpha"] * np.exp(x)), out=out),
    "gelu": _gelu_bwd,
    "silu": lambda d, x, p, out=None: np.multiply(d, _sig(x) * (1 + x * (1 - _sig(x))), out=out),
    "hardswish": lambda d, x, p, out=None: np.multiply(d, np.where(x < -3, 0, np.where(x > 3, 1, x / 3 + 0.5)),
                                                       out=out),
    "hardsigmoid": lambda d, x, p, out=None: np.multiply(d, ((x > -3) & (x < 3)) / 6, out=out),
    "sigmoid": lambda d, x, p, out=None: np.multiply(d, _sig(x) * (1 - _sig(x)), out=out),
    "tanh": lambda d, x, p, out=None: np.multiply(d, 1 - np.tanh(x) ** 2, out=out),
    "hardtanh": lambda d, x, p, out=None: np.multiply(d, (x > p["min_val"]) & (x < p["max_val"]), out=out),
    "softplus": lambda d, x, p, out=None: np.multiply(d, np.where(x * p["beta"] > p["threshold"], 1,
                                                                  _sig(x * p["beta"])), out=out),
    "softsign": lambda d, x, p, out=None: np.divide(d, (1 + np.abs(x)) ** 2, out=out),
    "mish": lambda d, x, p, out=None: np.multiply(
        d, np.tanh(np.log1p(np.exp(x))) + x * _sig(x) * (1 - np.tanh(np.log1p(np.exp(x))) ** 2), out=out),
}

# Formulas whose result comes from np.where: no out= form.
_NUMPY_NO_OUT = {"leaky_relu", "elu", "selu", "celu", "softplus", "softshrink", "hardshrink", "threshold"}


def _numpy(op, direction, params, arrays, out, threads) -> Bound | str:
    needs_erf = getattr(_NUMPY_FWD[op], "needs_erf", None)
    if needs_erf is not None and needs_erf(params) and _erf() is None:
        return f"no peer: NumPy has no erf (install scipy for the {op} formula)"
    p = dict(params)
    if direction == "forward_backward":
        fwd, bwd = _NUMPY_FWD[op], _NUMPY_BWD[op]
        dy, x = arrays
        return Bound("numpy", lambda: (fwd(x, p), bwd(dy, x, p)), None, "single-threaded formula")
    fn = (_NUMPY_FWD if direction == "forward" else _NUMPY_BWD)[op]
    into = None
    if direction != "forward" or op not in _NUMPY_NO_OUT:
        into = lambda: fn(*arrays, p, out=out)  # noqa: E731
    return Bound("numpy", lambda: fn(*arrays, p), into, "single-threaded formula")
