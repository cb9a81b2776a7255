"""`multiact bench --quant`: quantized outputs timed, per op, quant, backend and size, in one interleaved run each:

- `quant`: `ma.<op>(x, quant=Q, backend=B)` (codes and scales, allocating);
- `plain`: the same op on the same backend with an output of x's dtype (allocating): the issue's floor is
  quant / plain <= 1.25 for bfloat16 input and float8_e4m3fn per token or per group of 128;
- `torch`: the unfused composition a PyTorch user writes on the CPU, on the same values: the op in float32 on
  the widened input (torch's own function; the gated ops as F.<act>(gate) * up), the amax per row or group,
  the divide, the clamp and the cast (int8: round then cast); the floor: torch / quant >= 3.
The ops are `multiact bench`'s (--op, elementwise and gated); bias_act is not timed here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .. import quant as Q
from ._report import table


def parse_quant(text: str) -> Q.Quant:
    """'float8_e4m3fn:token', 'float8_e4m3fn:group:128', 'int8:tensor', 'float8_e5m2:mx[:floor]'."""
    dtype, *rest = text.strip().split(":")
    if not rest:
        raise ValueError(f"--quant {text!r}: use DTYPE:GRANULARITY[:GROUP_SIZE | :RULE], e.g. float8_e4m3fn:group:128")
    gran, *more = rest
    kw: dict[str, Any] = {}
    if gran == "group":
        if not more:
            raise ValueError(f"--quant {text!r}: a group needs its size, e.g. {dtype}:group:128")
        kw["group_size"] = int(more[0])
    elif gran == "mx" and more:
        kw["rule"] = more[0]
    elif more:
        raise ValueError(f"--quant {text!r}: granularity {gran!r} takes nothing after it")
    return Q.Quant(dtype, gran, **kw)


def label(q: Q.Quant) -> str:
    return f"{q.dtype}:{q.granularity}" + (f":{q.group_size}" if q.group_size else "") + (
        f":{q.rule}" if q.granularity == "mx" else "")


def torch_composition(torch: Any, y: Any, q: Q.Quant) -> Any:
    """The unfused quantization of a float32 tensor y, as a PyTorch user writes it (amax, divide, clamp, cast)."""
    block = q.block or y.shape[-1]
    g = y.reshape(-1) if q.granularity == "tensor" else y.reshape(*y.shape[:-1], -1, block)
    amax = g.abs().amax() if q.granularity == "tensor" else g.abs().amax(-1, keepdim=True)
    if q.granularity == "mx":
        scale = torch.exp2(torch.ceil(torch.log2(amax / q.qmax)))
    else:
        scale = torch.clamp(amax / q.qmax, min=Q.TINY)
    r = torch.clamp(g / scale, -q.qmax, q.qmax)
    codes = r.round().to(torch.int8) if q.dtype == "int8" else r.to(getattr(torch, q.dtype))
    return codes, scale


def _torch_op(op: Any, x: np.ndarray, threads: int) -> Callable[[], Any] | str:
    """torch's float32 forward of the op on x widened (a callable returning a tensor), or why there is none."""
    import torch

    from . import bench, peers

    torch.set_num_threads(threads)
    x32 = torch.from_numpy(np.ascontiguousarray(x.astype(np.float32)))
    if op.op in bench.GATED:
        b = bench.bind("peer:torch", op, "forward", (x32.numpy(),), None, threads)
        return b if isinstance(b, str) else b.alloc
    f = peers.torch_forward(op.op, op.call_params(np.dtype(np.float32)))
    if f is None:
        return f"no peer: torch has no {op.op}"
    return lambda: f(x32)


def run(ops: Sequence[Any], quants: Sequence[Q.Quant], dtypes: Sequence[str], sizes: Sequence[int], threads: int,
        backends: Sequence[str], samples: int = 7, progress: Callable | None = None) -> dict[str, Any]:
    """Rows {op, quant, dtype, n, backend, quant_s, plain_s, torch_s, ...} (seconds per call, medians)."""
    import multiact as ma

    from . import bench

    rows, skipped = [], []
    rng = np.random.default_rng(0)
    jobs = [(op, q, dt, n) for op in ops for q in quants for dt in dtypes for n in sizes]
    old = ma.get_num_threads()
    ma.set_num_threads(threads)
    try:
        for op, q, dt, n in progress(jobs, len(jobs)) if progress else jobs:
            if op.op == bench.BIAS_ACT:
                skipped.append(f"{op.label}: bias_act is not timed by --quant")
                continue
            shape = bench.gated_shape(n) if op.op in bench.GATED else (n // 4096, 4096) if n >= 4096 else (1, n)
            x = (rng.standard_normal(shape, dtype=np.float32) * 3).astype(_np_dtype(dt))
            p = op.call_params(x.dtype) if op.op not in bench.GATED else dict(op.params)
            torch_y = _torch_op(op, x, threads)
            for b in backends:
                fns = _variants(getattr(ma, op.op), x, b, q, p, torch_y)
                try:
                    timed = bench.time_interleaved(fns, samples=samples)
                except Exception as e:  # a backend that cannot run the case is a line of the report
                    skipped.append(f"{op.label} {label(q)} {dt} {b}: {type(e).__name__}: {e}")
                    continue
                med = [float(np.median(s)) for s, _ in timed]
                rows.append({"op": op.label, "quant": label(q), "dtype": dt, "n": n, "backend": b,
                             "quant_s": med[0], "plain_s": med[1], "torch_s": med[2] if len(med) > 2 else None,
                             "torch_note": torch_y if isinstance(torch_y, str) else ""})
    finally:
        ma.set_num_threads(old)
    return {"rows": rows, "skipped": skipped, "threads": threads}


def _np_dtype(name: str) -> np.dtype:
    from .. import vocab

    if vocab.DTYPES[name].needs:  # bfloat16: ml_dtypes'
        from .. import dtypes as _dtypes

        return np.dtype(_dtypes.bfloat16)
    return np.dtype(name)


def _variants(f: Callable, x: np.ndarray, backend: str, q: Q.Quant, p: dict,
              torch_y: Callable | str) -> list[Callable[[], Any]]:
    """The calls timed against each other: quantized, plain, and (where torch has the op) torch's composition."""
    fns = [lambda: f(x, backend=backend, quant=q, **p), lambda: f(x, backend=backend, **p)]
    if not isinstance(torch_y, str):
        import torch

        fns.append(lambda: torch_composition(torch, torch_y(), q))
    return fns


def render(res: dict[str, Any]) -> str:
    from .bench import size_label

    out = []
    for r in res["rows"]:
        t = r["torch_s"]
        out.append([r["op"], r["quant"], r["dtype"], size_label(r["n"]), r["backend"], f"{r['quant_s'] * 1e3:.3f}",
                    f"{r['plain_s'] * 1e3:.3f}", f"{r['quant_s'] / r['plain_s']:.2f}x",
                    "-" if t is None else f"{t * 1e3:.3f}", "-" if t is None else f"{t / r['quant_s']:.2f}x"])
    lines = [table(out, ["op", "quant", "dtype", "size", "backend", "quant ms", "plain ms", "quant / plain",
                         "torch ms", "torch / quant"])]
    lines.append(f"{res['threads']} thread(s); medians of interleaved rounds. quant: ma.<op>(x, quant=Q); plain: "
                 "the same op and backend with an output of x's dtype; torch: the op in float32 on the widened "
                 "input, amax per row or group, divide, clamp, cast (the unfused composition). Floors (issue 45): "
                 "quant / plain <= 1.25 (native, bfloat16 in, float8_e4m3fn per token or group 128); "
                 "torch / quant >= 3.")
    lines += [f"skipped: {s}" for s in res["skipped"]]
    return "\n".join(lines)
