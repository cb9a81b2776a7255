"""Other libraries' fused bias + activation calls, with their names, defaults and conventions, on
`ma.bias_act`: code ported from StyleGAN, CANN or ONNX Runtime keeps its semantics.

- `stylegan_bias_act`: NVlabs StyleGAN2/3 `torch_utils/ops/bias_act.py` `bias_act(x, b, dim, act, alpha, gain,
  clamp)`, with its per-activation default gains and alphas (sqrt(2) for relu, lrelu and swish).
- `fused_bias_leaky_relu` (+ `_grad`): CANN's FusedBiasLeakyRelu, bias of x's shape, slope 0.2, scale sqrt(2).
- `bias_gelu`, `fast_gelu`: ONNX Runtime's contrib BiasGelu (exact gelu of x + bias, bias along the last
  axis) and FastGelu (the tanh approximation, bias optional).
"""

from __future__ import annotations

import math
from typing import Any

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
