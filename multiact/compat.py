"""Other libraries' fused bias + activation calls, with their names, defaults and conventions, on
`ma.bias_act`: code ported from StyleGAN, CANN or ONNX Runtime keeps its semantics.

- `stylegan_bias_act`: NVlabs StyleGAN2/3 `torch_utils/ops/bias_act.py` `bias_act(x, b, dim, act, alpha, gain,
  clamp)`, with its per-activation default gains and alphas (sqrt(2) for relu, lrelu and swish).
- `fused_bias_leaky_relu` (+ `_grad`): CANN's FusedBiasLeakyRelu, bias of x's shape, slope 0.2, scale sqrt(2).
- `bias_gelu`, `fast_gelu`: ONNX Runtime's contrib BiasGelu (exact gelu of x + bias, bias along the last
  axis) and FastGelu (the tanh approximation, bias optional).

Quantized outputs, each library's own convention (multiact's contract is `ma.Quant` / `ma.quantize`):
- vLLM: `vllm_silu_and_mul_quant` (static per-tensor FP8 SwiGLU, times the inverted scale),
  `vllm_scaled_fp8_quant` (static, dynamic per tensor, per token with its scale floor and `scale_ub`),
  `vllm_per_token_group_quant_fp8` (groups of 128, eps, UE8M0), `vllm_scaled_int8_quant` (with the azp form).
- NVIDIA Transformer Engine: `te_scale_from_amax` (scale = qmax / amax), `te_cast_to_fp8` (codes and scale_inv).
- Huawei CANN: `cann_swi_glu_quant` (int8 per row), `cann_gelu_quant` (static scale and offset, or dynamic);
  torch_npu: `npu_dequant_swiglu_quant` (int32 in, dequantized, SwiGLU, int8 out).
"""

from __future__ import annotations

import math
import sys
from typing import Any

import numpy as np

from . import dtypes as _dtypes
from .fused_bias_act import bias_act, bias_act_grad

_SQRT2 = math.sqrt(2.0)

# StyleGAN's activation_funcs: its name -> (multiact's activation, its alpha's parameter name, default
# alpha, default gain).  Its 'swish' is x * sigmoid(x), multiact's silu.
STYLEGAN_ACTS: dict[str, tuple[str, str | None, float, float]] = {
    "linear": ("linear", None, 0.0, 1.0),
    "relu": ("relu", None, 0.0, _SQRT2),
    "lrelu": ("leaky_relu", "negative_slope", 0.2, _SQRT2),
    "tanh": ("tanh", None, 0.0, 1.0),
    "sigmoid": ("sigmoid", None, 0.0, 1.0),
    "elu": ("elu", None, 0.0, 1.0),
    "selu": ("selu", None, 0.0, 1.0),
    "softplus": ("softplus", None, 0.0, 1.0),
    "swish": ("silu", None, 0.0, _SQRT2),
}


def _stylegan(act: str, alpha: float | None, gain: float | None, clamp: float | None) -> dict[str, Any]:
    if act not in STYLEGAN_ACTS:
        raise ValueError(f"stylegan_bias_act(): act must be one of {', '.join(STYLEGAN_ACTS)}, got {act!r}")
    name, alpha_name, def_alpha, def_gain = STYLEGAN_ACTS[act]
    kw: dict[str, Any] = {"act": name, "gain": def_gain if gain is None else float(gain)}
    if alpha_name is not None:
        kw[alpha_name] = def_alpha if alpha is None else float(alpha)
    if clamp is not None and clamp >= 0:  # StyleGAN: a negative clamp (its default -1) means none
        kw["clamp"] = float(clamp)
    return kw


def stylegan_bias_act(x: Any, b: Any = None, dim: int = 1, act: str = "linear", alpha: float | None = None,
                      gain: float | None = None, clamp: float | None = None, **kw: Any) -> Any:
    """StyleGAN's bias_act: b along dim, then act (alpha where it takes one), gain, clamp."""
    return bias_act(x, b, dim=dim, **_stylegan(act, alpha, gain, clamp), **kw)


def stylegan_bias_act_grad(dy: Any, x: Any, b: Any = None, dim: int = 1, act: str = "linear",
                           alpha: float | None = None, gain: float | None = None, clamp: float | None = None,
                           **kw: Any) -> Any:
    """The gradients of `stylegan_bias_act`: dx, or (dx, db) with b."""
    return bias_act_grad(dy, x, b, dim=dim, **_stylegan(act, alpha, gain, clamp), **kw)


def fused_bias_leaky_relu(x: Any, bias: Any, negative_slope: float = 0.2, scale: float = _SQRT2, **kw: Any) -> Any:
    """CANN's FusedBiasLeakyRelu: leaky_relu(x + bias, negative_slope) * scale, bias of x's shape."""
    return bias_act(x, bias, "leaky_relu", dim=0, gain=scale, negative_slope=negative_slope, **kw)


def fused_bias_leaky_relu_grad(dy: Any, x: Any, bias: Any, negative_slope: float = 0.2, scale: float = _SQRT2,
                               **kw: Any) -> Any:
    """Its gradient with respect to x (the same as with respect to the full-shape bias)."""
    return bias_act_grad(dy, x, bias, "leaky_relu", dim=0, gain=scale, negative_slope=negative_slope, **kw)[0]


def bias_gelu(x: Any, bias: Any, **kw: Any) -> Any:
    """ONNX Runtime's BiasGelu: gelu(x + bias), exact, bias along the last axis."""
    return bias_act(x, bias, "gelu", dim=-1, **kw)


def fast_gelu(x: Any, bias: Any = None, **kw: Any) -> Any:
    """ONNX Runtime's FastGelu: the tanh approximation of gelu(x + bias), bias (optional) along the last axis."""
    return bias_act(x, bias, "gelu", dim=-1, approximate="tanh", **kw)


# ==== quantized outputs: the anchors' own conventions ==========================================================
#
# multiact's contract (multiact/quant.py: `ma.Quant`, `ma.quantize`) is one definition for every backend.  The
# functions below are not that contract: each is one anchor's convention, read from its source (paths and lines
# quoted in each docstring), implemented here as the anchor computes it, rounding, saturation and specials
# included, on NumPy arrays and torch CPU tensors.  The activations are multiact's own float32 ops (`ma.silu`,
# `ma.swiglu`, `ma.gelu`), the same values `ma.<op>(x, quant=...)` quantizes; where an anchor's formula gives
# NaN at -inf (x / (1 + exp(-x)) is -inf / inf there), that NaN is kept, since the anchor's quantizer then acts
# on it.  docs/fused-gated.md ("Quantized outputs") tabulates the conventions and their differences from the
# contract; tests/test_compat_quant.py checks each against the anchor's formula written out independently.
#
# Sources and line numbers (the snapshots read): vLLM: vllm-project/vllm's csrc/quantization/activation_kernels.cu
# (bcf9083), w8a8/fp8/common.cuh (c66faec), common.cu (cda1b34), per_token_group_quant.cu (e3b7e36),
# w8a8/int8/scaled_quant.cu (b686480), utils.cuh (5a6541d); line numbers as in the local-inference-lab/vllm mirror
# at 28be48f, whose lines quoted here are the same (per_token_group_quant.cu there under csrc/libtorch_stable/).
# Transformer Engine: NVIDIA/TransformerEngine at d0067d0.  CANN ops-nn: the jbgztxdy/ops-nn mirror at fd1956f
# (ops-nn lives on gitcode.com/cann/ops-nn).  torch_npu: Ascend/op-plugin at 517f2e7.

_F8_MAX = {"float8_e4m3fn": 448.0, "float8_e5m2": 57344.0}  # OCP FP8's largest finite values


def _ma() -> Any:
    import multiact

    return multiact


def _host(fn: str, name: str, a: Any, *, ints: bool = False) -> np.ndarray:
    """A NumPy view of a host array (NumPy, torch CPU tensor, list, float), float (or int32 with ints=True);
    a device or Dask array is refused by name."""
    from . import _arrays

    kind = _arrays.kind_of(a)
    if kind not in ("numpy", "torch", "other"):
        raise TypeError(f"{fn}: {name} must be a host array (NumPy, a torch CPU tensor); got "
                        f"{_arrays.library_of(a)}: the anchors' conventions run on the CPU here")
    if ints:
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(a, torch.Tensor) and a.dtype == torch.int32:
            return a.detach().numpy()
        if isinstance(a, np.ndarray) and a.dtype == np.int32:
            return a
    return _arrays.as_host_array(a, f"{fn}: {name}")


def _f32(a: np.ndarray) -> np.ndarray:
    """Values as float32: float16, bfloat16 and float32 exactly, float64 rounded once, int32 as C's cast
    (round to nearest even beyond 2^24)."""
    if _dtypes.is_bf16(a.dtype):
        return _dtypes.to_float32(a)
    return np.asarray(a).astype(np.float32)


def _half_kind(a: np.ndarray) -> str | None:
    """"float16" or "bfloat16" for a half input, else None (computed in float32)."""
    if _dtypes.is_bf16(a.dtype):
        return "bfloat16"
    return "float16" if a.dtype == np.float16 else None


def _round_half(v: np.ndarray, kind: str | None) -> np.ndarray:
    """float32 values rounded once to nearest even into the half type `kind` and back (None: as they are)."""
    if kind is None:
        return v
    if kind == "float16":
        with np.errstate(over="ignore"):
            return v.astype(np.float16).astype(np.float32)
    return _dtypes.to_float32(_dtypes.from_float32(v))


def _positive(fn: str, name: str, v: Any, *, zero_ok: bool = False) -> np.float32:
    """A real, finite, positive (or zero) parameter as float32 (a 1-element array or tensor is read too)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(v, torch.Tensor):
        v = v.detach().cpu().numpy()
    if isinstance(v, np.ndarray):
        if v.size != 1 or v.dtype.kind not in "fiu":
            raise TypeError(f"{fn}: {name} must be one real number (a float or a 1-element array), got an array "
                            f"of shape {v.shape} and dtype {v.dtype}")
        v = v.reshape(())[()]
    if isinstance(v, bool) or not isinstance(v, (int, float, np.floating, np.integer)):
        raise TypeError(f"{fn}: {name} must be a real number, got {type(v).__name__}")
    f = np.float32(v)
    if not (np.isfinite(f) and (f > 0 or (zero_ok and f == 0))):
        raise ValueError(f"{fn}: {name} must be {'non-negative' if zero_ok else 'positive'} and finite (as float32), "
                         f"got {v!r}")
    return f


def _real(fn: str, name: str, v: Any) -> np.float32:
    """A real, finite parameter as float32."""
    if isinstance(v, bool) or not isinstance(v, (int, float, np.floating, np.integer)):
        raise TypeError(f"{fn}: {name} must be a real number, got {type(v).__name__}")
    f = np.float32(v)
    if not np.isfinite(f):
        raise ValueError(f"{fn}: {name} must be finite (as float32), got {v!r}")
    return f


def _choice(fn: str, name: str, v: Any, choices: tuple) -> Any:
    if isinstance(v, bool) or v not in choices:
        raise ValueError(f"{fn}: {name} must be one of {choices}, got {v!r}")
    return v


def _flag(fn: str, name: str, v: Any) -> bool:
    if not isinstance(v, (bool, np.bool_)):
        raise TypeError(f"{fn}: {name} must be a bool, got {type(v).__name__}")
    return bool(v)


def _last_axis(fn: str, name: str, a: np.ndarray, multiple: int, what: str) -> int:
    if a.ndim == 0:
        raise ValueError(f"{fn}: {name} must have a last axis, got a 0-d array")
    n = a.shape[-1]
    if n % multiple:
        raise ValueError(f"{fn}: {name}'s last axis ({n}) must be a multiple of {multiple} ({what})")
    return n


def _f8(v: np.ndarray, name: str) -> np.ndarray:
    """float32 values already within the format's range (or NaN) as float8 codes, rounded to nearest even."""
    import ml_dtypes

    return np.asarray(v, np.float32).astype(getattr(ml_dtypes, name))


def _satfinite(v: np.ndarray, name: str) -> np.ndarray:
    """PTX's cvt.rn.satfinite (CUDA's __nv_cvt_float_to_fp8(v, __NV_SATFINITE, ...), the __nv_fp8_e4m3 and
    __nv_fp8_e5m2 constructors): nearest even, beyond the largest finite (+-inf too) the largest finite, NaN
    stays NaN."""
    m = np.float32(_F8_MAX[name])
    with np.errstate(invalid="ignore"):
        return _f8(np.clip(v, -m, m), name)


def _ptx_int(v: np.ndarray, lo: int, hi: int, *, trunc: bool = False) -> np.ndarray:
    """PTX's float-to-integer cvt (cvt.rni.sat / cvt.rzi, saturating): nearest even (toward zero with trunc),
    clamped to [lo, hi], NaN -> 0; as int64."""
    with np.errstate(invalid="ignore"):
        r = np.trunc(v) if trunc else np.rint(v)
        r = np.clip(r, np.float64(lo), np.float64(hi))
    return np.nan_to_num(r, nan=0.0).astype(np.int64)


def _rows(v: np.ndarray) -> np.ndarray:
    """v (..., n) as (rows, n)."""
    return v.reshape(-1, v.shape[-1]) if v.ndim else v.reshape(1, 1)


def _amax_fmaxf(v: np.ndarray, axis: int = -1, start: float = 0.0) -> np.ndarray:
    """max(start, |v|) along axis as CUDA's fmaxf folds it: a NaN element is skipped (fmaxf returns the other
    operand), so the result is NaN only if start is."""
    with np.errstate(invalid="ignore"):
        return np.fmax.reduce(np.abs(v), axis=axis, initial=np.float32(start)).astype(np.float32)


def _nan_at_neg_inf(y: np.ndarray, gate: np.ndarray) -> np.ndarray:
    """y where the anchor's x / (1 + exp(-x)) is NaN: at x = -inf (-inf / inf), where multiact's silu gives its
    limit 0."""
    neg_inf = np.isneginf(gate)
    if neg_inf.any():
        y = np.where(neg_inf, np.float32(np.nan), y).astype(np.float32)
    return y


def _out(res: tuple, like: Any) -> tuple:
    """Results (NumPy arrays or None) in the kind of `like`: torch tensors for a tensor (float8 codes by their
    bytes), else NumPy."""
    from . import quant as _quant

    arrays = tuple(r for r in res if r is not None)
    back = iter(_quant.as_kind(arrays, like))
    # (as_kind makes a 0-d array a 1-element tensor: the reshape keeps the shape)
    return tuple(None if r is None else next(back).reshape(r.shape) for r in res)


# ---- vLLM ---------------------------------------------------------------------------------------------------


def vllm_silu_and_mul_quant(input: Any, scale: Any, *, backend: str | None = None) -> tuple[Any, Any]:
    """vLLM's fused SwiGLU with a static per-tensor FP8 output: `torch.ops._C.silu_and_mul_quant(out, input,
    scale)`, here returning `(out, scale)`.  input (..., 2d): silu of the first half times the second half,
    quantized to float8_e4m3fn with the given float32 scale (dequantize: code * scale).

    As vLLM computes it, for a float16 or bfloat16 input T:
    - activation_kernels.cu:42, `silu_kernel<T>`: `return (T)(((float)x) / (1.0f + expf((float)-x)));`: silu in
      float32, rounded to T; lines 98 and 111, `ACT_FN(x) * y`: T * T, its exact product rounded to T again
      (c10's Half/BFloat16 operator*);
    - line 82, `float inverted_scale = 1 / *scale;`, and w8a8/fp8/common.cuh:45, `x = val * scale;`
      (is_scale_inverted): the value is multiplied by the float32 reciprocal of the scale, not divided by it;
    - common.cuh:51, `fmaxf(-quant_type_max_v<fp8_type>, fminf(x, quant_type_max_v<fp8_type>))`, then line 55's
      conversion, nvidia/quant_utils.cuh:29 `__nv_cvt_float_to_fp8(a, __NV_SATFINITE, fp8_type)` (nearest even).

    Differences from `ma.swiglu(x, quant=ma.Quant("float8_e4m3fn", "tensor", scale=s))`, the contract:
    - the value quantized is the T-rounded product, not the float32 one (for a float16/bfloat16 input; a
      float16 product beyond 65504 is inf in T, hence +-448 whatever the scale);
    - multiplying by fl(1/s) instead of dividing by s: the float32 quotients differ in their last bit for about
      a quarter of the elements (measured on every bfloat16 value over 200 random scales), but a float8 code
      differs only where the exact quotient sits on a rounding midpoint of the format, e.g. 10.9375 with scale
      7: 10.9375 / 7 = 1.5625 exactly, a tie that goes to the even code 1.5, while 10.9375 * fl(1/7) =
      1.5625001 rounds up to 1.625;
    - NaN becomes +448 (fminf(NaN, 448) is 448), where the contract keeps NaN; +-inf become +-448 in both;
    - silu(-inf) is NaN in vLLM's formula x / (1 + exp(-x)), so a -inf gate gives +448 too.
    vLLM's kernel takes float16 and bfloat16 only (activation_kernels.cu:591); a float32 input here is computed
    as its template would be with scalar_t = float (no intermediate rounding), float64 rounded once first."""
    fn = "vllm_silu_and_mul_quant()"
    x = _host(fn, "input", input)
    s = _positive(fn, "scale", scale)
    n = _last_axis(fn, "input", x, 2, "the two halves of silu_and_mul")
    half = _half_kind(x)
    v = _f32(x)
    gate, up = v[..., : n // 2], v[..., n // 2:]
    act = _round_half(_nan_at_neg_inf(_ma().silu(gate, backend=backend), gate), half)  # silu_kernel<T> -> T
    with np.errstate(invalid="ignore", over="ignore"):
        prod = _round_half((act * up).astype(np.float32), half)  # T * T -> T
        inv = np.float32(1) / s
        r = np.fmax(np.float32(-448), np.fmin(prod * inv, np.float32(448)))  # NaN -> +448
    return _out((_f8(r, "float8_e4m3fn"), np.array(s, np.float32).reshape(_given_shape(scale))), input)


def _given_shape(v: Any) -> tuple:
    """The shape of a parameter as given, kept for the result (0-d for a float, (1,) for a 1-element tensor)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(v, torch.Tensor):
        return tuple(v.shape)
    return np.shape(v)


def vllm_scaled_fp8_quant(input: Any, scale: Any = None, scale_ub: Any = None,
                          use_per_token_if_dynamic: bool = False) -> tuple[Any, Any]:
    """vLLM's FP8 quantization of an activation, `vllm._custom_ops.scaled_fp8_quant(input, scale, scale_ub=...,
    use_per_token_if_dynamic=...)`: `(output, scale)`, float8_e4m3fn codes and float32 scales (code * scale).

    Three conventions, each as vLLM's kernels compute it (vllm/_custom_ops.py:1905 picks the kernel):
    - static per-tensor (`scale` given): w8a8/fp8/common.cu:33 `return 1.0f / scale[...]` once, then every value
      times that reciprocal (`scaled_fp8_conversion<true>`, common.cuh:45), `fmaxf(-448, fminf(x, 448))`
      (common.cuh:51), satfinite cast;
    - dynamic per-tensor: common.cu:99 `thread_max = fmaxf(thread_max, v)` from 0 (a NaN element is skipped),
      line 115 `atomicMaxFloat(scale, cache[0] / quant_type_max_v<fp8_type>)`: the largest row amax / 448; line
      130 `const float reciprocal_scale = 1.0f / (*scale);` then as static.  An all-zero tensor gets scale 0:
      0 * inf is NaN, which the clamp turns into +448, so its codes are all 448 (dequantized: 0);
    - dynamic per-token (`use_per_token_if_dynamic=True`): common.cu:157 the row's amax folded with fmaxf from
      0, lines 167-168 `token_scale = scale_ub ? fminf(block_max, *scale_ub) : block_max; token_scale =
      fmaxf(token_scale / quant_type_max_v<fp8_type>, min_scaling_factor<fp8_type>::val());` with utils.cuh:50
      `return 1.0f / (quant_type_max_v<T> * 512.0f);`, then line 178 `scaled_fp8_conversion<false, ...>`: the
      value divided by the scale (not multiplied), clamped, satfinite cast.  Scales (M, 1) for a 2-d input
      (_custom_ops.py:1961; vLLM takes 2-d inputs only, line 1947: here more axes keep their leading shape).
    Differences from the contract: static and dynamic per-tensor multiply by the reciprocal
    (see `vllm_silu_and_mul_quant`); the per-token form equals `ma.quantize(y, ma.Quant("float8_e4m3fn", "token",
    scale_ub=scale_ub, amax_floor=1 / 512))` bit for bit on finite rows (a floor of 1/512 on amax gives the same
    float32 scale as vLLM's floor on amax / 448).  Specials: a NaN element does not reach the scale and its code
    is +448 (the contract: NaN scale, NaN code); with an inf in a row (and no scale_ub) the scale is inf, the
    row's finite values become 0 and the infs +448 (inf / inf is NaN; the contract: inf scale, NaN code)."""
    fn = "vllm_scaled_fp8_quant()"
    x = _host(fn, "input", input)
    per_token = _flag(fn, "use_per_token_if_dynamic", use_per_token_if_dynamic)
    v = _f32(x)
    qmax = np.float32(448)
    if scale is not None:
        if scale_ub is not None:
            raise ValueError(f"{fn}: scale_ub applies to dynamic per-token scales; a static scale is used as given")
        s = _positive(fn, "scale", scale)
        with np.errstate(invalid="ignore", over="ignore"):
            r = np.fmax(-qmax, np.fmin(v * (np.float32(1) / s), qmax))
        return _out((_f8(r, "float8_e4m3fn"), np.array(s, np.float32).reshape(_given_shape(scale))), input)
    if not per_token:
        if scale_ub is not None:
            raise ValueError(f"{fn}: scale_ub applies to per-token scales (use_per_token_if_dynamic=True)")
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            s = np.float32(_amax_fmaxf(v.reshape(-1), axis=0) / qmax) if v.size else np.float32(0)
            r = np.fmax(-qmax, np.fmin(v * (np.float32(1) / s), qmax))
        return _out((_f8(r, "float8_e4m3fn"), np.array([s], np.float32)), input)
    ub = None if scale_ub is None else _positive(fn, "scale_ub", scale_ub)
    if v.ndim == 0:
        raise ValueError(f"{fn}: input must have a last axis (the token's) for per-token scales, got a 0-d array")
    rows = _rows(v)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        amax = _amax_fmaxf(rows)
        if ub is not None:
            amax = np.fmin(amax, ub)
        floor = np.float32(1) / (qmax * np.float32(512))
        s = np.fmax(amax / qmax, floor).astype(np.float32)
        r = np.fmax(-qmax, np.fmin(rows / s[:, None], qmax))
    return _out((_f8(r, "float8_e4m3fn").reshape(v.shape), s.reshape(v.shape[:-1] + (1,))), input)


def vllm_per_token_group_quant_fp8(x: Any, group_size: int = 128, eps: float = 1e-10,
                                   use_ue8m0: bool = False) -> tuple[Any, Any]:
    """vLLM's per-token-group FP8 quantization (DeepSeek-V3's blocks of 128 along the last axis),
    `per_token_group_quant_fp8(x, group_size, eps=1e-10, use_ue8m0=...)` on CUDA: `(x_q, x_s)`, float8_e4m3fn codes
    and float32 scales of shape x.shape[:-1] + (x.shape[-1] // group_size,).

    As csrc/quantization/w8a8/fp8/per_token_group_quant.cu's `per_token_group_quant_8bit_kernel` computes it (vLLM's
    `per_token_group_quant_fp8`, model_executor/layers/quantization/utils/fp8_utils.py:510, eps=1e-10, calls it
    on CUDA for a contiguous x, line 578; its Triton fallback, line 144, computes `_absmax * (1.0 / fp8_max)`,
    which can differ in the scale's last bit):
    - line 32 `float local_absmax = eps;`, line 39 `local_absmax = fmaxf(local_absmax, abs_v);`: eps floors the
      amax and a NaN element is skipped;
    - line 53 `float y_s = local_absmax / max_8bit;`; with UE8M0, line 55 `y_s =
      exp2f(ceilf(log2f(fmaxf(fabsf(y_s), 1e-10f))));`: a power of two;
    - lines 70-71 `float q = fminf(fmaxf(static_cast<float>(src) / y_s, min_8bit), max_8bit); dst =
      DST_DTYPE(q);` (divided), DST_DTYPE __nv_fp8_e4m3 (line 241): satfinite, nearest even.
    Differences from `ma.quantize(y, ma.Quant("float8_e4m3fn", "group", group_size=g, amax_floor=eps,
    pow2=use_ue8m0))`, the contract: none on finite groups without UE8M0.  With UE8M0: (1) the power of two comes
    from a float32 log2f, which rounds log2 of a scale a few ulps above 2^k down to exactly k, so vLLM keeps 2^k
    (and the group's largest values clamp at 448) where the contract rounds up to 2^(k+1); here log2f is
    correctly rounded (CUDA's has up to 1 ulp error, so on a GPU such a scale can go either way); (2) the
    1e-10 floor applies to the scale too, so a group whose amax is below 448e-10 (an all-zero group among them)
    gets 2^-33 where the contract gives 2^ceil(log2(amax / 448)) (2^-42 for the floor 1e-10).  Specials: a NaN
    element is skipped by the amax and its code is -448 (fmaxf(NaN, -448) is -448; the contract: NaN scale and
    codes); an inf gives an inf scale, the group's finite values become 0 and the infs -448 (contract: NaN)."""
    fn = "vllm_per_token_group_quant_fp8()"
    a = _host(fn, "x", x)
    if isinstance(group_size, bool) or not isinstance(group_size, (int, np.integer)) or group_size < 1:
        raise ValueError(f"{fn}: group_size must be a positive integer, got {group_size!r}")
    e = _positive(fn, "eps", eps, zero_ok=True)
    ue8m0 = _flag(fn, "use_ue8m0", use_ue8m0)
    n = _last_axis(fn, "x", a, int(group_size), "group_size")
    v = _f32(a)
    g = v.reshape(v.shape[:-1] + (n // group_size, int(group_size)))
    qmax = np.float32(448)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        s = (_amax_fmaxf(g, start=float(e)) / qmax).astype(np.float32)
        if ue8m0:
            s = _exp2f_ceil_log2f(np.fmax(np.abs(s), np.float32(1e-10)))
        r = np.fmin(np.fmax(g / s[..., None], -qmax), qmax)
    return _out((_f8(r, "float8_e4m3fn").reshape(v.shape), s), x)


def _exp2f_ceil_log2f(s: np.ndarray) -> np.ndarray:
    """exp2f(ceilf(log2f(s))) for positive float32 s, log2f correctly rounded to float32 (log2 in float64 of a
    float32 is within 2^-50 of the real, far inside half a float32 ulp but for exact ties, which log2 of a float32
    never has but at powers of two, where it is exact)."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        lg = np.log2(s.astype(np.float64)).astype(np.float32)
        return np.exp2(np.ceil(lg).astype(np.float64)).astype(np.float32)


def vllm_scaled_int8_quant(input: Any, scale: Any = None, azp: Any = None,
                           symmetric: bool = True) -> tuple[Any, Any, Any]:
    """vLLM's INT8 activation quantization, `vllm._custom_ops.scaled_int8_quant(input, scale=None, azp=None,
    symmetric=True)`: `(output, scale, azp)`, int8 codes, float32 scales and int32 zero points (None when
    symmetric); dequantize: (code - azp) * scale.

    As csrc/quantization/w8a8/int8/scaled_quant.cu computes it (vllm/_custom_ops.py:2059 picks the kernel; CUDA
    path: PTX's saturating conversions, lines 35, 70 and 93, a NaN converting to 0):
    - static symmetric: line 116 `dst = float_to_int8_rn(static_cast<float>(src) / scale);` (divided);
    - static with `azp`: line 129 `const float inv_s = 1.0f / scale;`, line 139 `dst =
      int32_to_int8(float_to_int32_rn(v) + azp);` with v = value * inv_s (multiplied by the reciprocal);
    - dynamic symmetric, per row: the amax folded with fmaxf from 0, line 168 `scale_out[blockIdx.x] = absmax /
      127.f;`, line 172 `float inv_s = (absmax == 0.f) ? 0.f : 127.f / absmax;`, codes
      `float_to_int8_rn(v * inv_s)`;
    - dynamic azp (`symmetric=False`), per row: min and max folded with fminf/fmaxf from +-FLT_MAX, lines 244-245
      `float s = (mm.max - mm.min) / 255.f; float zp = nearbyintf(-128.f - mm.min / s);`, zp converted to int32
      (cvt.rzi, saturating), `inv_s = 1.f / s`, line 260 as the static azp form (the int32 sum wraps).
    Scales (and zero points) of shape input.shape[:-1] + (1,) (vLLM's are (numel / hidden, 1)).
    Differences from the contract (`ma.Quant("int8", ...)`): dynamic symmetric codes are v * (127 / amax), not
    v / (amax / 127); the contract gives an all-zero row scale 1 (vLLM: scale 0, codes 0) and a row with all
    values equal scale 1 in the azp form (vLLM: scale 0, so min / 0 and v * inf: the zero point and codes come
    from PTX's saturation, e.g. a row of 2.0 gives azp -2147483648 and codes -1, dequantized to 0 -- not 2);
    the contract's symmetric codes stop at -127 (vLLM's reach -128 when v / scale rounds below -127.5, which
    dynamic scales never make); NaN is skipped by vLLM's amax and min/max (its code 0, or the zero point),
    where the contract's scale is NaN."""
    fn = "vllm_scaled_int8_quant()"
    x = _host(fn, "input", input)
    sym = _flag(fn, "symmetric", symmetric)
    v = _f32(x)
    if scale is not None:
        s = _positive(fn, "scale", scale)
        shape = _given_shape(scale)
        if sym:
            if azp is not None:
                raise ValueError(f"{fn}: azp applies to symmetric=False (a zero point)")
            with np.errstate(invalid="ignore", over="ignore"):
                q = _ptx_int(v / s, -128, 127)
            return _out((q.astype(np.int8), np.array(s, np.float32).reshape(shape), None), input)
        if azp is None:
            raise ValueError(f"{fn}: azp must be given with a static scale and symmetric=False")
        zp = _int32_param(fn, "azp", azp)
        with np.errstate(invalid="ignore", over="ignore"):
            q = _ptx_int(v * (np.float32(1) / s), -2 ** 31, 2 ** 31 - 1)
        q = np.clip(_wrap32(q + zp), -128, 127)
        return _out((q.astype(np.int8), np.array(s, np.float32).reshape(shape),
                     np.array(zp, np.int32).reshape(_given_shape(azp))), input)
    if azp is not None:
        raise ValueError(f"{fn}: azp is computed for a dynamic scale; pass it only with a static scale")
    if v.ndim == 0:
        raise ValueError(f"{fn}: input must have a last axis (the token's) for per-token scales, got a 0-d array")
    rows = _rows(v)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        if sym:
            amax = _amax_fmaxf(rows)
            s = (amax / np.float32(127)).astype(np.float32)
            inv = np.where(amax == 0, np.float32(0), np.float32(127) / amax).astype(np.float32)
            q = _ptx_int(rows * inv[:, None], -128, 127)
            return _out((q.astype(np.int8).reshape(v.shape), s.reshape(v.shape[:-1] + (1,)), None), input)
        big = np.float32(np.finfo(np.float32).max)
        lo = np.fmin.reduce(rows, axis=-1, initial=big).astype(np.float32)
        hi = np.fmax.reduce(rows, axis=-1, initial=-big).astype(np.float32)
        s = ((hi - lo) / np.float32(255)).astype(np.float32)
        zp = _ptx_int(np.rint(np.float32(-128) - lo / s), -2 ** 31, 2 ** 31 - 1, trunc=True)
        inv = (np.float32(1) / s).astype(np.float32)
        q = _ptx_int(rows * inv[:, None], -2 ** 31, 2 ** 31 - 1)
    q = np.clip(_wrap32(q + zp[:, None]), -128, 127)
    return _out((q.astype(np.int8).reshape(v.shape), s.reshape(v.shape[:-1] + (1,)),
                 zp.astype(np.int32).reshape(v.shape[:-1] + (1,))), input)


def _int32_param(fn: str, name: str, v: Any) -> np.int64:
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(v, torch.Tensor):
        v = v.detach().cpu().numpy()
    if isinstance(v, np.ndarray):
        if v.size != 1 or v.dtype.kind not in "iu":
            raise TypeError(f"{fn}: {name} must be one int32 value, got an array of shape {v.shape} and dtype "
                            f"{v.dtype}")
        v = v.reshape(())[()]
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not -2 ** 31 <= int(v) < 2 ** 31:
        raise TypeError(f"{fn}: {name} must be an int32 value, got {v!r}")
    return np.int64(v)


def _wrap32(a: np.ndarray) -> np.ndarray:
    """int64 sums wrapped to int32 (two's complement, as the GPU's 32-bit add)."""
    return ((np.asarray(a, np.int64) + 2 ** 31) % 2 ** 32) - 2 ** 31


# ---- NVIDIA Transformer Engine ------------------------------------------------------------------------------


def te_scale_from_amax(amax: Any, fp8_dtype: str = "float8_e4m3fn", *, force_pow_2_scales: bool = False,
                       epsilon: float = 0.0) -> Any:
    """Transformer Engine's FP8 scale from an amax: TE stores `scale = qmax / amax` (the multiplier that maps amax
    to the format's largest value) and `scale_inv = 1 / scale` (what dequantization multiplies by), the inverse
    of multiact's scale (amax / qmax, `ma.Quant`).

    As transformer_engine/common/recipe/recipe_common.cuh's `compute_scale_from_amax` (line 14) computes it for
    current scaling (recipe/current_scaling.cu:274-275 passes value_for_inf = `std::numeric_limits<float>::max()`):
    line 18 `amax < epsilon` -> epsilon; line 24 an amax that is inf, 0 or NaN -> scale 1; line 31
    `scale = __fdiv_rn(max_fp8, amax);`; line 37 an inf quotient -> value_for_inf; with `force_pow_2_scales`,
    line 41 `scale_bits &= 0xFF800000;`: the scale rounded down to a power of two, so its inverse rounds up.
    (Delayed scaling, recipe/delayed_scaling.cu:141 and 300, computes `scaled_max / amax` with scaled_max =
    max_fp8 * 2^-margin from an amax history, keeping the previous scale where amax is 0, inf or NaN.)
    amax: a float or an array (float32 results of its shape, NumPy or torch as given)."""
    fn = "te_scale_from_amax()"
    name = _choice(fn, "fp8_dtype", fp8_dtype, tuple(_F8_MAX))
    pow2 = _flag(fn, "force_pow_2_scales", force_pow_2_scales)
    eps = _positive(fn, "epsilon", epsilon, zero_ok=True)
    a = _host(fn, "amax", amax)
    s = _te_scale(_f32(a), np.float32(_F8_MAX[name]), pow2, eps)
    return np.float32(s) if isinstance(amax, (float, int)) else _out((s,), amax)[0]


def _te_scale(amax: np.ndarray, qmax: np.float32, pow2: bool, eps: np.float32) -> np.ndarray:
    a = np.asarray(amax, np.float32)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        a = np.where(a < eps, eps, a).astype(np.float32)  # NaN < eps is false: NaN stays
        s = (qmax / a).astype(np.float32)
        s = np.where(np.isinf(s), np.float32(np.finfo(np.float32).max), s).astype(np.float32)
        s = np.where(np.isinf(a) | (a == 0) | np.isnan(a), np.float32(1), s).astype(np.float32)
    if pow2:
        s = (s.view(np.uint32) & np.uint32(0xFF800000)).view(np.float32)
    return s


def te_cast_to_fp8(y: Any, scale: Any = None, fp8_dtype: str = "float8_e4m3fn", *,
                   force_pow_2_scales: bool = False, amax_epsilon: float = 0.0) -> tuple[Any, Any, Any]:
    """Transformer Engine's per-tensor FP8 cast of y's values (widened exactly to float32): `(data, scale_inv,
    amax)`, float8 codes, the float32 dequantization multiplier 1 / scale, and the amax TE records.

    As TE's kernels compute it: transformer_engine/common/util/vectorized_pointwise.h `unary_kernel` (the cast,
    and the fused activation-then-cast; lines 202-207: `max = fmaxf(fabsf(temp), max); temp = temp * s;
    storer.separate()[i] = static_cast<OutputType>(temp);`; likewise common/cast/fp8/quantize_fp8.cuh:181 and
    gated_fp8.cuh:217, `static_cast<OType>(elt * scale)`): each value times the scale in float32, then the
    __nv_fp8_e4m3 / __nv_fp8_e5m2 constructor (CUDA's cuda_fp8.hpp: `__nv_cvt_float_to_fp8(f, __NV_SATFINITE,
    ...)`: nearest even, beyond the largest finite value and +-inf the largest finite, NaN stays NaN);
    `scale_inv = 1 / scale` (vectorized_pointwise.h:224, `reciprocal<float>`, common/utils.cuh:951 `__frcp_rn`:
    correctly rounded); the amax folded with fmaxf from 0 (a NaN is skipped).  With
    `scale` (delayed scaling: the scale from earlier amaxes) the codes use it as given; without (current
    scaling, recipe/current_scaling.cu: `nvte_compute_amax`, then `nvte_compute_scale_from_amax`), the scale is
    `te_scale_from_amax(amax, ...)` of y's own amax.
    Differences from the contract (`ma.quantize(y, ma.Quant(fp8_dtype, "tensor"))`: scale amax / qmax, codes
    value / scale): TE's codes are value * fl(qmax / amax) and its dequantization multiplier is fl(1 / fl(qmax /
    amax)), which differs from fl(amax / qmax) in the last bit for some amaxes; a NaN is skipped by the amax (the
    contract: NaN scale) and stays NaN in its code; an inf makes amax inf, hence scale 1 and the inf's code the
    largest finite (the contract: inf scale, NaN code); an all-zero tensor gets scale 1 in both."""
    fn = "te_cast_to_fp8()"
    name = _choice(fn, "fp8_dtype", fp8_dtype, tuple(_F8_MAX))
    pow2 = _flag(fn, "force_pow_2_scales", force_pow_2_scales)
    eps = _positive(fn, "amax_epsilon", amax_epsilon, zero_ok=True)
    v = _f32(_host(fn, "y", y))
    amax = _amax_fmaxf(v.reshape(-1), axis=0)
    if scale is None:
        s = _te_scale(amax, np.float32(_F8_MAX[name]), pow2, eps)
    else:
        if pow2 or eps:
            raise ValueError(f"{fn}: force_pow_2_scales and amax_epsilon shape a scale computed here; with a given "
                             "scale pass neither")
        s = _positive(fn, "scale", scale)
    with np.errstate(invalid="ignore", over="ignore"):
        q = _satfinite((v * s).astype(np.float32), name)
        inv = np.float32(1) / np.float32(s)
    return _out((q, np.array(inv, np.float32), np.array(amax, np.float32)), y)


# ---- Huawei CANN (ops-nn) and torch_npu ---------------------------------------------------------------------


def _int8_rint_sat(v: np.ndarray) -> np.ndarray:
    """Ascend's float -> int8 path of these kernels: nearest even (CAST_RINT), saturated to [-128, 127] (via
    float16 and int16/int32 steps that are exact on integers in range; see each function); NaN -> 0 (assumed:
    not checked on an NPU)."""
    with np.errstate(invalid="ignore"):
        r = np.clip(np.rint(v), -128, 127)
    return np.nan_to_num(r, nan=0.0).astype(np.int8)


def _groups_of_rows(fn: str, group_index: Any, rows: int, count: bool) -> tuple[np.ndarray, int]:
    """Each row's group (-1: past the last group), from group_index as cumulative ends (count=False) or counts."""
    if group_index is None:
        return np.zeros(rows, np.int64), 1
    torch = sys.modules.get("torch")
    g = group_index.detach().cpu().numpy() if torch is not None and isinstance(group_index, torch.Tensor) \
        else np.asarray(group_index)
    if g.ndim != 1 or g.size == 0 or g.dtype.kind not in "iu":
        raise TypeError(f"{fn}: group_index must be a 1-d integer array, got shape {g.shape} and dtype {g.dtype}")
    if (g < 0).any():
        raise ValueError(f"{fn}: group_index must be non-negative, got {g.tolist()}")
    ends = np.cumsum(g) if count else g.astype(np.int64)
    if (np.diff(ends) < 0).any():
        raise ValueError(f"{fn}: group_index must be non-decreasing (cumulative ends), got {g.tolist()}")
    idx = np.searchsorted(ends, np.arange(1, rows + 1), side="left")  # first group whose end >= row number
    return np.where(idx < ends.size, idx, -1), int(ends.size)


def _per_group(fn: str, name: str, a: Any, groups: int, n: int, *, scalar_ok: bool = True) -> np.ndarray:
    """A float32 table (groups, n) from a (groups, n) array, a (groups,) array (one value per group, when
    scalar_ok), or, with one group, an (n,) array."""
    arr = _f32(_host(fn, name, a))
    if arr.ndim == 0 and scalar_ok:
        arr = arr.reshape(1)
    if arr.ndim == 2 and arr.shape == (groups, n):
        return arr
    if arr.ndim == 1 and arr.size == groups and scalar_ok:
        return np.repeat(arr[:, None], n, axis=1)
    if arr.ndim == 1 and groups == 1 and arr.size == n:
        return arr[None, :]
    if arr.ndim == 2 and groups == 1 and arr.shape == (1, 1) and scalar_ok:
        return np.repeat(arr, n, axis=1)
    want = f"({groups}, {n})" + (f" or ({groups},)" if scalar_ok else "") + (f" or ({n},)" if groups == 1 else "")
    raise ValueError(f"{fn}: {name} has shape {arr.shape}; expected {want}")


def cann_swi_glu_quant(x: Any, smooth_scales: Any = None, offsets: Any = None, group_index: Any = None,
                       activate_left: bool = False, quant_mode: str = "dynamic", group_list_type: int = 0, *,
                       backend: str | None = None) -> tuple[Any, Any]:
    """CANN's SwiGluQuant (ops-nn quant/swi_glu_quant; aclnnSwiGluQuant): SwiGLU of x (..., 2H) and int8 codes
    per row, `(y, scale)` with y (..., H) int8 and scale of shape x.shape[:-1] float32.

    As ops-nn's A2/A3 kernel computes it (quant/swi_glu_quant/op_kernel/swi_glu_quant.h `Compute`: lines 244-248
    silu as x / (1 + exp(-x)), 296 the smooth scales, 305 `Div(tmpLocal, constScale, tmpLocal, ...)` with
    swi_glu_quant_base.h:31 `SWI_GLU_QUANT_INT8_SYM_SCALE = 127.0`, 309 `scaleLocal.SetValue(i, scale)`, 312
    `Muls(tempFp32, tempFp32, scale, ...)`; base.h:161-172 `CastQuantOut`; swi_glu_quant_static.h:280-282 and
    323-325 the static forms; defaults from op_graph/swi_glu_quant_proto.h:59-62):
    - `activate_left=False` (the default) activates the second half: silu(x[..., H:]) * x[..., :H] (multiact's
      swiglu activates the first half); the product in float32, silu as x / (1 + exp(-x));
    - `smooth_scales` (float32, (G, H) or (G,)) multiplies each row by its group's row of scales; `group_index`
      (G,) gives the groups' cumulative row ends (`group_list_type=0`) or counts (1); rows past the last group are
      not multiplied;
    - dynamic: per row, `Div(constScale, amax)`: the scale output is 127 / amax, the quantization multiplier,
      not the dequantization scale (dequantize: code / scale); codes `Cast(..., CAST_RINT)` of value * scale to
      int32, then to float16 and int8 (exact for codes in range);
    - static: value * smooth_scales + offsets (per group, per tensor with (G,) tables or per channel with (G, H)),
      then the same cast; the scale output is not written by the kernel (zeros here).
    Differences from the contract (`ma.swiglu(x, quant=ma.Quant("int8", "token"))`): the scale is 127 / amax
    (its inverse); codes are value * fl(127 / amax), not value / fl(amax / 127); no amax floor, so an all-zero
    row gets scale inf (the contract: 1); a -inf gate is NaN in x / (1 + exp(-x)).  NaN and inf: on the NPU the
    vector unit's max and casts decide, not checked on hardware: here a NaN propagates to its row's amax (scale
    NaN, all codes 0), an inf makes the scale 0 (finite values 0, the inf NaN, code 0).  Ascend 950's kernel
    (op_kernel/arch35) floors the amax at 1e-8; the A2/A3 kernel followed here does not.  int8 output only
    (dst_type int4, aclnnSwiGluQuantV2, is not built)."""
    fn = "cann_swi_glu_quant()"
    a = _host(fn, "x", x)
    left = _flag(fn, "activate_left", activate_left)
    mode = _choice(fn, "quant_mode", quant_mode, ("dynamic", "static"))
    kind = _choice(fn, "group_list_type", group_list_type, (0, 1))
    n = _last_axis(fn, "x", a, 2, "the two halves of SwiGLU")
    h = n // 2
    v = _rows(_f32(a)) if a.ndim else _f32(a).reshape(1, -1)
    row_group, groups = _groups_of_rows(fn, group_index, v.shape[0], kind == 1)
    act_half, mul_half = (v[:, :h], v[:, h:]) if left else (v[:, h:], v[:, :h])
    act = _nan_at_neg_inf(_ma().swiglu(np.ascontiguousarray(act_half), up=np.ascontiguousarray(mul_half),
                                       backend=backend), act_half)
    has = row_group >= 0
    gi = np.where(has, row_group, 0)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        if mode == "dynamic":
            if offsets is not None:
                raise ValueError(f"{fn}: offsets apply to quant_mode='static'")
            if smooth_scales is not None:
                sm = _per_group(fn, "smooth_scales", smooth_scales, groups, h)
                act = np.where(has[:, None], act * sm[gi], act).astype(np.float32)
            amax = np.max(np.abs(act), axis=-1, initial=np.float32(0)) if h else np.zeros(len(act), np.float32)
            scale = (np.float32(127) / amax.astype(np.float32)).astype(np.float32)
            codes = _int8_rint_sat((act * scale[:, None]).astype(np.float32))
        else:
            if smooth_scales is None:
                raise ValueError(f"{fn}: smooth_scales must be given with quant_mode='static'")
            sm = _per_group(fn, "smooth_scales", smooth_scales, groups, h)
            off = np.zeros_like(sm) if offsets is None else _per_group(fn, "offsets", offsets, groups, h)
            y = ((act * sm[gi]).astype(np.float32) + off[gi]).astype(np.float32)
            codes = _int8_rint_sat(np.where(has[:, None], y, act))
            scale = np.zeros(len(act), np.float32)
    lead = a.shape[:-1]
    return _out((codes.reshape(lead + (h,)), scale.reshape(lead)), x)


def cann_gelu_quant(x: Any, input_scale: Any = None, input_offset: Any = None, approximate: str = "none",
                    quant_mode: str = "dynamic", *, backend: str | None = None) -> tuple[Any, Any]:
    """CANN's GeluQuant (ops-nn activation/gelu_quant; aclnnGeluQuant): gelu of x, then int8 codes, `(y,
    out_scale)`; out_scale float32 of shape x.shape[:-1] (dynamic), None (static: the op outputs no scale).

    As ops-nn's kernels compute it (activation/gelu_quant/op_kernel/gelu_static_quant_per_tensor.h
    `ComputePerTensorQuant`, lines 228-242; gelu_dynamic_quant.h `ComputeDynamicQuant`, lines 257-265; defaults
    from op_graph/gelu_quant_proto.h:54-57):
    - static (`input_scale` required, `input_offset` optional, each one value or one per channel of the last
      axis): value * input_scale + input_offset in float32, then `Cast(.., CAST_ODD)` to float16 and
      `Cast(.., CAST_RINT)` to int8.  Rounding to odd into float16 keeps the information the second rounding
      needs (11 bits against the integer's 8), so the pair rounds to nearest even once, and values beyond the
      int8 range saturate: codes = clip(rint(value), -128, 127) (tests/test_compat_quant.py checks the two-step
      path against this);
    - dynamic (`input_scale`, optional, multiplies first: a smooth scale): per row `float scale = MAX_INT8 /
      maxValue` (127 / amax, float32), `scaleOutLocal.SetValue(i, 1 / scale)`: out_scale is fl(1 / fl(127 /
      amax)), codes value * fl(127 / amax) through the same two casts.
    Differences from the contract (`ma.gelu(x, approximate=..., quant=ma.Quant("int8", "token"))`: scale fl(amax /
    127), codes value / scale, no offset): codes are value * fl(127 / amax) and the scale fl(1 / fl(127 / amax)),
    which differs from fl(amax / 127) in the last bit for some amaxes; an all-zero row gives scale 0 and codes 0
    (the contract: scale 1); the static form adds an offset and has no scale.  The gelu is multiact's (CANN's
    kernel evaluates its own approximations: for "none" x / (1 + exp(P(x) x)) with a degree-6 polynomial P and
    x clamped to [-13.15, 5.75] in P, for "tanh" x / (1 + exp(-1.5957691 (x + 0.044715 x^3))), NaN at x = -inf,
    kept here); codes can differ by one where the two activations straddle a rounding boundary.  NaN and inf:
    as `cann_swi_glu_quant` (not checked on an NPU: a NaN makes its row's scale NaN and codes 0)."""
    fn = "cann_gelu_quant()"
    a = _host(fn, "x", x)
    approximate = _choice(fn, "approximate", approximate, ("none", "tanh"))
    mode = _choice(fn, "quant_mode", quant_mode, ("dynamic", "static"))
    if a.ndim == 0:
        raise ValueError(f"{fn}: x must have a last axis, got a 0-d array")
    n = a.shape[-1]
    v = _f32(a)
    g = _ma().gelu(v, approximate=approximate, backend=backend).astype(np.float32)
    if approximate == "tanh":  # CANN's tanh form, x / (1 + exp(-1.5957691 (x + 0.044715 x^3))), is NaN at -inf
        g = _nan_at_neg_inf(g, v)
    sc = None if input_scale is None else _per_group(fn, "input_scale", input_scale, 1, n)[0]
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        if mode == "static":
            if sc is None:
                raise ValueError(f"{fn}: input_scale must be given with quant_mode='static'")
            off = np.float32(0) if input_offset is None else _per_group(fn, "input_offset", input_offset, 1, n)[0]
            return _out((_int8_rint_sat(((g * sc).astype(np.float32) + off).astype(np.float32)), None), x)
        if input_offset is not None:
            raise ValueError(f"{fn}: input_offset applies to quant_mode='static'")
        if sc is not None:
            g = (g * sc).astype(np.float32)
        rows = _rows(g)
        amax = np.max(np.abs(rows), axis=-1, initial=np.float32(0)).astype(np.float32)
        m = (np.float32(127) / amax).astype(np.float32)
        out_scale = (np.float32(1) / m).astype(np.float32)
        codes = _int8_rint_sat((rows * m[:, None]).astype(np.float32))
    return _out((codes.reshape(a.shape), out_scale.reshape(a.shape[:-1])), x)


def npu_dequant_swiglu_quant(x: Any, *, weight_scale: Any = None, activation_scale: Any = None, bias: Any = None,
                             quant_scale: Any = None, quant_offset: Any = None, group_index: Any = None,
                             activate_left: bool = False, quant_mode: int = 0, swiglu_mode: int = 0,
                             clamp_limit: float = 7.0, glu_alpha: float = 1.702, glu_bias: float = 1.0,
                             backend: str | None = None) -> tuple[Any, Any]:
    """torch_npu's `npu_dequant_swiglu_quant`: a matmul's int32 output dequantized (per-channel weight scales,
    per-token activation scales, an optional bias), SwiGLU, then int8 per row: `(y, scale)`, y (tokens, H) int8
    and scale (tokens,) float32.  No fused kernel exists here: this composes the pieces (NumPy float32 for the
    dequantization, `ma.swiglu(gate, up=up, alpha=...)` for the activation, the quantization below), with the NPU
    kernel's own order of operations and roundings.

    Read from Ascend/op-plugin docs/zh/custom_APIs/torch_npu/torch_npu-npu_dequant_swiglu_quant.md (at 517f2e7:
    the signature on line 76; quant_mode 0 static, 1 dynamic; activate_left False activates the second half;
    swiglu_mode 0 standard, 1 GPT-OSS's variant on interleaved halves, 2 the variant on the two halves), its
    golden model test/test_custom_ops/test_npu_dequant_swiglu_quant.py (`golden_dequant_swiglu_quant_torch`,
    line 77), and ops-nn's kernels (jbgztxdy/ops-nn at fd1956f) quant/dequant_swiglu_quant/op_kernel/
    dequant_swiglu_quant_dynamic_base.hpp (`BaseCompute` lines 245-256, `DynamicCompute` lines 184-191) and
    dequant_swiglu_quant_static_base.hpp (lines 74, 177, 288-301):
    - x int32 (tokens, 2H): an int32 bias is added in int32 first (`addBiasWithBiasInt`); the cast to float32;
      times weight_scale ((2H,) or (G, 2H) per group); times activation_scale ((tokens,) or (tokens, 1)); a
      float32/float16/bfloat16 bias added last.  A float16, bfloat16 or float32 x is not dequantized: a
      weight_scale given with it is ignored (torch_npu allows it), activation_scale and bias must be None;
    - SwiGLU in float32, silu as x / (1 + exp(-x)); swiglu_mode 1 and 2: gate clamped above at clamp_limit, the
      other half to [-clamp_limit, clamp_limit], swish(gate, glu_alpha) * (other + glu_bias) (mode 1 on the even
      and odd elements, as `ma.swiglu(.., layout="interleaved", alpha=1.702, limit=7.0)` for glu_bias 1);
      then times quant_scale ((H,) or (G, H)) in the dynamic mode (a smooth scale);
    - dynamic (quant_mode=1): per row `value = max / 127` is the scale output, `scale = 1 / value` the multiplier,
      codes `Cast(.., CAST_RINT)` of value * multiplier to int16, then float16, then int8;
    - static (quant_mode=0): codes of value / quant_scale + quant_offset (per channel, (H,)), or value *
      fl(1 / quant_scale) + quant_offset (one value: the kernel's `quant_scale = 1 / quantScaleGm.GetValue(0)`),
      quant_offset 0 when not given (and read only with quant_scale); the scale output is zeros (as the golden
      model's);
    - group_index (count mode: tokens per group, dynamic only) picks each group's row of weight_scale and
      quant_scale; rows past the groups' sum are left unwritten on the NPU (zeros here).
    Differences from the contract (`ma.swiglu(.., quant=ma.Quant("int8", "token"))` on the dequantized values):
    the codes are value * fl(1 / fl(amax / 127)), not value / fl(amax / 127) (the golden model multiplies by
    fl(127 / amax): a code one apart now and then); an all-zero row gives scale 0 (the contract: 1) and codes 0;
    NaN and inf as `cann_swi_glu_quant` (not checked on an NPU).  Not built: Ascend 950's float8 outputs
    (dst_type), round_mode and activate_dim."""
    fn = "npu_dequant_swiglu_quant()"
    a = _host(fn, "x", x, ints=True)
    left = _flag(fn, "activate_left", activate_left)
    mode = _choice(fn, "quant_mode", quant_mode, (0, 1))
    smode = _choice(fn, "swiglu_mode", swiglu_mode, (0, 1, 2))
    limit = _positive(fn, "clamp_limit", clamp_limit)
    alpha = _positive(fn, "glu_alpha", glu_alpha)
    gbias = _real(fn, "glu_bias", glu_bias)
    if a.ndim != 2:
        raise ValueError(f"{fn}: x must be 2-d (tokens, 2H), got shape {a.shape}")
    n = _last_axis(fn, "x", a, 2, "the two halves of SwiGLU")
    h, t = n // 2, a.shape[0]
    if group_index is not None and mode != 1:
        raise ValueError(f"{fn}: group_index takes the dynamic mode only (quant_mode=1)")
    for name, arg in (("bias", bias), ("quant_offset", quant_offset)):
        if group_index is not None and arg is not None:
            raise ValueError(f"{fn}: {name} does not apply with group_index (torch_npu ignores it there)")
    row_group, groups = _groups_of_rows(fn, group_index, t, True)
    has = row_group >= 0
    gi = np.where(has, row_group, 0)
    if a.dtype == np.int32:
        xi = a.astype(np.int64)
        fbias = None
        if bias is not None:
            b = _host(fn, "bias", bias, ints=True)
            if b.shape != (n,):
                raise ValueError(f"{fn}: bias has shape {b.shape}; expected ({n},)")
            if b.dtype == np.int32:
                xi = _wrap32(xi + b.astype(np.int64))
            else:
                fbias = _f32(b)
        v = xi.astype(np.float32)
        with np.errstate(invalid="ignore", over="ignore"):
            if weight_scale is not None:
                v = (v * _per_group(fn, "weight_scale", weight_scale, groups, n, scalar_ok=False)[gi]).astype(
                    np.float32)
            if activation_scale is not None:
                acs = _f32(_host(fn, "activation_scale", activation_scale))
                if acs.shape not in ((t,), (t, 1)):
                    raise ValueError(f"{fn}: activation_scale has shape {acs.shape}; expected ({t},) or ({t}, 1)")
                v = (v * acs.reshape(t, 1)).astype(np.float32)
            if fbias is not None:
                v = (v + fbias).astype(np.float32)
    else:
        for name, arg in (("activation_scale", activation_scale), ("bias", bias)):
            if arg is not None:
                raise ValueError(f"{fn}: {name} dequantizes an int32 x; x is {a.dtype} (not dequantized): pass None")
        if weight_scale is not None:
            _per_group(fn, "weight_scale", weight_scale, groups, n, scalar_ok=False)  # checked, then unused
        v = _f32(a)
    if smode == 1:
        gate, other = v[:, 0::2], v[:, 1::2]
    else:
        gate, other = (v[:, :h], v[:, h:]) if left else (v[:, h:], v[:, :h])
    with np.errstate(invalid="ignore", over="ignore"):
        if smode:
            gate = np.minimum(gate, limit)  # clamp(max=clamp_limit): NaN stays NaN
            other = (np.clip(other, -limit, limit) + gbias).astype(np.float32)
    y = _nan_at_neg_inf(_ma().swiglu(np.ascontiguousarray(gate), up=np.ascontiguousarray(other),
                                     alpha=float(alpha) if smode else None, backend=backend), gate)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        if mode == 1:
            if quant_offset is not None:
                raise ValueError(f"{fn}: quant_offset applies to the static mode (quant_mode=0)")
            if quant_scale is not None:
                y = (y * _per_group(fn, "quant_scale", quant_scale, groups, h, scalar_ok=False)[gi]).astype(
                    np.float32)
            amax = np.max(np.abs(y), axis=-1, initial=np.float32(0)).astype(np.float32)
            scale = (amax / np.float32(127)).astype(np.float32)
            mult = (np.float32(1) / scale).astype(np.float32)
            codes = _int8_rint_sat((y * mult[:, None]).astype(np.float32))
        else:
            scale = np.zeros(t, np.float32)
            off = None if quant_offset is None else _f32(_host(fn, "quant_offset", quant_offset)).reshape(-1)
            if quant_scale is not None:
                qs = _f32(_host(fn, "quant_scale", quant_scale)).reshape(-1)
                if qs.size == 1:
                    y = (y * (np.float32(1) / qs[0])).astype(np.float32)
                elif qs.size == h:
                    y = (y / qs).astype(np.float32)
                else:
                    raise ValueError(f"{fn}: quant_scale has {qs.size} values; expected 1 or {h} (static mode)")
            if off is not None:
                if quant_scale is None:
                    raise ValueError(f"{fn}: quant_offset applies with quant_scale (the kernel reads it only then)")
                if off.size not in (1, h):
                    raise ValueError(f"{fn}: quant_offset has {off.size} values; expected 1 or {h}")
                y = (y + off).astype(np.float32)
            codes = _int8_rint_sat(y)
    codes = np.where(has[:, None], codes, np.int8(0)).astype(np.int8)
    scale = np.where(has, scale, np.float32(0)).astype(np.float32)
    return _out((codes, scale), x)
