"""multiact: neural-network activations, forward and backward, on whatever holds the data.

    import numpy as np, multiact as ma
    y = ma.gelu(x, approximate="tanh")
    dx = ma.gelu_grad(dy, x, approximate="tanh")

`ma.ops()` lists the op table, `ma.backends()` what this machine can run and
why, `ma.explain(op, x)` which backend a call would use.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from . import dtypes  # noqa: F401 - multiact.dtypes.bfloat16 (ml_dtypes imported only when asked for)
from . import optable as _ops
from ._config import get_num_threads, set_num_threads
from .api import FUNCTIONS as _FUNCTIONS
from .api import backward, backward2, forward, param_grad, param_grad2
from .dequant import Dequant
from .errors import BackendError, YFormError
from .fused_bias_act import FUNCTIONS as _BIAS_ACT
from .gated import FUNCTIONS as _GATED
from .onnx_export import to_onnx
from .optable import OpSpec
from .quant import Quant, dequantize, quantize
from .registry import BackendInfo, backends, use
from .vocab import DIRECTIONS as _DIRECTIONS

__version__ = "0.1.0"

globals().update(_FUNCTIONS)
globals().update(_GATED)
globals().update(_BIAS_ACT)


def ops() -> _ops.OpTable:
    """The op table: a dict of name -> OpSpec (parameters, defaults, valid ranges, reference formulas)
    that prints as a table."""
    return _ops.OpTable(_ops.OPS)


def register_op(defn: _ops.OpDef, *, formulas: Mapping[Any, Any] | None = None, graphs: Mapping[Any, Any] | None = None,
                **numerics: Any) -> OpSpec:
    """Add an op: its definition (`multiact._opdefs.OpDef`) and its numerics (float64 references
    `forward`, `backward` and, where the definition has them, `backward_y` and `param_grad_ref`; `backward2`;
    `kinks`, `tol`, `exact`).  It gets `ma.<name>`, `ma.<name>_grad`... at once, and runs on the numpy
    backend from its references, on any other backend that has its kernels, with the shared suite.

    Its kernels for other backends, each a mapping of direction ((kernel key, direction) for an op with variants)
    to a function: `formulas`, scalar formulas for the numba and cuda backends (`multiact.backend.formulas.register`:
    how they are written, what they may call); `graphs`, ONNX graph bodies for the onnxruntime and ascend backends
    and `to_onnx` (`multiact.backend.onnx_graphs.register`).  If one is refused, nothing of the op stays.  The
    native backend's C kernels are compiled at install and cannot be added at run time."""
    from .api import publish

    spec = _ops.register(OpSpec(defn, **numerics))
    if formulas or graphs:
        from .backend import formulas as _formulas
        from .backend import onnx_graphs as _graphs

        try:
            for table, given in ((_formulas, formulas), (_graphs, graphs)):
                for k, fn in (given or {}).items():
                    key, direction = (defn.name, k) if isinstance(k, str) else k
                    table.register(key, direction, fn)
        except BaseException:
            for key in spec.keys:
                _formulas.unregister(key)
                _graphs.unregister(key)
            _ops.unregister(defn.name)
            raise
    funcs = publish(spec)
    globals().update(funcs)
    __all__.extend(sorted(funcs))
    return spec


def explain(op: str, x: Any, *, direction: str = "forward", backend: str | None = None, **params: Any) -> str:
    """Which backend would run `op` on `x` (forward, or direction="backward", "backward2" for `backward2`), and
    why.  A composite op (glu, swiglu, geglu, reglu, bias_act) names the kernel its parameters select (swiglu:
    gated:silu)."""
    from . import elementwise, fused_bias_act, gated

    directions = tuple(n for n, d in _DIRECTIONS.items() if d.function != "param_grad2")  # explain names no parameter
    if direction not in directions:
        raise ValueError(f"direction must be one of {directions}, got {direction!r}")
    for family in (gated, fused_bias_act):
        key = family.kernel_key_of(op, params, "explain()")
        if key is not None:
            return elementwise.explain(f"{op} ({key})", key, direction, x, backend)
    spec = _ops.get(op)
    key = spec.kernel_key(spec.validate(params) if params else spec.defaults())
    return elementwise.explain(op, key, direction, x, backend)


__all__ = [
    "BackendError", "BackendInfo", "Dequant", "OpSpec", "Quant", "YFormError", "backends", "backward", "backward2",
    "dequantize", "explain", "forward", "quantize", "register_op",
    "get_num_threads", "ops", "param_grad", "param_grad2", "set_num_threads", "to_onnx", "use", *sorted(_FUNCTIONS),
    *sorted(_GATED), *sorted(_BIAS_ACT),
]
