"""multiact: neural-network activations, forward and backward, on whatever holds the data.

    import numpy as np, multiact as ma
    y = ma.gelu(x, approximate="tanh")
    dx = ma.gelu_grad(dy, x, approximate="tanh")

`ma.ops()` lists the op table, `ma.backends()` what this machine can run and
why, `ma.explain(op, x)` which backend a call would use.
"""

from __future__ import annotations

from typing import Any

from . import dtypes  # noqa: F401 - multiact.dtypes.bfloat16 (ml_dtypes imported only when asked for)
from . import optable as _ops
from ._config import get_num_threads, set_num_threads
from .api import FUNCTIONS as _FUNCTIONS
from .api import backward, backward2, forward, param_grad, param_grad2
from .errors import BackendError, YFormError
from .fused_bias_act import FUNCTIONS as _BIAS_ACT
from .gated import FUNCTIONS as _GATED
from .onnx_export import to_onnx
from .optable import OpSpec
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


def register_op(defn: _ops.OpDef, **numerics: Any) -> OpSpec:
    """Add an op: its definition (`multiact._opdefs.OpDef`) and its numerics (float64 references
    `forward`, `backward` and, where the definition has them, `backward_y` and `param_grad_ref`;
    `kinks`, `tol`, `exact`).  It gets `ma.<name>`, `ma.<name>_grad`... at once, and runs on the numpy
    backend from its references, on any other backend that has its kernels, with the shared suite."""
    from .api import publish

    spec = _ops.register(OpSpec(defn, **numerics))
    funcs = publish(spec)
    globals().update(funcs)
    __all__.extend(sorted(funcs))
    return spec


def explain(op: str, x: Any, *, direction: str = "forward", backend: str | None = None, **params: Any) -> str:
    """Which backend would run `op` on `x` (forward, or direction="backward", "backward2" for `backward2`), and
    why.  A composite op (glu, swiglu, geglu, reglu, bias_act) names the kernel its parameters select (swiglu:
    gated:silu)."""
    from .dispatch import explain as _explain

    directions = tuple(n for n, d in _DIRECTIONS.items() if d.function != "param_grad2")  # explain names no parameter
    if direction not in directions:
        raise ValueError(f"direction must be one of {directions}, got {direction!r}")
    key = _composite_key(op, direction, params)
    if key is not None:
        return _explain(_KernelOnly(f"{op} ({key})", key), direction, x, backend)
    spec = _ops.get(op)
    if params:
        return _explain(_KernelOnly(op, spec.kernel_key(spec.validate(params))), direction, x, backend)
    return _explain(spec, direction, x, backend)


def _composite_key(op: str, direction: str, params: dict) -> str | None:
    from . import fused_bias_act, gated
    from ._opdefs import COMPOSITE_DEFINITIONS

    own = dict(params)
    if op == fused_bias_act.DEFN.name:
        names = fused_bias_act.DEFN.param_names
        return fused_bias_act.resolve({k: v for k, v in own.items() if k in names},
                                      {k: v for k, v in own.items() if k not in names}, "explain()").key
    cdef = COMPOSITE_DEFINITIONS.get(op)
    if cdef is None:
        return None
    given = {k: v for k, v in own.items() if k in cdef.param_names}
    extra = {k: v for k, v in own.items() if k not in cdef.param_names}
    if extra and not cdef.takes_act_params:
        raise TypeError(f"explain(): unexpected parameters for {op}: {sorted(extra)}")
    return gated.resolve(cdef, given, extra, "explain()").key


class _KernelOnly:
    """What dispatch.explain reads of an op: its name and the kernel key of the call."""

    def __init__(self, name: str, key: str):
        self.name, self._key = name, key

    def kernel_key(self, p: Any) -> str:
        return self._key

    def defaults(self) -> dict:
        return {}


__all__ = [
    "BackendError", "BackendInfo", "OpSpec", "YFormError", "backends", "backward", "backward2", "explain", "forward",
    "register_op",
    "get_num_threads", "ops", "param_grad", "param_grad2", "set_num_threads", "to_onnx", "use", *sorted(_FUNCTIONS),
    *sorted(_GATED), *sorted(_BIAS_ACT),
]
