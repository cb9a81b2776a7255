"""The `numpy` backend: the reference formulas evaluated blockwise.

float64 in float64; float32 in float32, except the x * gate(x) ops and those with a scaled exponential
argument (gelu, silu, celu, ...: `_wide32`), in float64 rounded once, whose float32 tails were far off.

It always works.  Blocks keep every temporary cache-sized (so out=x in place
allocates nothing result-sized) and let float16 and bfloat16 be computed in
float32 and rounded once on the way out (bfloat16 through its bits, with
`multiact.dtypes`' conversions: the same bits as every other backend).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from multiact import vocab
from multiact._layout import flat_views
from multiact.dtypes import bf16_bits_to_f32, f32_bits_to_bf16, is_bf16, to_float32
from multiact.optable import BIAS_ACT_KEYS, FAMILY_KEYS, KEYS, in_float32

NAME = "numpy"
PRIORITY = 10
KINDS = ("numpy",)
# 8K elements: float64 temporaries stay at 64 KiB, under glibc's mmap threshold even where it is
# pinned at its default (dask's workers set MALLOC_TRIM_THRESHOLD_, which does that).
_BLOCK = 1 << 13


def available() -> tuple[bool, str]:
    return True, "NumPy formulas, always available"


def info() -> dict:
    return {"numpy": np.__version__, "block": _BLOCK}


def supports(key: str, direction: str, dtype: str) -> bool:
    if dtype not in vocab.DTYPES:
        return False
    if key in BIAS_ACT_KEYS and direction == "backward_y":  # linear, or an activation with a y form
        return BIAS_ACT_KEYS[key][2] == "linear" or BIAS_ACT_KEYS[key][1].backward_y is not None
    if key in FAMILY_KEYS or key in BIAS_ACT_KEYS:
        return direction in ("forward", "backward")
    if direction == "backward2":  # second order: g * dy * f''(x), wherever the op has the reference
        return key in KEYS and KEYS[key].backward2 is not None
    if direction in ("param_grad2", "param_grad2_param"):  # elementwise, in the learnable parameter
        return key in KEYS and KEYS[key].param_grad2_ref is not None
    return key in KEYS and KEYS[key].has(direction)


def _blocks(arrays: tuple[np.ndarray, ...], out: np.ndarray):
    """Yield (input blocks..., out block) in the compute dtype (float32 for float16 and bfloat16)."""
    if out.dtype.kind == "V":  # bfloat16
        yield from _bf16_blocks(arrays, (out,))
        return
    if out.dtype != np.float16:
        flat = flat_views(*arrays, out)
        if flat is not None:  # contiguous: plain slices, no iterator set-up
            for i in range(0, max(out.size, 1) if out.ndim else 1, _BLOCK):
                yield tuple(a[i : i + _BLOCK] for a in flat)
            return
    compute = np.float32 if out.dtype == np.float16 else out.dtype
    it = np.nditer(
        arrays + (out,),
        flags=["external_loop", "buffered", "zerosize_ok", "refs_ok"],
        op_flags=[["readonly"]] * len(arrays) + [["writeonly"]],
        op_dtypes=[compute] * (len(arrays) + 1),
        casting="same_kind",
        buffersize=_BLOCK,
    )
    with it:
        yield from it


def _scalar_params(op: str, p: dict) -> dict:
    """The parameters a reference takes by keyword: all but an array parameter's (prelu's weight and axis)."""
    return {k: v for k, v in p.items() if k not in _array_params(op)}


def _array_params(op: str) -> tuple[str, ...]:
    """An op with an array parameter: its parameters in the reference's positional order (the array given
    blockwise, broadcast to x), else ()."""
    d = KEYS[op].defn
    return d.param_names if d.array_param else ()


def _svml32() -> bool:
    """Whether NumPy's float32 exp, tanh, log... run SVML's AVX-512 code (CPUs with AVX512_SKX: Xeon, Zen 4):
    less accurate than its AVX2 code, tanh's backward 6.6 ulp (4e / (1 + e)^2 near x = 3.5, Zen 4), over the
    contract's 4; there every smooth op's float32 blocks go through float64."""
    try:
        from numpy._core._multiarray_umath import __cpu_features__
    except ImportError:  # NumPy 1.x
        from numpy.core._multiarray_umath import __cpu_features__
    return bool(__cpu_features__.get("AVX512_SKX"))


_SVML32 = _svml32()


def _wide32(spec) -> bool:
    """Whether float32 blocks of the op are evaluated in float64 (and rounded once): the x * gate(x) ops (their
    derivative crosses zero away from a kink: Tolerance.bwd_atol) and those with a scaled exponential argument
    (Tolerance.cond: celu's x / alpha, softplus's beta * x), whose float32 formulas round that argument before
    the exponential and cancel in the tails: up to ~180 ulp off (gelu near x = -12, celu alpha=0.3 62, issue 19).
    The other smooth ops are within 4 ulp in float32 (results/accuracy-f32-subset-numpy.txt) and
    1.1-4.7x slower in float64, so stay there, except where NumPy's float32 math is SVML's (`_svml32`)."""
    return not spec.exact and (_SVML32 or spec.tol.bwd_atol > 0 or spec.tol.cond is not None)


def _elementwise(op: str, fn: Callable, n_in: int, wide32: bool = False) -> Callable:
    """A reference formula blockwise; with wide32, float32 blocks in float64, the parameters rounded to
    float32 first (what the float32 kernels and the reference are given)."""
    positional = _array_params(op)  # prelu: (weight, axis)
    array = KEYS[op].defn.array_param

    def run(*args):
        *arrays, out, p = args
        if positional:
            w = np.broadcast_to(p[array], out.shape)
            for *blocks, ob in _blocks((*arrays, w), out):
                *ins, wb = blocks
                ob[...] = fn(*ins, *[wb if n == array else p[n] for n in positional])
            return
        q = _scalar_params(op, p)
        if wide32 and out.dtype == np.float32:
            q = in_float32(q)
            with np.errstate(over="ignore"):  # a float64 result beyond float32's range rounds to inf
                for *blocks, ob in _blocks(tuple(arrays), out):
                    ob[...] = fn(*(b.astype(np.float64) for b in blocks), **q)
            return
        for *blocks, ob in _blocks(tuple(arrays), out):
            ob[...] = fn(*blocks, **q)

    return run


def _param_grad(op: str, fn: Callable) -> Callable:
    positional = _array_params(op)
    if positional:  # prelu: fn(dy, x, weight, axis), one sum per channel
        return lambda dy, x, p: fn(_f32(dy), _f32(x), *[p[n] for n in positional])

    def run(dy, x, p):
        if is_bf16(x.dtype):  # float32 blocks from the bits (exact), summed in float64
            return sum(fn(dyb.astype(np.float64), xb.astype(np.float64), **_scalar_params(op, p))
                       for dyb, xb in _bf16_blocks((dy, x), ()))
        it = np.nditer(
            (dy, x),
            flags=["external_loop", "buffered", "zerosize_ok"],
            op_dtypes=[np.float64, np.float64],
            casting="safe",
            buffersize=_BLOCK,
        )
        with it:
            return sum(fn(dyb, xb, **_scalar_params(op, p)) for dyb, xb in it)

    return run


def _gated(key: str, direction: str) -> Callable:
    """gated:<act>: the activation's reference formula on the gate block times the up block (float32 for
    float16); the backward computes both results of a block before writing either (in place is safe)."""
    _, act, _ = FAMILY_KEYS[key]
    names = act.param_names

    def clipped(gate, up, p):
        limit = p["limit"]
        if limit == np.inf:
            return gate, up
        g = np.where(gate > limit, gate.dtype.type(limit), gate)
        u = np.where(up > limit, up.dtype.type(limit), np.where(up < -limit, up.dtype.type(-limit), up))
        return g, (u + up.dtype.type(p["shift"]) if p["shift"] else u)

    if direction == "forward":
        def forward(gate, up, out, p):
            q = {k: p[k] for k in names}
            with np.errstate(all="ignore"):  # inf * 0 is NaN, as the product is, without a warning
                for gb, ub, ob in _blocks((gate, up), out):
                    g, u = clipped(gb, ub, p)
                    ob[...] = act.forward(g, **q) * u
        return forward

    def backward(dy, gate, up, dgate, dup, p):
        q = {k: p[k] for k in names}
        limit = p["limit"]
        with np.errstate(all="ignore"):
            _backward(dy, gate, up, dgate, dup, p, q, limit)

    def _backward(dy, gate, up, dgate, dup, p, q, limit):
        for db, gb, ub, dgb, dub in _blocks2((dy, gate, up), (dgate, dup)):
            g, u = clipped(gb, ub, p)
            rg = act.backward(db * u, g, **q)
            ru = db * act.forward(g, **q)
            if limit != np.inf:
                rg = np.where(gb > limit, rg.dtype.type(0), rg)
                ru = np.where(np.abs(ub) > limit, ru.dtype.type(0), ru)
            dgb[...] = rg
            dub[...] = ru
    return backward


def _bias_act(key: str, direction: str) -> Callable:
    """bias_act:<act> on (outer, C, inner) views: the activation's reference formula on x * scale + b, in
    the compute dtype; the backward's db / dscale are float64 sums of the block results."""
    _, act, _ = BIAS_ACT_KEYS[key]
    names, fwd, bwd = act.param_names, act.forward, act.backward

    def sides(x3, b, s):
        """b and scale broadcastable to x3 ((1, C, 1) for one value per channel), those given."""
        c = x3.shape[1]
        return tuple(a if a.ndim == 3 else a.reshape(1, c, 1) for a in (b, s) if a is not None)

    def z_of(xb, side_blocks, b, s):
        it = iter(side_blocks)
        bb = None if b is None else next(it)
        sb = None if s is None else next(it)
        z = xb if sb is None else xb * sb
        return (z if bb is None else z + bb), sb

    if direction == "forward":
        def forward(x3, b, s, out3, p):
            q = {k: p[k] for k in names}
            gain, clamp = p["gain"], p["clamp"]
            n = len(sides(x3, b, s))
            with np.errstate(all="ignore"):
                for blocks in _blocks2((x3, *sides(x3, b, s)), (out3,)):
                    z, _ = z_of(blocks[0], blocks[1:1 + n], b, s)
                    y = fwd(z, **q)
                    if gain != 1.0:
                        y = y * y.dtype.type(gain)
                    blocks[-1][...] = y if clamp == np.inf else np.clip(y, -clamp, clamp)
        return forward

    if direction == "backward_y":  # fused_bias_act's y= rules: dz = act'(y / gain) * dy * gain, 0 where |y| >= clamp
        ybwd = (lambda e, a: e) if act.name == "linear" else act.backward_y

        def backward_y(dy3, y3, b, s, dx3, db_full, ds_full, p):
            q = {k: p[k] for k in names}
            gain, clamp = p["gain"], p["clamp"]
            compute = _compute(y3.dtype)
            keep = p["sum_db"] or db_full is not None
            dz = np.empty(y3.shape, compute) if keep else None
            with np.errstate(all="ignore"):
                for blocks in _blocks2((dy3, y3), (dx3,) if dz is None else (dx3, dz)):
                    dyb, yb = blocks[0], blocks[1]
                    g = dyb.dtype.type(gain)
                    e = dyb * g if gain != 1.0 else dyb
                    if clamp != np.inf:
                        e = np.where(np.abs(yb) >= clamp, e.dtype.type(0), e)
                    blocks[2][...] = r = ybwd(e, yb / g, **q)
                    if dz is not None:
                        blocks[3][...] = r
                if db_full is not None:
                    _put(db_full, dz)
                if not p["sum_db"]:
                    return None
                sums = np.zeros((2, y3.shape[1]))
                sums[0] = dz.sum(axis=(0, 2), dtype=np.float64)
            return sums
        return backward_y

    def backward(dy3, x3, b, s, dx3, db_full, ds_full, p):
        q = {k: p[k] for k in names}
        gain, clamp = p["gain"], p["clamp"]
        keep = p["sum_db"] or p["sum_dscale"] or db_full is not None or ds_full is not None
        compute = _compute(x3.dtype)
        dz = np.empty(x3.shape, compute) if keep else None
        side = sides(x3, b, s)
        with np.errstate(all="ignore"):
            outs = (dx3,) if dz is None else (dx3, dz)
            for blocks in _blocks2((dy3, x3, *side), outs):
                dyb, xb = blocks[0], blocks[1]
                z, sb = z_of(xb, blocks[2:2 + len(side)], b, s)
                e = dyb * dyb.dtype.type(gain) if gain != 1.0 else dyb
                if clamp != np.inf:
                    e = np.where(np.abs(fwd(z, **q) * z.dtype.type(gain)) > clamp, e.dtype.type(0), e)
                g = bwd(e, z, **q)
                if dz is not None:
                    blocks[-1][...] = g
                blocks[2 + len(side)][...] = g if sb is None else g * sb
            if dz is None:
                return None
            if db_full is not None:
                _put(db_full, dz)
            if ds_full is not None:
                _put(ds_full, dz * _f32(x3))
            if not (p["sum_db"] or p["sum_dscale"]):
                return None
            sums = np.zeros((2, x3.shape[1]))
            if p["sum_db"]:
                sums[0] = dz.sum(axis=(0, 2), dtype=np.float64)
            if p["sum_dscale"]:
                sums[1] = (dz.astype(np.float64) * _f32(x3)).sum(axis=(0, 2))
        return sums
    return backward


def _bf16_blocks(arrays: tuple[np.ndarray, ...], outs: tuple[np.ndarray, ...]):
    """Blocks of bfloat16 arrays as float32 (exact), the bfloat16 out blocks float32 temporaries rounded once
    into the outputs' bits when the caller has filled them (before the next block is read: in place is safe).
    Operands of another dtype (a float32 scratch array) are float32 blocks of their own, written directly."""
    n = len(arrays)
    ops = arrays + outs
    bf = [is_bf16(a.dtype) for a in ops]
    it = np.nditer(
        tuple(a.view(np.uint16) if b else a for a, b in zip(ops, bf, strict=True)),
        flags=["external_loop", "buffered", "zerosize_ok", "refs_ok"],
        op_flags=[["readonly"]] * n + [["writeonly"]] * len(outs),
        op_dtypes=[np.uint16 if b else np.float32 for b in bf],
        casting="same_kind",
        buffersize=_BLOCK,
    )
    with it:
        for chunk in it:
            ins = tuple(bf16_bits_to_f32(c) if b else c for c, b in zip(chunk[:n], bf, strict=False))
            res = tuple(np.empty(chunk[0].shape, np.float32) if b else c
                        for c, b in zip(chunk[n:], bf[n:], strict=True))
            yield (*ins, *res)
            for dst, r, b in zip(chunk[n:], res, bf[n:], strict=True):
                if b:
                    f32_bits_to_bf16(r, out=dst)


def _put(dst: np.ndarray, src: np.ndarray) -> None:
    """dst[...] = src (a float32 result), rounded once; bfloat16 by `multiact.dtypes`, not ml_dtypes' cast."""
    if is_bf16(dst.dtype):
        f32_bits_to_bf16(np.broadcast_to(src, dst.shape), out=dst.view(np.uint16))
    else:
        dst[...] = src


def _f32(a: np.ndarray) -> np.ndarray:
    """a in the compute dtype of a float32 product (bfloat16 widened exactly)."""
    return to_float32(a) if is_bf16(a.dtype) else a


def _compute(dt: np.dtype):
    return np.float32 if dt == np.float16 or is_bf16(dt) else dt


def _blocks2(arrays: tuple[np.ndarray, ...], outs: tuple[np.ndarray, ...]):
    """Blocks of several inputs and several outputs, in the compute dtype (float32 for float16, bfloat16)."""
    if is_bf16(outs[0].dtype):
        yield from _bf16_blocks(arrays, outs)
        return
    compute = _compute(outs[0].dtype)
    it = np.nditer(
        arrays + outs,
        flags=["external_loop", "buffered", "zerosize_ok", "refs_ok"],
        op_flags=[["readonly"]] * len(arrays) + [["writeonly"]] * len(outs),
        op_dtypes=[compute] * (len(arrays) + len(outs)),
        casting="same_kind",
        buffersize=_BLOCK,
    )
    with it:
        yield from it


def kernel(key: str, direction: str, dtype: str) -> Callable:
    """Any op of the table (a registered one too) from its float64 reference; a variant's key runs
    its op's reference, which reads the variant from the parameters; a composite key (gated:silu)
    composes its activation's reference."""
    if key in FAMILY_KEYS:
        return _gated(key, direction)
    if key in BIAS_ACT_KEYS:
        return _bias_act(key, direction)
    spec = KEYS[key]
    if direction == "forward":
        return _elementwise(spec.name, spec.forward, 1, _wide32(spec))
    if direction == "backward":
        return _elementwise(spec.name, spec.backward, 2, _wide32(spec))
    if direction == "backward_y":
        return _elementwise(spec.name, spec.backward_y, 2, _wide32(spec))
    if direction == "backward2":  # kernel(g, dy, x, out, p)
        return _elementwise(spec.name, spec.backward2, 3, _wide32(spec))
    if direction in ("param_grad2", "param_grad2_param"):  # kernel(g, dy, x, out, p), elementwise
        return _elementwise(spec.name, spec.param_grad2_ref[direction == "param_grad2_param"], 3, _wide32(spec))
    return _param_grad(spec.name, spec.param_grad[1])
