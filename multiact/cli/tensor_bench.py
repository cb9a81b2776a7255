"""`multiact bench --framework torch`: multiact's torch-tensor entry points against torch's own functions.

What a PyTorch user calls, on the same CPU tensors: `ma.<op>(t)` (the top-level function given a
tensor; its fwd+bwd is `ma.<op>` then `ma.<op>_grad`), `multiact.torch.<op>(t)` (with autograd) and
torch's own function (`F.<op>`, autograd for fwd+bwd).  bias_act: `ma.bias_act` / `ma.bias_act_grad`,
`multiact.torch.bias_act`, and the unfused `F.<act>(x + b.view(...))`.  Timed like `multiact bench`
(interleaved rounds, the median and IQR of samples, noisy configurations re-sampled, a copy of the same
bytes as the baseline: `Tensor.copy_`); ratios are torch's time over multiact's.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from .. import vocab
from . import bench as B
from . import peers as P

DIRECTIONS = ("forward", "forward_backward")
IMPLS = ("ma.f(t)", "mt.f(t)")


def check(directions: Sequence[str], dtypes: Sequence[str], modes: Sequence[str]) -> None:
    """ValueError for what this mode does not time, naming the option."""
    for d in directions:
        if d not in DIRECTIONS:
            raise ValueError(f"--framework torch times --direction {' or '.join(DIRECTIONS)}, got {d!r}")
    vocab.dtypes(dtypes)  # torch has every dtype: an unknown spelling is a ValueError naming the valid ones
    if "out" in modes:
        raise ValueError("--framework torch times allocating calls only (autograd allocates); drop --out")


def _bounds(op: B.OpCase, direction: str, dy: Any, x: Any, threads: int) -> list[tuple[str, P.Bound | str]]:
    """(kind, bound or why not) for ma.<op>(t), multiact.torch.<op>(t) and torch's own, on tensors dy, x."""
    import torch

    import multiact as ma
    import multiact.torch as mt

    what = f"{op.label} {direction} {str(x.dtype).replace('torch.', '')}"
    out: list[tuple[str, P.Bound | str]] = []
    if op.op == B.BIAS_ACT:
        p = dict(op.params)
        act, dim = p.pop("act"), p.pop("dim")
        own = {"dim": dim, "gain": p.pop("gain"), "clamp": p.pop("clamp")}
        c = x.shape[dim]
        b = torch.linspace(-0.5, 0.5, c).to(x.dtype)
        bg, xg = b.detach().requires_grad_(True), x.detach().requires_grad_(True)
        if direction == "forward":
            fa = lambda: ma.bias_act(x, b, act, **own, **p)  # noqa: E731
            fm = lambda: mt.bias_act(x, b, act, **own, **p)  # noqa: E731
        else:
            fa = lambda: (ma.bias_act(x, b, act, **own, **p), ma.bias_act_grad(dy, x, b, act, **own, **p))  # noqa: E731
            fm = lambda: torch.autograd.grad(mt.bias_act(xg, bg, act, **own, **p), (xg, bg), dy)  # noqa: E731
        out += [("backend", _tried("ma.f(t)", fa, what)), ("backend", _tried("mt.f(t)", fm, what))]
        arrays = (x, b) if direction == "forward" else (dy, x, b)
        out.append(("peer", P.make_bias_act("torch", act, op.act_params(), dim, own["gain"], own["clamp"], direction,
                                            arrays, threads)))
        return out
    if op.op in B.GATED:
        p = dict(op.params)
        f, g, m = getattr(ma, op.op), getattr(ma, f"{op.op}_grad"), getattr(mt, op.op)
        xg = x.detach().requires_grad_(True)
        if direction == "forward":
            fa, fm = (lambda: f(x, **p)), (lambda: m(x, **p))
        else:
            fa = lambda: (f(x, **p), g(dy, x, **p))  # noqa: E731
            fm = lambda: torch.autograd.grad(m(xg, **p), (xg,), dy)  # noqa: E731
        out += [("backend", _tried("ma.f(t)", fa, what)), ("backend", _tried("mt.f(t)", fm, what))]
        from ..gated import resolve

        cdef = B.COMPOSITE_DEFINITIONS[op.op]
        call = resolve(cdef, {k: v for k, v in p.items() if k in cdef.param_names},
                       {k: v for k, v in p.items() if k not in cdef.param_names}, f"{op.op}()")
        arrays = (x,) if direction == "forward" else (dy, x)
        out.append(("peer", P.make_gated("torch", op.op, call.act.name, call.act_p, call.gate_first, p["layout"],
                                         p.get("limit"), direction, arrays, threads)))
        return out
    params = {k: torch.as_tensor(v) if hasattr(v, "dtype") and not isinstance(v, float) else v
              for k, v in op.call_params(_np_dtype(x)).items()}
    f, g, m = getattr(ma, op.op), getattr(ma, f"{op.op}_grad"), getattr(mt, op.op)
    if direction == "forward":
        out.append(("backend", _tried("ma.f(t)", lambda: f(x, **params), what)))
        out.append(("backend", _tried("mt.f(t)", lambda: m(x, **params), what)))
    else:
        xg = x.detach().requires_grad_(True)
        out.append(("backend", _tried("ma.f(t)", lambda: (f(x, **params), g(dy, x, **params)), what)))
        out.append(("backend", _tried("mt.f(t)", lambda: torch.autograd.grad(m(xg, **params), (xg,), dy), what)))
    own_fn = P.torch_forward(op.op, params)
    if own_fn is None:
        out.append(("peer", f"no peer: torch has no {op.op}"))
    elif direction == "forward":
        out.append(("peer", _tried("torch", lambda: own_fn(x), what)))
    else:
        out.append(("peer", P.torch_autograd(own_fn, dy, x, what)))
    return out


def _shapes(op: B.OpCase, n: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(x's shape, dy's shape) for n elements of x; ValueError for a size that does not split."""
    if op.op == B.BIAS_ACT:
        shape = B.bias_act_shape(n, dict(op.params)["dim"])
        return shape, shape
    if op.op in B.GATED:
        rows, width = B.gated_shape(n)
        return (rows, width), (rows, width // 2)
    return (n,), (n,)


def _np_dtype(t: Any) -> Any:
    import numpy as np

    name = str(t.dtype).replace("torch.", "")
    return np.dtype("float32" if name == "bfloat16" else name)


def _tried(name: str, fn: Callable[[], Any], what: str) -> P.Bound | str:
    """fn as a Bound, once it has run (a dtype or parameter it refuses: why, instead of a timing)."""
    try:
        fn()
    except (RuntimeError, TypeError, ValueError, NotImplementedError) as e:
        return f"{name} cannot run {what}: {str(e).splitlines()[0][:160]}"
    return P.Bound(name, fn, None, "autograd" if name == "mt.f(t)" and "forward_backward" in what else "")


def run(ops: Sequence[B.OpCase], dtypes: Sequence[str] = ("float32",), sizes: Sequence[int] = B.DEFAULT_SIZES,
        threads: Sequence[int] | None = None, directions: Sequence[str] = DIRECTIONS, samples: int = 7,
        budget_s: float = 2.0, progress: Callable | None = None, resample: int = B.RESAMPLE,
        max_spread: float = B.MAX_SPREAD) -> dict[str, Any]:
    """Time every op's tensor entry points against torch's own; the same result dict as `bench.run`."""
    import torch

    import multiact as ma

    check(directions, dtypes, ())
    ok, why = P.available("torch")
    if not ok:
        raise ValueError(f"--framework torch needs torch: {why}")
    thread_list = list(threads or [ma.get_num_threads()])
    for op in ops:
        for n in sizes:
            _shapes(op, n)
    configs = [(op, dt, n, t, d) for op in ops for dt in dtypes for n in sizes for t in thread_list for d in directions]
    rows: list[B.Row] = []
    skipped: list[dict[str, str]] = []
    old = ma.get_num_threads(), torch.get_num_threads()
    gen = torch.Generator().manual_seed(0)
    items = progress(configs, len(configs)) if progress else configs
    try:
        for op, dt, n, t, d in items:
            ma.set_num_threads(t)
            torch.set_num_threads(t)
            tdt = getattr(torch, dt)
            shape, dy_shape = _shapes(op, n)
            x = (torch.randn(shape, generator=gen) * 3).to(tdt)
            dy = torch.randn(dy_shape, generator=gen).to(tdt)
            small, dy_small = _shapes(op, 64)
            for _kind, b in _bounds(op, d, dy.reshape(-1)[: math.prod(dy_small)].reshape(dy_small),
                                    x.reshape(-1)[:64].reshape(small), t):
                if not isinstance(b, str):  # once on 64 elements: JIT compilation is not a slow first call
                    b.alloc()
            where = f"{op.label} {d} {dt}"
            fns: list[Callable[[], Any]] = []
            labels: list[tuple[str, str, str, str]] = []
            for kind, b in _bounds(op, d, dy, x, t):
                if isinstance(b, str):
                    skipped.append({"impl": "torch" if kind == "peer" else b.split(" ")[0], "case": where, "why": b})
                    continue
                fns.append(b.alloc)
                labels.append((b.name, kind, "alloc", b.note))
            moved = int(op.streams(d) * n)
            src = torch.ones(max(1, moved // 2), dtype=tdt)
            dst = torch.empty_like(src)
            fns.insert(0, lambda s=src, o=dst: o.copy_(s))
            labels.insert(0, ("copy", "baseline", "out", "Tensor.copy_ of the same bytes"))
            meta = dict(op=op.label, direction=d, dtype=dt, size=n, threads=t, bytes=moved * x.itemsize,
                        shape=tuple(shape) if len(shape) > 1 else None)
            rows += B.timed_rows(fns, labels, meta, samples, budget_s, resample, max_spread)
    finally:
        ma.set_num_threads(old[0])
        torch.set_num_threads(old[1])
    return {"rows": rows, "skipped": skipped, "skipped_backends": {}, "missing_peers": {}}
