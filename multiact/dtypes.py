"""bfloat16, the one dtype NumPy lacks: `multiact.dtypes.bfloat16` and the bit conversions every backend shares.

`multiact.dtypes.bfloat16` is `ml_dtypes.bfloat16` (the optional dependency, `pip install multiact[bf16]`),
imported only when asked for or when such an array reaches multiact; importing multiact never imports it.

The rule, the same bits on every backend: a bfloat16 value widens to float32 exactly (its 16 bits are the
float32's high half), the op computes in float32, and the float32 result is rounded once to nearest even:
NaN stays a quiet NaN with its sign, +-inf stay, and a finite value beyond bfloat16's largest finite value by
half an ulp or more becomes +-inf by that rounding.  `f32_bits_to_bf16` is the one definition of the store
(integer arithmetic, no casting library involved); the numba and native backends reimplement it in their
languages and are tested bit for bit against it on every bfloat16 pattern and the float32 boundary cases.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

__all__ = ["bf16_bits_to_f32", "bfloat16",  # noqa: F822 - module __getattr__ (lazy)
           "f32_bits_to_bf16", "f64_to_bf16_bits", "from_float32", "from_float64",
           "is_bf16", "to_float32"]

_BF16: list[Any] = [None]  # np.dtype(ml_dtypes.bfloat16) once ml_dtypes is imported


def _load() -> np.dtype:
    if _BF16[0] is None:
        try:
            import ml_dtypes
        except ImportError as e:  # pragma: no cover - ml_dtypes comes with onnx and jax
            raise ImportError("bfloat16 arrays need ml_dtypes: pip install 'multiact[bf16]'") from e
        _BF16[0] = np.dtype(ml_dtypes.bfloat16)
    return _BF16[0]


def __getattr__(name: str) -> Any:
    if name == "bfloat16":
        return _load().type
    raise AttributeError(f"module 'multiact.dtypes' has no attribute {name!r}")


def bf16_dtype() -> np.dtype | None:
    """NumPy's bfloat16 dtype if ml_dtypes is imported (no bfloat16 array can exist before), else None."""
    if _BF16[0] is None and "ml_dtypes" in sys.modules:
        _load()
    return _BF16[0]


def is_bf16(dt: Any) -> bool:
    """Whether a NumPy dtype is ml_dtypes' bfloat16 (without importing ml_dtypes, and without dt.name's cost)."""
    if getattr(dt, "kind", None) != "V" or dt.itemsize != 2:
        return False
    b = bf16_dtype()
    return b is not None and dt == b


def bf16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns (uint16) as the float32 values they are, exactly (a new array)."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def f32_bits_to_bf16(f: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """float32 values rounded once to nearest even as bfloat16 bit patterns (uint16): add 0x7FFF plus the
    kept part's lowest bit, keep the high half; NaN keeps its sign and high payload bits and is made quiet
    (bit 6 of the result set), which the rounding could otherwise turn into inf."""
    u = np.asarray(f, dtype=np.float32).view(np.uint32)
    r = (u + (np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1)))) >> 16
    nan = (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    if nan.any():
        r = np.where(nan, (u >> 16) | np.uint32(0x40), r)
    if out is None:
        return r.astype(np.uint16)
    out[...] = r.reshape(out.shape)
    return out


def f64_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float64 values rounded once to nearest even as bfloat16 bit patterns: round to odd into float32 (toward
    zero, the lowest bit set where inexact; 16 spare bits keep the second rounding from double-rounding), then
    `f32_bits_to_bf16`.  The reference's rounding (parameter gradients, prelu weights, the tests' expectations)."""
    x = np.asarray(x, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        t = x.astype(np.float32)
        away = np.abs(t.astype(np.float64)) > np.abs(x)  # rounded away from zero (to inf too): one step back
        t = np.where(away, np.nextafter(t, np.float32(0)), t)
        inexact = (t.astype(np.float64) != x) & ~np.isnan(x)
    u = np.asarray(t, dtype=np.float32).view(np.uint32) | inexact.astype(np.uint32)
    return f32_bits_to_bf16(u.view(np.float32))


def from_float64(x: Any) -> np.ndarray:
    """float64 values rounded once to bfloat16 (`f64_to_bf16_bits`), as a bfloat16 array (0-d for a scalar)."""
    return f64_to_bf16_bits(x).view(_load())


def cast_float64(a: Any, dtype: np.dtype) -> np.ndarray:
    """float64 results (sums) in `dtype`: NumPy's one rounding, or `from_float64` for bfloat16."""
    if is_bf16(dtype):
        return from_float64(a)
    with np.errstate(over="ignore"):
        return np.asarray(a, dtype=np.float64).astype(dtype)


def to_float32(a: np.ndarray) -> np.ndarray:
    """A bfloat16 array (any strides) as a new float32 array of its shape, exactly."""
    return bf16_bits_to_f32(a.view(np.uint16))


def from_float32(f: np.ndarray) -> np.ndarray:
    """float32 values rounded once (`f32_bits_to_bf16`) as a new bfloat16 array of their shape."""
    return f32_bits_to_bf16(f).view(_load())
