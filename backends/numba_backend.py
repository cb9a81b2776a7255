"""The `numba` backend: parallel loops compiled by numba around one table of scalar formulas.

Each (op, direction) is one scalar formula written once against a math
namespace: for float32 the arithmetic-only functions of `numba_math` (so the
loop vectorises), for float64 libm, mirroring `multiact.reference` operation for
operation.  A factory wraps a formula in a `prange` loop, compiled lazily per
(op, direction, dtype) in two variants: serial for small arrays (no thread-pool
wake-up) and parallel.  float16 and non-contiguous arrays go through float32
(or float64) blocks of `_BLOCK` elements with `np.nditer` buffering, so an
in-place call never allocates a result-sized temporary.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import cache, lru_cache
from typing import Any

import numpy as np

import multiact.reference as _ref
from multiact._config import get_num_threads
from multiact._layout import flat_views
from multiact.ops import OPS

NAME = "numba"
PRIORITY = 20
KINDS = ("numpy",)

_PAR_MIN = 1 << 16  # below this many elements the serial loop wins (no pool wake-up)
_BLOCK = 1 << 16  # elements per buffered block (float16 / non-contiguous)
_DTYPES = ("float16", "float32", "float64")


# ---- availability -------------------------------------------------------------------------------


@lru_cache(maxsize=1)
def available() -> tuple[bool, str]:
    """(True, version) if numba imports and is recent enough; never raises."""
    try:
        import numba
    except Exception as e:  # noqa: BLE001 - any import failure means "not available"
        return False, f"numba is not importable ({type(e).__name__}: {e}); pip install numba"
    major, minor = (int(v) for v in numba.__version__.split(".")[:2])
    if (major, minor) < (0, 59):
        return False, f"numba {numba.__version__} is too old; pip install 'numba>=0.59'"
    return True, f"numba {numba.__version__}"


def info() -> dict[str, Any]:
    """Version, LLVM's host CPU name and the thread cap."""
    ok, reason = available()
    if not ok:
        return {"available": False, "reason": reason}
    import numba
    from llvmlite import binding

    return {
        "numba": numba.__version__,
        "isa": binding.get_host_cpu_name(),
        "threads": _threads(),
        "max_threads": numba.config.NUMBA_NUM_THREADS,
    }


def supports(op: str, direction: str, dtype: str) -> bool:
    if dtype not in _DTYPES or op not in OPS:
        return False
    spec = OPS[op]
    if direction in ("forward", "backward"):
        return True
    if direction == "backward_y":
        return spec.backward_y is not None
    if direction == "param_grad":
        return op in ("swish", "prelu")
    return False


def kernel(op: str, direction: str, dtype: str) -> Callable:
    """The kernel for (op, direction, dtype), following the calling conventions of the registry."""
    if not supports(op, direction, dtype):
        raise ValueError(f"numba backend has no kernel for {op} {direction} {dtype}")
    if direction == "param_grad":
        return _swish_beta_grad if op == "swish" else _prelu_weight_grad
    if op == "prelu":
        return _prelu_forward if direction == "forward" else _prelu_backward
    wd = "float64" if dtype == "float64" else "float32"

    if direction == "forward":

        def forward(x, out, p):
            _run((_formula_name(op, p), direction, wd), (x,), out, _params(op, p, dtype))

        return forward

    def backward(dy, x, out, p):
        _run((_formula_name(op, p), direction, wd), (dy, x), out, _params(op, p, dtype))

    return backward


def _formula_name(op: str, p: dict) -> str:
    return "gelu_tanh" if op == "gelu" and p.get("approximate") == "tanh" else op


# ---- prelu and the parameter gradients --------------------------------------------------------------


def _prelu_weight(p: dict, x: np.ndarray) -> np.ndarray:
    return np.asarray(p["weight"], dtype=x.dtype)


def _prelu_forward(x, out, p):
    w = _prelu_weight(p, x)
    wd = "float64" if x.dtype == np.float64 else "float32"
    if w.size == 1:  # one slope: the leaky_relu loop, contiguous fast path included
        _run(("leaky_relu", "forward", wd), (x,), out, (float(w.reshape(-1)[0]), 0.0))
    else:
        _run(("prelu", "forward", wd), (x, np.broadcast_to(w, x.shape)), out, (0.0, 0.0))


def _prelu_backward(dy, x, out, p):
    w = _prelu_weight(p, x)
    wd = "float64" if x.dtype == np.float64 else "float32"
    if w.size == 1:
        _run(("leaky_relu", "backward", wd), (dy, x), out, (float(w.reshape(-1)[0]), 0.0))
    else:
        _run(("prelu", "backward", wd), (dy, x, np.broadcast_to(w, x.shape)), out, (0.0, 0.0))


def _reduce(key: str, dy: np.ndarray, x: np.ndarray, a: float) -> float:
    """sum over all elements of a float64 term(dy, x, a), blockwise in float64."""
    if x.size == 0:
        return 0.0
    pair = _reductions(key)
    total = 0.0
    flats = flat_views(dy, x) if x.dtype == np.float64 else None
    chunks = [flats] if flats is not None else None
    if chunks is None:
        it = np.nditer(
            (dy, x), flags=["external_loop", "buffered", "zerosize_ok", "grow_inner"],
            op_flags=[["readonly"], ["readonly"]], op_dtypes=[np.float64, np.float64],
            casting="safe", buffersize=_BLOCK, order="K",
        )
        with it:
            for c in it:
                total += _reduce_call(pair, c, a)
        return total
    return _reduce_call(pair, chunks[0], a)


def _reduce_call(pair, arrays, a) -> float:
    if arrays[0].shape[0] >= _PAR_MIN and _threads() > 1:
        import numba

        numba.set_num_threads(_threads())
        return float(pair.parallel()(*arrays, a, 0.0))
    return float(pair.serial()(*arrays, a, 0.0))


def _swish_beta_grad(dy, x, p) -> float:
    """d/d(beta) of sum(dy * swish(x, beta)), accumulated in float64."""
    return _reduce("swish_beta", dy, x, float(p["beta"]))


def _prelu_weight_grad(dy, x, p) -> np.ndarray:
    """Per-channel sum of dy * x over x <= 0, in float64, shaped like the weight."""
    w = np.asarray(p["weight"])
    if w.size == 1:
        return np.full(w.shape, _reduce("prelu_weight", dy, x, 0.0))
    axis = int(p["axis"])
    xm, dym = np.moveaxis(x, axis, 0), np.moveaxis(dy, axis, 0)
    sums = np.array([_reduce("prelu_weight", dym[c], xm[c], 0.0) for c in range(xm.shape[0])])
    return sums.reshape(w.shape)


@cache
def _reductions(key: str) -> _LoopPair:
    from numba import njit

    m = _math("float64")
    sigmoid = m.sigmoid
    big = float(np.finfo(np.float64).max)
    jit = njit(inline="always", error_model="numpy")

    if key == "swish_beta":

        @jit
        def term(dy, x, beta, b):
            xc = big if x > big else (-big if x < -big else x)
            kx = xc * beta
            return dy * ((xc * sigmoid(kx)) * (xc * sigmoid(-kx)))

    else:

        @jit
        def term(dy, x, a, b):
            return 0.0 if x > 0.0 else x * dy

    return _LoopPair(term, 0, key)


# ---- parameters -------------------------------------------------------------------------------


_PARAM_NAMES = {
    "leaky_relu": ("negative_slope",),
    "elu": ("alpha",),
    "celu": ("alpha",),
    "hardtanh": ("min_val", "max_val"),
    "softplus": ("beta", "threshold"),
    "softshrink": ("lambd",),
    "hardshrink": ("lambd",),
    "threshold": ("threshold", "value"),
    "swish": ("beta",),
}


def _params(op: str, p: dict, dtype: str) -> tuple[float, float]:
    """(a, b) as float64; rounded to float32 first for float16/float32, as the tests do."""
    vals = [float(p[n]) for n in _PARAM_NAMES.get(op, ())]
    if dtype != "float64":
        vals = [float(np.float32(v)) for v in vals]
    vals += [0.0] * (2 - len(vals))
    return vals[0], vals[1]


# ---- threads and layout -----------------------------------------------------------------------------


def _threads() -> int:
    """multiact's thread budget, capped by the threads numba's pool was started with."""
    import numba

    return max(1, min(get_num_threads(), numba.config.NUMBA_NUM_THREADS))


def _dispatch(pair, arrays, a, b) -> None:
    """Run the serial or the parallel compiled loop on contiguous 1-D arrays."""
    n = arrays[0].shape[0]
    if n >= _PAR_MIN:
        t = _threads()
        if t > 1:
            import numba

            numba.set_num_threads(t)
            pair.parallel()(*arrays, a, b)
            return
    pair.serial()(*arrays, a, b)


def _run(key, ins: tuple, out: np.ndarray, ab: tuple[float, float], work=None) -> None:
    """Apply the compiled loop for `key` elementwise over ins -> out (any strides, any float dtype)."""
    if out.size == 0:
        return
    pair = _loops(key)
    a, b = ab
    if out.dtype != np.float16:
        flats = flat_views(*ins, out)
        if flats is not None:
            _dispatch(pair, flats, a, b)
            return
    wdt = np.float64 if out.dtype == np.float64 else np.float32
    it = np.nditer(
        (*ins, out),
        flags=["external_loop", "buffered", "zerosize_ok", "grow_inner"],
        op_flags=[["readonly"]] * len(ins) + [["writeonly"]],
        op_dtypes=[wdt] * (len(ins) + 1),
        casting="same_kind",
        buffersize=_BLOCK,
        order="K",
    )
    with it:
        for chunk in it:
            _dispatch(pair, chunk, a, b)


# ---- math namespaces ----------------------------------------------------------------------------


@cache
def _math(dtype: str):
    """Scalar math for formulas: numba_math for float32, libm mirroring the reference for float64."""
    from types import SimpleNamespace

    from numba import njit

    from . import numba_math

    if dtype == "float32":
        return numba_math.cpu()

    jit = njit(inline="always", error_model="numpy")
    inv_sqrt2 = 1.0 / math.sqrt(2.0)
    inv_sqrt_2pi = 1.0 / math.sqrt(2.0 * math.pi)

    @jit
    def sigmoid(x):
        e = math.exp(-abs(x))
        return 1.0 / (1.0 + e) if x >= 0 else e / (1.0 + e)

    @jit
    def sigmoid_hl(hi, lo):
        return sigmoid(hi)

    @jit
    def softplus0(z):
        return (z if z > 0.0 else 0.0) + math.log1p(math.exp(-abs(z)))

    @jit
    def softplus0_hl(hi, lo):
        return softplus0(hi)

    @jit
    def exp_hl(hi, lo):
        return math.exp(hi)

    @jit
    def expm1_hl(hi, lo):
        return math.expm1(hi)

    @jit
    def exp(x):
        return math.exp(x)

    @jit
    def expm1(x):
        return math.expm1(x)

    @jit
    def tanh(x):
        return math.tanh(x)

    @jit
    def sech2(x):
        c = math.cosh(x)
        return 1.0 / (c * c)

    @jit
    def ncdf(x):
        return 0.5 * math.erfc(-x * inv_sqrt2)

    @jit
    def npdf(xc):
        return inv_sqrt_2pi * math.exp(-0.5 * (xc * xc))

    @jit
    def split64(v):
        return v, 0.0

    @jit
    def sigmoid64_hl(hi, lo):
        return sigmoid(hi)

    @jit
    def exp64_hl(hi, lo):
        return math.exp(hi)

    @jit
    def ncdf64(x):
        return ncdf(x)

    return SimpleNamespace(**{k: v for k, v in locals().items() if k in (
        "sigmoid", "sigmoid_hl", "softplus0", "softplus0_hl", "exp_hl", "expm1_hl", "exp", "expm1", "tanh",
        "sech2", "ncdf", "npdf", "split64", "sigmoid64_hl", "exp64_hl", "ncdf64")})


# ---- the formulas -----------------------------------------------------------------------------------


@cache
def _formulas(dtype: str) -> dict[tuple[str, str], Callable]:
    """One scalar formula per (op, direction): f(x, a, b) or f(dy, x, a, b), dtype in -> dtype out."""
    from numba import njit

    m = _math(dtype)
    T = np.float32 if dtype == "float32" else np.float64
    D = np.float64
    is32 = dtype == "float32"
    jit = njit(inline="always", error_model="numpy")
    exp, expm1, tanh, sech2 = m.exp, m.expm1, m.tanh, m.sech2
    sigmoid, sigmoid_hl, softplus0, softplus0_hl = m.sigmoid, m.sigmoid_hl, m.softplus0, m.softplus0_hl
    exp_hl, expm1_hl, ncdf, npdf, split64 = m.exp_hl, m.expm1_hl, m.ncdf, m.npdf, m.split64
    sigmoid64_hl, exp64_hl, ncdf64 = m.sigmoid64_hl, m.exp64_hl, m.ncdf64
    zero, one, three, six = T(0), T(1), T(3), T(6)
    big = T(np.finfo(T).max)
    zclamp = 1e5  # |z| beyond which every sigmoid is exactly 0 or 1 (float64 too)
    scale, scale_alpha = _ref.SELU_SCALE, _ref.SELU_SCALE * _ref.SELU_ALPHA
    k2, gc = 2 * _ref.GELU_TANH_K, _ref.GELU_TANH_C
    fast_k = _ref.FAST_GELU_K
    series = tuple(T(c) for c in reversed(_ref._tanhshrink_series(22 if is32 else 44)))
    f: dict[tuple[str, str], Callable] = {}

    def reg(op, direction):
        def deco(fn):
            f[(op, direction)] = jit(fn)
            return fn

        return deco

    @jit
    def keepnan(x, r):
        return x if x != x else r

    @jit
    def clampz(z):
        z = zclamp if z > zclamp else z
        return -zclamp if z < -zclamp else z

    @jit
    def clampbig(x):
        x = big if x > big else x
        return -big if x < -big else x

    # -- piecewise linear
    @reg("relu", "forward")
    def relu(x, a, b):
        return zero if x < zero else x

    @reg("relu", "backward")
    def relu_grad(dy, x, a, b):
        return keepnan(x, dy if x > zero else zero)

    f[("relu", "backward_y")] = f[("relu", "backward")]

    @reg("relu6", "forward")
    def relu6(x, a, b):
        return zero if x < zero else (six if x > six else x)

    @reg("relu6", "backward")
    def relu6_grad(dy, x, a, b):
        return keepnan(x, dy if (x > zero) & (x < six) else zero)

    f[("relu6", "backward_y")] = f[("relu6", "backward")]

    @reg("leaky_relu", "forward")
    def leaky_relu(x, a, b):
        return x if x > zero else x * T(a)

    @reg("leaky_relu", "backward")
    def leaky_relu_grad(dy, x, a, b):
        return keepnan(x, dy if x > zero else dy * T(a))

    f[("leaky_relu", "backward_y")] = f[("leaky_relu", "backward")]

    @reg("hardtanh", "forward")
    def hardtanh(x, a, b):
        return T(a) if x < T(a) else (T(b) if x > T(b) else x)

    @reg("hardtanh", "backward")
    def hardtanh_grad(dy, x, a, b):
        return keepnan(x, dy if (x > T(a)) & (x < T(b)) else zero)

    f[("hardtanh", "backward_y")] = f[("hardtanh", "backward")]

    @reg("hardswish", "forward")
    def hardswish(x, a, b):
        xd = D(x)
        return zero if x <= -three else (x if x >= three else T(xd * (xd + 3.0) / 6.0))

    @reg("hardswish", "backward")
    def hardswish_grad(dy, x, a, b):
        mid = T(D(dy) * (D(x) / 3.0 + 0.5))
        return keepnan(x, zero if x <= -three else (mid if x < three else dy))

    @reg("hardsigmoid", "forward")
    def hardsigmoid(x, a, b):
        return zero if x <= -three else (one if x >= three else T((D(x) + 3.0) / 6.0))

    @reg("hardsigmoid", "backward")
    def hardsigmoid_grad(dy, x, a, b):
        return keepnan(x, dy / six if (x > -three) & (x < three) else zero)

    @reg("softshrink", "forward")
    def softshrink(x, a, b):
        lam = T(a)
        return keepnan(x, x - lam if x > lam else (x + lam if x < -lam else zero))

    @reg("softshrink", "backward")
    def shrink_grad(dy, x, a, b):
        return keepnan(x, dy if abs(x) > T(a) else zero)

    f[("hardshrink", "backward")] = f[("softshrink", "backward")]

    @reg("hardshrink", "forward")
    def hardshrink(x, a, b):
        return keepnan(x, x if abs(x) > T(a) else zero)

    @reg("threshold", "forward")
    def threshold(x, a, b):
        return T(b) if x <= T(a) else x

    @reg("threshold", "backward")
    def threshold_grad(dy, x, a, b):
        return keepnan(x, zero if x <= T(a) else dy)

    # -- exponential family
    @reg("elu", "forward")
    def elu(x, a, b):
        return x if x > zero else T(a * D(expm1(x)))

    @reg("elu", "backward")
    def elu_grad(dy, x, a, b):
        return dy if x > zero else T(D(dy) * (a * D(exp(x))))

    @reg("elu", "backward_y")
    def elu_grad_y(dy, y, a, b):
        return dy if y > zero else T(D(dy) * (D(y) + a))

    @reg("selu", "forward")
    def selu(x, a, b):
        return T(scale * D(x)) if x > zero else T(scale_alpha * D(expm1(x)))

    @reg("selu", "backward")
    def selu_grad(dy, x, a, b):
        return T(D(dy) * scale) if x > zero else T(D(dy) * (scale_alpha * D(exp(x))))

    @reg("selu", "backward_y")
    def selu_grad_y(dy, y, a, b):
        return T(D(dy) * scale) if y > zero else T(D(dy) * (D(y) + scale_alpha))

    @reg("celu", "forward")
    def celu(x, a, b):
        hi, lo = split64(clampz(D(x) / a))
        return x if x > zero else T(a * D(expm1_hl(hi, lo)))

    @reg("celu", "backward")
    def celu_grad(dy, x, a, b):
        hi, lo = split64(clampz(D(x) / a))
        return dy if x > zero else T(D(dy) * D(exp_hl(hi, lo)))

    @reg("celu", "backward_y")
    def celu_grad_y(dy, y, a, b):
        return dy if y > zero else T(D(dy) * (D(y) / a + 1.0))

    @reg("sigmoid", "forward")
    def sigmoid_f(x, a, b):
        return sigmoid(x)

    @reg("sigmoid", "backward")
    def sigmoid_grad(dy, x, a, b):
        return T(D(dy) * (sigmoid64_hl(x, zero) * sigmoid64_hl(-x, zero)))

    @reg("sigmoid", "backward_y")
    def sigmoid_grad_y(dy, y, a, b):
        return T(D(dy) * (D(y) * (1.0 - D(y))))

    @reg("logsigmoid", "forward")
    def logsigmoid(x, a, b):
        return -softplus0(-x)

    @reg("logsigmoid", "backward")
    def logsigmoid_grad(dy, x, a, b):
        return T(D(dy) * sigmoid64_hl(-x, zero))

    @reg("tanh", "forward")
    def tanh_f(x, a, b):
        return tanh(x)

    @reg("tanh", "backward")
    def tanh_grad(dy, x, a, b):
        return T(D(dy) * D(sech2(x)))

    @reg("tanh", "backward_y")
    def tanh_grad_y(dy, y, a, b):
        return T(D(dy) * ((1.0 - D(y)) * (1.0 + D(y))))

    @reg("softplus", "forward")
    def softplus(x, a, b):
        z = D(x) * a
        hi, lo = split64(clampz(z))
        return x if z > b else T(D(softplus0_hl(hi, lo)) / a)

    @reg("softplus", "backward")
    def softplus_grad(dy, x, a, b):
        z = D(x) * a
        hi, lo = split64(clampz(z))
        return keepnan(x, dy if z > b else T(D(dy) * D(sigmoid_hl(hi, lo))))

    @reg("softsign", "forward")
    def softsign(x, a, b):
        xd = D(x)
        return T(math.copysign(1.0, xd) if abs(xd) == math.inf else xd / (1.0 + abs(xd)))

    @reg("softsign", "backward")
    def softsign_grad(dy, x, a, b):
        d = 1.0 + abs(D(x))
        return T(D(dy) / (d * d))

    # -- x * gate(x)
    @jit
    def gated(x, s):
        """x * s (s a float64 gate, relatively accurate even where tiny); 0 where s == 0, not -inf * 0."""
        return zero if s == 0.0 else T(D(x) * s)

    @jit
    def swish_fwd(x, k):
        hi, lo = split64(clampz(D(clampbig(x)) * k))
        return gated(x, sigmoid64_hl(hi, lo))

    @jit
    def swish_bwd(dy, x, k):
        xc = clampbig(x)
        hi, lo = split64(clampz(D(xc) * k))
        s, sn = D(sigmoid_hl(hi, lo)), D(sigmoid_hl(-hi, -lo))
        return T(D(dy) * (s + ((D(xc) * s) * sn) * k))

    @reg("silu", "forward")
    def silu(x, a, b):
        return swish_fwd(x, 1.0)

    @reg("silu", "backward")
    def silu_grad(dy, x, a, b):
        return swish_bwd(dy, x, 1.0)

    @reg("swish", "forward")
    def swish(x, a, b):
        return swish_fwd(x, a)

    @reg("swish", "backward")
    def swish_grad(dy, x, a, b):
        return swish_bwd(dy, x, a)

    @reg("fast_gelu", "forward")
    def fast_gelu(x, a, b):
        return swish_fwd(x, fast_k)

    @reg("fast_gelu", "backward")
    def fast_gelu_grad(dy, x, a, b):
        return swish_bwd(dy, x, fast_k)

    @reg("gelu", "forward")
    def gelu(x, a, b):
        return gated(x, ncdf64(x))

    @reg("gelu", "backward")
    def gelu_grad(dy, x, a, b):
        xc = T(1e5) if x > T(1e5) else (T(-1e5) if x < T(-1e5) else x)
        return T(D(dy) * (D(ncdf(x)) + D(xc) * D(npdf(xc))))

    @jit
    def gelu_tanh_z(x):
        xc = D(T(1e5) if x > T(1e5) else (T(-1e5) if x < T(-1e5) else x))
        return xc, k2 * (xc + gc * (xc * xc * xc))

    @reg("gelu_tanh", "forward")
    def gelu_tanh(x, a, b):
        xc, z = gelu_tanh_z(x)
        hi, lo = split64(z)
        return gated(x, sigmoid64_hl(hi, lo))

    @reg("gelu_tanh", "backward")
    def gelu_tanh_grad(dy, x, a, b):
        xc, z = gelu_tanh_z(x)
        hi, lo = split64(z)
        s, sn = D(sigmoid_hl(hi, lo)), D(sigmoid_hl(-hi, -lo))
        dz = k2 * (1.0 + (3.0 * gc) * (xc * xc))
        return T(D(dy) * (s + ((xc * s) * sn) * dz))

    @reg("mish", "forward")
    def mish(x, a, b):
        # below -20, tanh(softplus(x)) = e^x (1 - e^x / 2 ...) = e^x to 2e-9; this keeps x e^x accurate
        # where e^x is subnormal
        return gated(x, exp64_hl(x, zero) if is32 and x < T(-20) else D(tanh(softplus0(x))))

    @reg("mish", "backward")
    def mish_grad(dy, x, a, b):
        sp = softplus0(x)
        xc = clampbig(x)
        return T(D(dy) * (D(tanh(sp)) + (D(xc) * sigmoid64_hl(x, zero)) * D(sech2(sp))))

    @reg("tanhshrink", "forward")
    def tanhshrink(x, a, b):
        x2 = x * x
        acc = zero
        for c in series:
            acc = acc * x2 + c
        small = acc * x2 * x
        ax = abs(x)
        if is32:  # 1 - tanh|x| = 2e / (1 + e), e = exp(-2|x|): no cancellation against |x|
            e = D(exp(-(ax + ax)))
            r = T((D(ax) - 1.0) + 2.0 * e / (1.0 + e))
            large = r if x >= zero else -r
        else:
            large = x - tanh(x)
        return small if ax < one else large

    @reg("tanhshrink", "backward")
    def tanhshrink_grad(dy, x, a, b):
        t = D(tanh(x))
        return T(D(dy) * (t * t))

    # -- prelu: (x, w) and (dy, x, w) with a per-element weight
    @reg("prelu", "forward")
    def prelu(x, w, a, b):
        return x if x > zero else x * w

    @reg("prelu", "backward")
    def prelu_grad(dy, x, w, a, b):
        return keepnan(x, dy if x > zero else dy * w)

    return f


# ---- loops ------------------------------------------------------------------------------------------


class _LoopPair:
    """The serial and parallel compiled loops around one scalar formula, each compiled on first use."""

    def __init__(self, scalar: Callable, arity: int, tag: str):
        self.scalar, self.arity, self.tag = scalar, arity, tag
        self._serial = self._parallel = None

    def serial(self):
        if self._serial is None:
            self._serial = _make_loop(self.scalar, self.arity, False, self.tag)
        return self._serial

    def parallel(self):
        if self._parallel is None:
            self._parallel = _make_loop(self.scalar, self.arity, True, self.tag)
        return self._parallel


_LOOP = "def {name}({args}a, b):\n    for i in prange({first}.shape[0]):\n        out[i] = {g}({items}a, b)\n"
_TEMPLATES = {
    0: "def {name}(u, v, a, b):\n    acc = 0.0\n    for i in prange(u.shape[0]):\n"
    "        acc += {g}(u[i], v[i], a, b)\n    return acc\n",
    1: _LOOP.replace("{args}", "x, out, ").replace("{first}", "x").replace("{items}", "x[i], "),
    2: _LOOP.replace("{args}", "u, v, out, ").replace("{first}", "u").replace("{items}", "u[i], v[i], "),
    3: _LOOP.replace("{args}", "u, v, w, out, ").replace("{first}", "u").replace("{items}", "u[i], v[i], w[i], "),
}


@lru_cache(maxsize=1)
def _source_tag() -> str:
    """A hash of this file and numba_math.py: on-disk cache entries are keyed by it (numba only
    watches the file that defines a cached function, not the inlined helpers)."""
    import hashlib

    from . import numba_math

    h = hashlib.sha1()
    for path in (__file__, numba_math.__file__):
        with open(path, "rb") as fh:
            h.update(fh.read())
    return h.hexdigest()[:10]


def _make_loop(g: Callable, arity: int, parallel: bool, tag: str, cache: bool = True):
    """The prange loop around g, compiled with cache=True.

    The loop is generated as a module-level function (not a closure) whose
    scalar is a module global: numba's on-disk cache keys closures by a pickle of
    their cells, which is not stable across processes, so closures never hit.
    """
    from numba import njit, prange

    name = f"_loop_{tag}_{'par' if parallel else 'ser'}_{_source_tag()}"
    # float32 loops may fuse a * b + c into one FMA (more accurate, fewer instructions); float64
    # loops stay unfused so that they round exactly like the reference formulas.
    fastmath = {"contract"} if tag.endswith("float32") else False
    gname = f"_scalar_{tag}"
    ns = globals()
    ns[gname] = g
    ns.setdefault("prange", prange)
    exec(compile(_TEMPLATES[arity].format(name=name, g=gname), __file__, "exec"), ns)
    return njit(parallel=parallel, error_model="numpy", fastmath=fastmath, cache=cache)(ns[name])


_ARITY = {"forward": 1, "backward": 2, "backward_y": 2}


@cache
def _loops(key: tuple[str, str, str]) -> _LoopPair:
    op, direction, dtype = key
    formulas = _formulas(dtype)
    arity = _ARITY[direction] + (1 if op == "prelu" else 0)
    return _LoopPair(formulas[(op, direction)], arity, f"{op}_{direction}_{dtype}")
