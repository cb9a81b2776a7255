"""Dequantized inputs: a matmul's int32 accumulator turned into the float32 values an activation reads, in the
same call (CANN's dequant_swiglu_quant, torch_npu's npu_dequant_swiglu_quant, vLLM's W8A8 epilogues); the contract
is Dequant's docstring.  A backend may do the dequantization, the op and quant= in one pass (the native backend's
`dequantized` hook: multiact.core._fused_dequant) and must give the bits of `Dequant.apply` then the op."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import _arrays
from . import dtypes as _dtypes

DOC = ("\ndequant: a multiact.Dequant: x is int32 (a matmul's accumulator), read as float32(x + bias) * "
       "weight_scale * activation_scale + bias (multiact.dequant's contract).")


class Dequant:
    """How an int32 input becomes float32: `ma.swiglu(acc, dequant=ma.Dequant(w_scale, tok_scale, bias),
    quant=ma.Quant("int8", "token"))`; `apply(x)` gives the float32 values the op reads.

    - x is int32 (..., n); its values are float32(x + bias) * weight_scale * activation_scale + bias, each
      operation in float32 and rounded, in that order (CANN's: an int32 bias is added in int32, wrapping as int32
      arithmetic does, before the conversion; a float bias is added last).  Every part is optional.
    - weight_scale: one per channel of the last axis, shape (n,), or one value; activation_scale: one per token
      (row), shape x.shape[:-1] or x.shape[:-1] + (1,), or one value; bias: integers (added in int32: their
      values must fit) or floats, (n,) or one value.  float16 and bfloat16 arrays widen exactly; float64 arrays
      are refused (the values are computed in float32: say which float32 scale you mean); Python numbers and
      lists of them round once to float32 (ints to int32 for a bias).
    - The op then runs on the values as on a float32 input; with quant= its float32 result is quantized
      (multiact.Quant's contract).  The forwards of the elementwise ops and the gated ops' one-input form take
      it, on host arrays (NumPy, CPU tensors) and Dask arrays."""

    __slots__ = ("activation_scale", "bias", "weight_scale")

    def __init__(self, weight_scale: Any = None, activation_scale: Any = None, bias: Any = None) -> None:
        self.weight_scale, self.activation_scale, self.bias = weight_scale, activation_scale, bias

    def __repr__(self) -> str:
        parts = [f"{n}={_describe(getattr(self, n))}" for n in ("weight_scale", "activation_scale", "bias")
                 if getattr(self, n) is not None]
        return f"Dequant({', '.join(parts)})"

    def apply(self, x: Any) -> Any:
        """The float32 values of an int32 x (NumPy, a CPU tensor, a Dask array: the same kind back)."""
        fn = "Dequant.apply()"
        if _arrays.kind_of(x) == "dask":
            return dequantize_dask(fn, x, self)
        xi = host_int32(fn, "x", x)
        v = dequantize_host(xi, check(fn, self, xi.shape))
        return sys.modules["torch"].from_numpy(v) if _arrays.kind_of(x) == "torch" else v


def _describe(a: Any) -> str:
    shape = getattr(a, "shape", None)
    return f"<{getattr(a, 'dtype', type(a).__name__)} {tuple(shape)}>" if shape is not None else repr(a)


@dataclass(frozen=True)
class Checked:
    """A Dequant made concrete for one x: NumPy arrays that broadcast against x (None where not given)."""

    weight_scale: np.ndarray | None  # float32 (n,) or ()
    activation_scale: np.ndarray | None  # float32 x.shape[:-1] + (1,) or ()
    bias_int: np.ndarray | None  # int32 (n,) or ()
    bias_float: np.ndarray | None  # float32 (n,) or ()

    def full(self, shape: tuple[int, ...]) -> dict[str, np.ndarray | None]:
        """Each part as a read-only view of x's shape (stride 0 where it repeats): the family's views of x then
        slice them as they slice x (the gated halves, interleaved or along any dim)."""
        return {n: None if a is None else np.broadcast_to(a, shape)
                for n, a in (("bias_int", self.bias_int), ("weight_scale", self.weight_scale),
                             ("activation_scale", self.activation_scale), ("bias_float", self.bias_float))}


def check(fn: str, d: Any, shape: tuple[int, ...]) -> Checked:
    """The parts of `d` (a Dequant) for an x of this shape: dtypes and shapes checked, each error naming it."""
    if not isinstance(d, Dequant):
        raise TypeError(f"{fn}: dequant must be a multiact.Dequant, got {type(d).__name__}")
    if not shape:
        raise ValueError(f"{fn}: dequant= needs an x with a last axis (channels), got a 0-d x")
    n, rows = shape[-1], tuple(shape[:-1])
    ws = _part(fn, "weight_scale", d.weight_scale, ((n,),), f"({n},): one per channel of x's last axis")
    acs = _part(fn, "activation_scale", d.activation_scale, (rows, (*rows, 1)),
                f"{rows} or {(*rows, 1)}: one per token (row) of x")
    if acs is not None and acs.ndim:
        acs = acs.reshape(*rows, 1)
    b = _part(fn, "bias", d.bias, ((n,),), f"({n},): one per channel of x's last axis", ints=True)
    bi = b if b is not None and b.dtype == np.int32 else None
    bf = b if b is not None and bi is None else None
    return Checked(ws, acs, bi, bf)


def _part(fn: str, name: str, a: Any, shapes: tuple, expect: str, ints: bool = False) -> np.ndarray | None:
    if a is None:
        return None
    arg = f"{fn}: dequant's {name}"
    if isinstance(a, bool) or (isinstance(a, np.ndarray) and a.dtype == np.bool_):
        raise TypeError(f"{arg} must be a number or an array of numbers, got a bool")
    if isinstance(a, (int, float, np.integer, np.floating)):
        if ints and isinstance(a, (int, np.integer)):
            if not -2**31 <= int(a) < 2**31:
                raise ValueError(f"{arg} is an int outside int32's range: {a}")
            return np.asarray(a, np.int32)
        return np.asarray(a, np.float32)
    if ints and _is_int_array(a):
        v = _int_bias(arg, a)
    elif isinstance(a, (list, tuple)):  # Python numbers, each rounded once to float32 as a lone number is
        v = _arrays.as_host_array(a, arg).astype(np.float32)
    else:
        v = _arrays.as_host_array(a, arg)
        if v.dtype == np.float64:
            raise TypeError(f"{arg} has dtype float64: the dequantization computes in float32; pass it as "
                            "float32 (.astype(np.float32)) so that the scale used is the one you mean")
        v = _dtypes.to_float32(v) if _dtypes.is_bf16(v.dtype) else v.astype(np.float32, copy=False)
    if v.shape != () and v.shape not in shapes:
        raise ValueError(f"{arg} has shape {v.shape}; expected () or {expect}")
    return v


def _int_bias(arg: str, a: Any) -> np.ndarray:
    """An integer bias as int32 (any integer dtype whose values fit: NumPy's default int64 included)."""
    v = a.detach().numpy() if _arrays.kind_of(a) == "torch" else np.asarray(a)
    if v.size and (v.min() < -2**31 or v.max() >= 2**31):
        raise ValueError(f"{arg} holds values outside int32's range (an int32 bias is added in int32)")
    return v.astype(np.int32)


def _is_int_array(a: Any) -> bool:
    dt = getattr(a, "dtype", None)
    if dt is None and isinstance(a, (list, tuple)):
        dt = np.asarray(a).dtype
    return dt is not None and str(dt).replace("torch.", "") in ("int8", "int16", "int32", "int64", "uint8",
                                                                 "uint16", "uint32", "uint64")


def host_int32(fn: str, name: str, x: Any) -> np.ndarray:
    """A NumPy view of an int32 host array (NumPy, a CPU tensor, a list of ints): what a dequantized call reads."""
    if isinstance(x, np.ndarray):
        a = x if type(x) is np.ndarray else x.view(np.ndarray)
    elif _arrays.kind_of(x) == "torch":
        a = x.detach().numpy() if str(x.dtype) == "torch.int32" else None
        if a is None:
            raise TypeError(f"{fn}: {name} must be int32 with dequant= (a matmul's accumulator), got {x.dtype}")
    elif isinstance(x, (list, tuple, int, np.generic)) and not isinstance(x, bool):
        a = np.asarray(x)
        if a.dtype.kind == "i" and a.size and (a.min() < -2**31 or a.max() >= 2**31):
            raise ValueError(f"{fn}: {name} holds values outside int32's range")
        a = a.astype(np.int32) if a.dtype.kind == "i" or a.size == 0 else a
    else:
        raise TypeError(f"{fn}: {name} must be an int32 array with dequant=, got {type(x).__name__}")
    if a.dtype.kind == "i" and a.dtype.itemsize == 4 and not a.dtype.isnative:
        a = a.astype(a.dtype.newbyteorder("="))
    if a.dtype != np.int32:
        raise TypeError(f"{fn}: {name} must be int32 with dequant= (a matmul's accumulator), got {a.dtype}")
    return a


def dequantize_host(x: np.ndarray, c: Checked) -> np.ndarray:
    """The contract's float32 values of an int32 NumPy x (the passes every backend's one pass must equal)."""
    v = x if c.bias_int is None else np.add(x, c.bias_int, dtype=np.int32)  # wraps as int32 arithmetic does
    v = v.astype(np.float32)
    for s in (c.weight_scale, c.activation_scale):
        if s is not None:
            v *= s
    if c.bias_float is not None:
        v += c.bias_float
    return v


def dequantize_dask(fn: str, x: Any, d: Any) -> Any:
    """A Dask int32 x's float32 values, lazily, by the same float32 operations chunk by chunk."""
    if str(x.dtype) != "int32":
        raise TypeError(f"{fn}: x must be int32 with dequant= (a matmul's accumulator), got {x.dtype}")
    if any(isinstance(s, float) for s in x.shape):
        raise ValueError(f"{fn}: dequant= needs x's shape known (a Dask array with unknown chunk sizes: "
                         "call x.compute_chunk_sizes() first)")
    c = check(fn, d, tuple(x.shape))
    v = x if c.bias_int is None else x + c.bias_int
    v = v.astype(np.float32)
    for s in (c.weight_scale, c.activation_scale):
        if s is not None:
            v = v * s
    return v if c.bias_float is None else v + c.bias_float
