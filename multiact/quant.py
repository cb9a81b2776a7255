"""Quantized outputs: FP8 (e4m3fn, e5m2) or INT8 codes with their scales, per tensor, token, group or MX block.

The contract, one definition for every backend (shared/DESIGN.md, "Quantized outputs"):

- The values quantized are float32: an activation's float32 result before any final rounding; for
  `quantize(y, q)` the values of y as float32 (exact for float16, bfloat16 and float32; float64 rounds once).
- Groups run along the last axis: "tensor" (one group: the whole array), "token" (one per row), "group"
  (`group_size` 32, 64 or 128 consecutive elements), "mx" (OCP MX blocks of 32).  The last axis must be a
  multiple of the group's size.
- The scale of a group comes from amax = max |v| over it, in float32: amax is capped at `scale_ub` and
  raised to `amax_floor` where they are given; scale = amax / qmax (qmax: 448 for float8_e4m3fn, 57344 for
  float8_e5m2, 127 for int8), at least 2^-149 (a quotient that underflows to 0 takes the smallest subnormal),
  rounded up to a power of two with `pow2=True` (UE8M0-style float32 scales).  MX
  scales are E8M0 powers of two: 2^ceil(log2(amax / qmax)) (rule "ceil": NVIDIA, CANN, torchao) or
  2^(floor(log2(amax)) - emax) (rule "floor": the OCP spec; emax 8 for e4m3fn, 15 for e5m2), the exponent
  clamped to E8M0's [-127, 127].  A static tensor scale (`scale=`) is used as given.
- An all-zero group gets scale 1 (its codes are 0).  A group holding a NaN gets a NaN scale (the quiet NaN
  0x7fc00000, whatever the NaN's own bits), one holding an infinity (and no NaN) an infinite scale (E8M0:
  NaN, it has no infinity): never a finite one, so every element of that group dequantizes to a non-finite
  value (0 * inf and x * NaN are NaN).
- A code is v / scale in float32, rounded to nearest even into the target format and saturated to its
  largest finite value (PTX's satfinite, for both float8 formats): beyond qmax, and +-inf (a static scale),
  become +-qmax; NaN stays NaN in float8 and becomes 0 in int8 (its scale says NaN).
- int8 with symmetric=False is vLLM's zero-point (azp) form: scale = (max - min) / 255 over the group (all
  values equal: scale 1), zero point = rint(-128 - min / scale), code = clip(rint(v / scale) + zp, -128, 127);
  the result is then (codes, scale, zero point).

Results: NumPy codes of `ml_dtypes` float8 types or int8 and float32 scales of shape
`x.shape[:-1] + (groups,)` (a 0-d scale for "tensor"; `ml_dtypes.float8_e8m0fnu` for MX); for torch tensors,
torch float8 / int8 codes and float32 (or float8_e8m0fnu) scales.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import _arrays

QMAX = {"float8_e4m3fn": 448.0, "float8_e5m2": 57344.0, "int8": 127.0}
EMAX = {"float8_e4m3fn": 8, "float8_e5m2": 15}  # the element format's largest normal exponent (OCP MX)
GRANULARITIES = ("tensor", "token", "group", "mx")
GROUP_SIZES = (32, 64, 128)
MX_BLOCK = 32
RULES = ("ceil", "floor")
TINY = np.finfo(np.float32).smallest_subnormal  # the least scale (2^-149): a float32 scale is never 0


@dataclass(frozen=True)
class Quant:
    """How an output is quantized: `ma.Quant("float8_e4m3fn", "group", group_size=128)`.

    dtype: "float8_e4m3fn", "float8_e5m2" or "int8"; granularity: "tensor", "token", "group" or "mx";
    scale: a static per-tensor scale (granularity "tensor"); group_size: 32, 64 or 128 ("group"); rule:
    "ceil" or "floor" (MX's E8M0 scale); symmetric: False for int8 with a zero point; scale_ub: an upper
    bound on amax; amax_floor: a lower bound on amax; pow2: round float32 scales up to powers of two."""

    dtype: str
    granularity: str = "tensor"
    scale: float | None = None
    group_size: int | None = None
    rule: str = "ceil"
    symmetric: bool = True
    scale_ub: float | None = None
    amax_floor: float | None = None
    pow2: bool = False

    def __post_init__(self) -> None:
        where = "Quant()"
        if self.dtype not in QMAX:
            raise ValueError(f"{where}: dtype must be one of {tuple(QMAX)}, got {self.dtype!r}")
        if self.granularity not in GRANULARITIES:
            raise ValueError(f"{where}: granularity must be one of {GRANULARITIES}, got {self.granularity!r}")
        if self.granularity == "group":
            if self.group_size not in GROUP_SIZES:
                raise ValueError(f"{where}: group_size must be one of {GROUP_SIZES} with granularity 'group', "
                                 f"got {self.group_size!r}")
        elif self.group_size is not None:
            raise ValueError(f"{where}: group_size applies to granularity 'group' only (got {self.granularity!r})")
        if self.scale is not None:
            if self.granularity != "tensor":
                raise ValueError(f"{where}: a static scale applies to granularity 'tensor' only")
            _positive(where, "scale", self.scale)
        for name in ("scale_ub", "amax_floor"):
            v = getattr(self, name)
            if v is not None:
                _positive(where, name, v)
        if self.rule not in RULES:
            raise ValueError(f"{where}: rule must be one of {RULES}, got {self.rule!r}")
        if self.granularity == "mx" and self.dtype not in EMAX:
            raise ValueError(f"{where}: granularity 'mx' takes a float8 dtype ({', '.join(EMAX)}); MXINT8's "
                             "fixed-point elements are not built")
        if not self.symmetric and self.dtype != "int8":
            raise ValueError(f"{where}: symmetric=False (a zero point) applies to int8 only")
        if not self.symmetric and (self.scale is not None or self.granularity == "mx" or self.pow2):
            raise ValueError(f"{where}: symmetric=False takes a dynamic scale ('tensor', 'token' or 'group', "
                             "no pow2)")

    @property
    def block(self) -> int | None:
        """The group's length along the last axis (None: the whole array or the whole row)."""
        return MX_BLOCK if self.granularity == "mx" else self.group_size

    @property
    def qmax(self) -> float:
        return QMAX[self.dtype]


def _positive(where: str, name: str, v: Any) -> None:
    if isinstance(v, bool) or not isinstance(v, (int, float, np.floating, np.integer)):
        raise TypeError(f"{where}: {name} must be a real number, got {type(v).__name__}")
    if not (math.isfinite(float(v)) and float(v) > 0):
        raise ValueError(f"{where}: {name} must be positive and finite, got {v!r}")


def check(fn: str, quant: Any) -> Quant:
    """quant as a Quant, or TypeError naming the argument."""
    if not isinstance(quant, Quant):
        raise TypeError(f"{fn}: quant must be a multiact.Quant, got {type(quant).__name__}")
    return quant


def _code_dtype(name: str) -> np.dtype:
    if name == "int8":
        return np.dtype(np.int8)
    import ml_dtypes

    return np.dtype(getattr(ml_dtypes, name))


def _groups(fn: str, v: np.ndarray, q: Quant) -> np.ndarray:
    """v seen as (..., groups, group length) along the last axis."""
    if q.granularity == "tensor":
        return v.reshape((1,) * max(v.ndim - 1, 0) + (1, v.size))
    if v.ndim == 0:
        raise ValueError(f"{fn}: granularity {q.granularity!r} needs an array with a last axis, got a 0-d one")
    n = v.shape[-1]
    g = q.block or n
    if g == 0 or n % g:
        raise ValueError(f"{fn}: the last axis ({n}) must be a multiple of the group size ({g}) for granularity "
                         f"{q.granularity!r}")
    return v.reshape(v.shape[:-1] + (n // g if g else 0, g))


def _amax(vg: np.ndarray) -> np.ndarray:
    """max |v| per group in float32, NaN where a group holds one (np.max propagates it)."""
    if vg.shape[-1] == 0:
        return np.zeros(vg.shape[:-1], np.float32)
    with np.errstate(invalid="ignore"):
        return np.max(np.abs(vg), axis=-1)


def _pow2_up(s: np.ndarray) -> np.ndarray:
    """Positive finite float32 scales rounded up to a power of two (others as they are)."""
    m, e = np.frexp(s)
    up = np.ldexp(np.float32(1), e).astype(np.float32)
    return np.where(np.isfinite(s) & (s > 0) & (m != 0.5), up, s).astype(np.float32)


def _e8m0(q: Quant, amax: np.ndarray) -> np.ndarray:
    """E8M0 scale bits (uint8: exponent + 127, 255 NaN) per group."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        if q.rule == "ceil":
            r = (amax / np.float32(q.qmax)).astype(np.float32)
            m, e = np.frexp(r)  # r = m 2^e, m in [0.5, 1): ceil(log2 r) = e - 1 where m == 0.5, else e
            exp = np.where(m == 0.5, e - 1, np.where(r == 0, -127, e))  # log2(0) = -inf: clamped below
        else:
            m, e = np.frexp(amax)  # floor(log2 amax) = e - 1
            exp = e - 1 - EMAX[q.dtype]
        exp = np.clip(exp, -127, 127)
    bits = (exp + 127).astype(np.uint8)
    bits = np.where(amax == 0, np.uint8(127), bits)  # an all-zero block: scale 1
    return np.where(np.isfinite(amax), bits, np.uint8(255)).astype(np.uint8)  # NaN or inf: NaN


def _scales(q: Quant, amax: np.ndarray) -> np.ndarray:
    """float32 scales per group from amax (the contract's rules; specials propagate)."""
    a = amax.astype(np.float32)
    with np.errstate(invalid="ignore"):
        if q.scale_ub is not None:
            a = np.where(a > np.float32(q.scale_ub), np.float32(q.scale_ub), a)  # NaN stays NaN
        if q.amax_floor is not None:
            a = np.where(a < np.float32(q.amax_floor), np.float32(q.amax_floor), a)
        s = (a / np.float32(q.qmax)).astype(np.float32)
    s = np.where(a == 0, np.float32(1), _no_zero(s)).astype(np.float32)
    return _canonical(_pow2_up(s) if q.pow2 else s)


def _canonical(s: np.ndarray) -> np.ndarray:
    """A NaN scale as the one quiet NaN 0x7fc00000: np.max keeps a NaN element's own bits in some of its loops
    and not in others, and a payload (torch's bfloat16 NaN 0xffff) would make equal results differ in bits."""
    return np.where(np.isnan(s), np.float32(np.nan), s).astype(np.float32)


def _no_zero(s: np.ndarray) -> np.ndarray:
    """A scale that underflows to 0 (amax below qmax times the smallest subnormal) as the smallest subnormal:
    its codes are then the values' own multiples of it (within the format's range), never v / 0."""
    return np.where(s == 0, TINY, s).astype(np.float32)


def _codes(q: Quant, r: np.ndarray) -> np.ndarray:
    """float32 quotients as codes: RNE into the format, saturated to +-qmax (NaN: float8 NaN, int8 0)."""
    qmax = np.float32(q.qmax)
    with np.errstate(invalid="ignore"):
        c = np.clip(r, -qmax, qmax)  # NaN stays NaN; +-inf become +-qmax
    if q.dtype == "int8":
        return np.nan_to_num(np.rint(c), nan=0.0).astype(np.int8)
    return c.astype(_code_dtype(q.dtype))


def whole_stats(q: Quant, v: Any) -> tuple[Any, ...]:
    """What a dynamic "tensor" scale is derived from, as array methods compute it (NumPy or Dask, whose chunked
    max and min are exact and propagate NaN): (amax,), or (min, max) for the zero-point form; () for a static
    scale.  quantize_host(..., stats=) quantizes a part of the array with the whole array's statistics."""
    if q.granularity != "tensor" or q.scale is not None:
        return ()
    if not q.symmetric:
        return v.min(), v.max()
    return (abs(v).max(),)


def quantize_host(fn: str, v: np.ndarray, q: Quant, stats: tuple | None = None) -> tuple[np.ndarray, ...]:
    """The contract on float32 values v (any shape): (codes, scales) or, for the zero-point form,
    (codes, scales, zero points).  `stats` (granularity "tensor"): whole_stats of the whole array, when v is a
    part of it (a Dask chunk)."""
    v = np.asarray(v, dtype=np.float32)
    vg = _groups(fn, v, q)
    out_shape = () if q.granularity == "tensor" else vg.shape[:-1]
    if stats:
        stats = tuple(np.asarray(a, np.float32).reshape(vg.shape[:-1]) for a in stats)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        if not q.symmetric:
            return _azp(q, v, vg, out_shape, stats)
        if q.scale is not None:
            s = np.full(vg.shape[:-1], np.float32(q.scale), np.float32)
            bits = None
        elif q.granularity == "mx":
            bits = _e8m0(q, _amax(vg))
            s = np.where(bits == 255, np.float32(np.nan),
                         np.ldexp(np.float32(1), bits.astype(np.int32) - 127)).astype(np.float32)
        else:
            bits = None
            s = _scales(q, stats[0] if stats else _amax(vg))
        r = (vg / s[..., None]).astype(np.float32)
    codes = _codes(q, r).reshape(v.shape)
    if bits is not None:
        import ml_dtypes

        return codes, bits.view(ml_dtypes.float8_e8m0fnu).reshape(out_shape)
    return codes, s.reshape(out_shape)


def _azp(q: Quant, v: np.ndarray, vg: np.ndarray, out_shape: tuple, stats: tuple | None = None
         ) -> tuple[np.ndarray, ...]:
    """int8 with a zero point (vLLM's azp): scale = (max - min) / 255, zp = rint(-128 - min / scale)."""
    if stats:
        lo, hi = stats
    elif vg.shape[-1] == 0:
        lo = hi = np.zeros(vg.shape[:-1], np.float32)
    else:
        lo, hi = np.min(vg, axis=-1), np.max(vg, axis=-1)
    s = ((hi - lo) / np.float32(255)).astype(np.float32)
    s = _canonical(np.where(hi == lo, np.float32(1), _no_zero(s)))  # all values equal: scale 1
    zp = np.rint(np.float32(-128) - lo / s).astype(np.float32)
    zp_i = np.nan_to_num(np.clip(zp, -128, 127), nan=0.0).astype(np.int32)
    r = (vg / s[..., None]).astype(np.float32)
    codes = np.nan_to_num(np.clip(np.rint(r) + zp_i[..., None], -128, 127), nan=0.0).astype(np.int8)
    return codes.reshape(v.shape), s.reshape(out_shape), zp_i.reshape(out_shape)


def dequantize_host(fn: str, codes: np.ndarray, scale: np.ndarray, q: Quant, zero_point: Any = None,
                    dtype: Any = np.float32) -> np.ndarray:
    """codes * scale per group (less the zero point first), in float32, then dtype."""
    c = np.asarray(codes).astype(np.float32)
    s = np.asarray(scale).astype(np.float32)
    cg = _groups(fn, c, q)
    s = s.reshape(cg.shape[:-1])
    if zero_point is not None:
        cg = cg - np.asarray(zero_point, np.float32).reshape(cg.shape[:-1])[..., None]
    with np.errstate(invalid="ignore", over="ignore"):
        return (cg * s[..., None]).astype(np.float32).reshape(c.shape).astype(dtype)


# ---- the public functions --------------------------------------------------------------------------------


def _float32_values(fn: str, y: Any) -> tuple[np.ndarray, Any]:
    """y's values as a float32 NumPy array (and y, to return results in its kind)."""
    arr = _arrays.as_host_array(y, f"{fn}: y")
    from . import dtypes as _dtypes

    if _dtypes.is_bf16(arr.dtype):
        return _dtypes.to_float32(arr), y
    return arr.astype(np.float32), y


def quantize(y: Any, quant: Quant) -> tuple[Any, ...]:
    """(codes, scales) of y's values under `quant` (the contract above); (codes, scales, zero points) for
    int8 with symmetric=False.  NumPy in, NumPy out (ml_dtypes float8 codes); a torch CPU tensor in, torch
    tensors out."""
    fn = "quantize()"
    q = check(fn, quant)
    v, like = _float32_values(fn, y)
    return as_kind(quantize_host(fn, v, q), like)


def dequantize(codes: Any, scale: Any, quant: Quant, *, zero_point: Any = None, dtype: Any = None) -> Any:
    """The values codes * scale per group (codes - zero_point, then times scale, for the zero-point form), in
    float32 or `dtype`."""
    fn = "dequantize()"
    q = check(fn, quant)
    c, s = _host_codes(fn, "codes", codes), _host_codes(fn, "scale", scale)
    zp = None if zero_point is None else _host_codes(fn, "zero_point", zero_point)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(codes, torch.Tensor):
        res = dequantize_host(fn, c, s, q, zp)
        t = torch.from_numpy(res)
        return t if dtype is None else t.to(dtype)
    return dequantize_host(fn, c, s, q, zp, np.float32 if dtype is None else dtype)


def _host_codes(fn: str, name: str, a: Any) -> np.ndarray:
    """A NumPy view of codes or scales (float8 and E8M0 tensors through their bytes)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(a, torch.Tensor):
        t = a.detach().cpu()
        names = {torch.float8_e4m3fn: "float8_e4m3fn", torch.float8_e5m2: "float8_e5m2",
                 torch.float8_e8m0fnu: "float8_e8m0fnu"}
        if t.dtype in names:
            import ml_dtypes

            return t.contiguous().view(torch.uint8).numpy().view(getattr(ml_dtypes, names[t.dtype]))
        return t.numpy()
    if isinstance(a, (np.ndarray, np.generic, float, int, list, tuple)):
        return np.asarray(a)
    raise TypeError(f"{fn}: {name} must be an array, got {type(a).__name__}")


def as_kind(res: tuple[np.ndarray, ...], like: Any) -> tuple[Any, ...]:
    """NumPy results in the kind of `like`: torch tensors (float8 codes and E8M0 scales by their bytes) for a
    tensor, else NumPy."""
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(like, torch.Tensor):
        return res
    names = {"float8_e4m3fn": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2,
             "float8_e8m0fnu": torch.float8_e8m0fnu}
    out = []
    for a in res:
        if a is None:  # a result the call does not make (bias_act_grad's db without b)
            out.append(None)
            continue
        a = np.asarray(a)
        a = a if a.flags.c_contiguous else a.copy()  # not np.ascontiguousarray: it makes a 0-d scale 1-d
        name = a.dtype.name
        if name in names:
            out.append(torch.from_numpy(a.view(np.uint8)).view(names[name]))
        else:
            out.append(torch.from_numpy(a))
    return tuple(out)
