"""`ma.to_onnx`: ONNX models of every activation, forward and backward, and `from_onnx_node`, their inverse.

`to_onnx(op)` (accuracy="auto", the default) is a one-node graph where ONNX has the op and ONNX Runtime's kernel
keeps our contract (the op's Tolerance; NaN in gives NaN out, +-inf gives the limit, PyTorch's choices at
the kinks and the sign of zero), measured per dtype (onnx_graphs.BUILTIN_OK); otherwise the registered composite:
a small graph of primitive ops that follows `multiact.reference`, in float32 where that meets the contract (expm1
by Kahan's trick, sigmoid and softplus from Exp/Log without overflow), in float64 only where it does not (gelu's
erfc tail, mish's subnormal softplus, tanhshrink's cancellation), rounded once.  float16 models compute in float32
(or float64) and round once, as the rest of multiact does.  accuracy="contract" takes the composite always,
accuracy="runtime" ORT's own operators regardless (RUNTIME_ERRORS: what that costs in accuracy).  Backward
graphs are always composites: ONNX Runtime's standard package has no gradient kernels.  ONNX Runtime's CPU
provider runs each node as a pass over the tensor (no elementwise fusion), so a composite costs several built-in
operators' time (the table of docs/performance.md, from `benchmarks/onnx_export.py`).

Inputs have any rank by default (no shape in the model: ONNX Runtime takes any); `shape=` fixes the rank and
dims.  prelu's weight is 1-D, broadcast along `axis` in the graph.  `opset=` (default 20, from 15) is the model's
opset: an ORT operator the opset lacks gives way to the composite.  The gated ops (glu, swiglu, geglu, reglu) take
x of `ndim` dims and split it along `dim` inside the graph.  `from_onnx_node` maps an ONNX activation node back onto
an op and its keywords.  The graphs themselves, registered per (kernel key, direction), are the onnxruntime and
ascend backends' kernels (`multiact.backend.onnx_graphs`); this module is the public front built on them, and
multiact.torch_onnx replays them into torch.onnx.export's graphs.  `onnx` is imported lazily.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._opdefs import DEFS, F32_MAX
from .backend import onnx_graphs as G
from .backend import onnx_quant as OQ
from .backend.onnx_graphs import (  # noqa: F401 (the models' dtypes, versions and accuracy modes)
    ACCURACIES,
    DTYPES,
    IR_VERSION,
    MIN_OPSET,
    OPSET,
)
from .optable import BIAS_ACT_KEYS, FAMILY_KEYS
from .optable import get as _spec

_DEVIATIONS = {
    "elu": "ORT's float32 Elu computes exp(x) - 1 (8e6 ulp near 0): float32 composite with expm1 "
           "(float16: one node, except for a negative alpha, -0.0 included, whose sign of zero at x = +0 it loses)",
    "selu": "ORT's Selu computes exp(x) - 1 (1.5e7 ulp near 0 in float32) and gives +0 at x = -0 (float16 too); "
            "float32 composite with expm1",
    "celu": "ORT's Celu is float32 only and computes exp(x) - 1 (8e6 ulp); float32 composite with expm1",
    "gelu": "ORT's Gelu cancels in the negative tail (1.7e7 ulp, tanh form 7.5e7) and gives NaN at -inf; "
            "composite with erfc in float64 (a float32 erfc is 275 ulp off in the tail)",
    "sigmoid": "ORT's Sigmoid is 6.8e7 ulp off for x < -3 in float32 (1.9 ulp in float16); float32 composite",
    "hardswish": "ORT's HardSwish is 4e6 ulp off near -3 in float32 and gives NaN at -inf; float32 composite",
    "tanh": "ORT's float32 Tanh is 48 ulp off at +-1.2e-38 (the smallest normal): float32 Tanh with x itself "
            "below 2^-12 (float16: one node)",
    "softsign": "ORT's Softsign gives NaN at +-inf; float32 composite",
    "mish": "ORT's Mish gives NaN at -inf; float32 composite",
    "softshrink": "ORT's Shrink maps NaN to 0; float32 composite",
    "hardshrink": "ORT's Shrink maps NaN to 0; float32 composite",
    "threshold": "ORT's ThresholdedRelu is threshold(x, alpha, 0): one node for value = +0, else a composite",
    "softplus": "ORT's Softplus has no beta/threshold: at beta = 1 it with the threshold around it (Greater, Where); "
                "another beta rounds twice in float16 around it, so a composite",
    "prelu": "ORT's PRelu takes x = -0 as positive, so a negative weight gives the wrong sign of zero: "
             "float32 composite (accuracy='runtime': PRelu)",
    "leaky_relu": "ORT's LeakyRelu takes x = -0 as positive: a negative slope gives the wrong sign of zero "
                  "(one node only for slopes >= +0)",
    "tanhshrink": "x - tanh(x) cancels near 0 in float32: float64 series below 0.5",
}

# accuracy="runtime": ORT's own operators regardless.  Where that breaks the contract, what was measured (ONNX
# Runtime 1.32, CPU provider, AMD Zen 3 with AVX2; the consistency suite's inputs plus a dense grid on [-30, 30],
# against the float64 reference).  RUNTIME_ULPS holds the figures (largest error per dtype over the op's parameter
# cases, in ulp of the dtype), the notes say where; tests/test_onnx_contract.py measures them again and fails where
# an error has grown past twice its figure.  Ops not listed meet the contract in runtime mode too (the same test).
RUNTIME_ULPS: dict[str, dict[str, float]] = {
    "elu": {"float32": 8.4e6}, "selu": {"float32": 1.5e7, "float16": 0.6}, "celu": {"float32": 8.4e6, "float16": 1.0},
    "gelu": {"float32": 7.5e7, "float16": 8.4}, "fast_gelu": {"float32": 7.4e7, "float16": 18.0},
    "silu": {"float32": 5.9e7, "float16": 24.0}, "swish": {"float32": 7.2e7, "float16": 38.0},
    "hardswish": {"float32": 4.2e6}, "sigmoid": {"float32": 6.8e7, "float16": 1.9}, "tanh": {"float32": 48.0},
    "softsign": {"float32": 1.9}, "mish": {"float32": 2.7e3},
}


def _ulps(op: str, dtype: str) -> str:
    v = RUNTIME_ULPS[op][dtype]
    if v < 1e3:
        return f"{v:g}"
    mant, exp = f"{v:.1e}".split("e")
    return f"{mant}e{int(exp)}"


RUNTIME_ERRORS = {
    "leaky_relu": "slope < 0: +0 instead of -0 at x = -0 (values exact)",
    "prelu": "weight < 0: +0 instead of -0 at x = -0 (values exact)",
    "elu": f"float32: {_ulps('elu', 'float32')} ulp near 0 (exp(x) - 1 cancels; absolute <= 6.2e-8 * alpha); "
           "float16 meets the contract; alpha < 0: +0 at x = +0",
    "selu": f"float32: {_ulps('selu', 'float32')} ulp near 0 (exp(x) - 1 cancels); +0 at x = -0 (float16 too, values "
            f"within {_ulps('selu', 'float16')} ulp)",
    "celu": f"float32: {_ulps('celu', 'float32')} ulp near 0; +0 at x = -0; float16 computes in float32 (within "
            f"{_ulps('celu', 'float16')} ulp)",
    "gelu": f"float32: {_ulps('gelu', 'float32')} ulp in the negative tail (erf form 1.7e7), absolute <= 7e-7; "
            f"float16: {_ulps('gelu', 'float16')} ulp (erf form 1.6) and NaN at -inf",
    "fast_gelu": f"x * Sigmoid(1.702 x): float32 {_ulps('fast_gelu', 'float32')} ulp in the negative tail (absolute "
                 f"1.5e-6); float16 {_ulps('fast_gelu', 'float16')} ulp, NaN at -inf",
    "silu": f"x * Sigmoid(x): float32 {_ulps('silu', 'float32')} ulp in the negative tail (absolute 3e-6); float16 "
            f"{_ulps('silu', 'float16')} ulp",
    "swish": f"x * Sigmoid(beta x): float32 up to {_ulps('swish', 'float32')} ulp in the tail; float16 up to "
             f"{_ulps('swish', 'float16')} ulp and NaN at an infinite x whose beta * x is -inf (both infinities for "
             "beta = 0)",
    "hardswish": f"float32: {_ulps('hardswish', 'float32')} ulp just above -3 (absolute 2.3e-7); float16: NaN at -inf",
    "sigmoid": f"float32: {_ulps('sigmoid', 'float32')} ulp below x = -3 (absolute 1.5e-7); float16: "
               f"{_ulps('sigmoid', 'float16')} ulp",
    "tanh": f"float32: {_ulps('tanh', 'float32')} ulp at +-1.2e-38 (the smallest normal), within 6 ulp elsewhere",
    "softsign": f"NaN at +-inf (values within {_ulps('softsign', 'float32')} ulp)",
    "mish": f"NaN at -inf; float32: {_ulps('mish', 'float32')} ulp below x = -87 (subnormal results)",
    "softshrink": "0 instead of NaN at NaN (values exact)",
    "hardshrink": "0 instead of NaN at NaN (values exact)",
    "tanhshrink": "x - Tanh(x) cancels near 0 in float32 (absolute 4.2e-7: no relative accuracy below |x| ~ 0.1); "
                  "float16 within 0.7 ulp",
    "threshold": "value = 0 (ThresholdedRelu): 0 instead of NaN at NaN; other values: the contract's composite",
}


def deviations() -> dict[str, str]:
    """Where and why an op's graph is not ONNX's own op (shown to users and in the docs)."""
    return dict(_DEVIATIONS)


def _dtype_name(dtype: Any, fn: str = "to_onnx()") -> str:
    """'float16', 'float32' or 'bfloat16' from a string, a NumPy dtype or a scalar type; ValueError otherwise."""
    if isinstance(dtype, str) and dtype == "bfloat16":
        return dtype
    try:
        name = np.dtype(dtype).name
    except TypeError:
        name = None
    if name not in (*DTYPES, "bfloat16") or isinstance(dtype, bool):
        raise ValueError(f"{fn}: dtype must be float16, float32 or bfloat16 (a name, a NumPy dtype or a scalar "
                         f"type), got {dtype!r}")
    return name


def _quant_opset(quant: Any, opset: Any, fn: str) -> tuple[int, Any]:
    """The opset of a quantized model (default 21, the least that has its QuantizeLinear) and the checked Quant."""
    opset = G.check_opset(OQ.QUANT_OPSET if opset is None else opset, fn)
    return opset, OQ.check(quant, opset, fn)


def bfloat16_model(model: Any) -> Any:
    """A float32 model with bfloat16 inputs and outputs: each float32 input Cast from bfloat16, each float32
    output Cast to bfloat16 (float64 outputs, the parameter gradients, stay float64)."""
    from onnx import TensorProto, helper

    g = model.graph
    f32, bf = TensorProto.FLOAT, TensorProto.BFLOAT16
    rename = {i.name: f"{i.name}_f32" for i in g.input if i.type.tensor_type.elem_type == f32}
    out_names = {o.name for o in g.output if o.type.tensor_type.elem_type == f32}
    nodes = [helper.make_node("Cast", [n], [m], to=f32) for n, m in rename.items()]
    for node in g.node:
        node.input[:] = [rename.get(n, n) for n in node.input]
        node.output[:] = [f"{n}_f32" if n in out_names else n for n in node.output]
    nodes += list(g.node)
    nodes += [helper.make_node("Cast", [f"{n}_f32"], [n], to=bf) for n in out_names]
    for v in (*g.input, *g.output):
        if v.name in rename or v.name in out_names:
            v.type.tensor_type.elem_type = bf
    del g.node[:]
    g.node.extend(nodes)
    g.doc_string = (g.doc_string.replace(", float32,", ", bfloat16 (the float32 graph between Casts),", 1)
                    if ", float32," in g.doc_string else g.doc_string + " (bfloat16: the float32 graph between Casts)")
    G.check(model)
    return model


def _input_shape(shape: Any, fn: str = "to_onnx()") -> list[int | str]:
    """The model's input shape: an int is a rank (every dim dynamic); in a sequence an int is a fixed dim,
    a str a symbolic one and None a dynamic one (named d<i>, so that every input and output share it)."""
    if isinstance(shape, bool):
        raise ValueError(f"{fn}: shape must be a rank or a sequence of ints, names and None, got {shape!r}")
    if isinstance(shape, int | np.integer):
        if shape < 0:
            raise ValueError(f"{fn}: shape as a rank must be >= 0, got {shape!r}")
        return [f"d{i}" for i in range(int(shape))]
    if isinstance(shape, str) or not hasattr(shape, "__iter__"):
        raise ValueError(f"{fn}: shape must be a rank or a sequence of ints, names and None, got {shape!r}")
    out: list[int | str] = []
    for i, d in enumerate(shape):
        if d is None:
            out.append(f"d{i}")
        elif isinstance(d, str) and d:
            out.append(d)
        elif isinstance(d, int | np.integer) and not isinstance(d, bool) and d >= 0:
            out.append(int(d))
        else:
            raise ValueError(f"{fn}: shape[{i}] must be an int >= 0, a name or None (dynamic), got {d!r}")
    return out


def to_onnx(op: str, *, dtype: Any = "float32", grad: bool | str = False, from_output: bool = False,
            shape: Any = None, accuracy: str = "auto", opset: int | None = None, param_inputs: tuple[str, ...] = (),
            quant: Any = None, **params: Any) -> Any:
    """Returns an `onnx.ModelProto` (opset 20 unless `opset=`, passed by onnx.checker; `onnx.save(model, path)`
    or `model.SerializeToString()` for a session) of op's forward, or with `grad=True` its backward.

    Inputs: forward `x`; backward `dy`, `x` (with `from_output=True`: `dy`, `y`, for the ops whose
    derivative is a function of the output); prelu adds `weight`.  Output `y` or `dx`, x's dtype and shape.

    dtype: float32 or float16, as a name, a NumPy dtype or a scalar type (np.float32); or "bfloat16"
      (ml_dtypes.bfloat16): the float32 graph with bfloat16 inputs Cast to float32 and float32 results Cast
      to bfloat16 (ONNX's Cast rounds to nearest even).  ONNX Runtime's CPU provider has no bfloat16
      arithmetic, so there is no bfloat16 graph of ORT's own operators; where the float32 graph computes in
      float64 (gelu's forward, tanhshrink, mish) its result is rounded to float32 and then to bfloat16, twice,
      so it can sit one bfloat16 ulp from multiact's where that float32 value is a bfloat16 tie.
    shape: the inputs' shape.  Default None: any rank (the inputs carry no shape; onnx.checker, which wants one
      on a graph's inputs, passes the model with an empty one).  An int is a rank with every dim dynamic, a
      sequence holds ints (fixed), names (symbolic, e.g. ["N", "C", 224, 224]) and None (dynamic).  prelu's
      `weight` input is 1-D, one element or x.shape[axis] (per channel along `axis`, default 1), broadcast
      along axis inside the graph (from the rank in the graph where the rank is not fixed).
    accuracy: which graph computes the forward.
      "auto" (default): ORT's own operator where its measured error meets multiact's contract (the Tolerance
      of `ma.ops()`, the conventions at NaN, +-inf, -0 and the kinks), per op, dtype and parameters: relu,
      relu6, hardtanh, leaky_relu with a slope >= +0, hardsigmoid, softplus with beta = 1, logsigmoid
      (-Softplus(-x)); float16 also elu and tanh.  Elsewhere the composite below; `deviations()` says why for
      each op.
      "contract": the composite always: primitive nodes in float32, in float64 only where float32 cannot meet
      the contract (gelu's forward, tanhshrink, mish).  Cost: each node is a pass over the tensor in ONNX
      Runtime, which does not fuse them, so a composite runs several times slower than a built-in operator
      (docs/performance.md's ONNX table, measured by benchmarks/onnx_export.py).
      "runtime": ORT's own operators regardless (Gelu, Sigmoid, Elu, Selu, Celu, HardSwish, Mish,
      Softsign, Shrink, PRelu, ...; silu/swish/fast_gelu as x * Sigmoid(k x)): the fastest graph, with the
      measured errors of `RUNTIME_ERRORS` (up to 7e7 ulp in float32 tails, NaN at some infinities).
      Backward graphs are the same composites in every mode (ONNX Runtime has no gradient kernels): float32,
      float64 where float32 cannot meet the contract (onnx_graphs.F64_BACKWARD).
    opset: the model's opset, 15 (the graphs' own operators) to the installed onnx's newest; default 20 (21 with
      quant=).  An ORT operator the opset lacks (Gelu below 20, Mish below 18) gives way to the composite, in every
      mode.
    quant: a multiact.Quant: the forward's float32 graph followed by QuantizeLinear (opset 21 and up; a lower
      opset= is refused), outputs `codes` (y's shape: float8e4m3fn, float8e5m2 or int8) and `scales` (float32:
      0-d per tensor, y.shape[:-1] + (1,) per token, y.shape[:-1] + (groups,) per group; MX: uint8 E8M0 bits of
      that shape, exponent + 127, 255 for NaN).  The values quantized are the float32 graph's result on the inputs
      widened to float32 (a float16 or bfloat16 model casts its inputs first), as multiact's quant= contract says;
      its codes and scales are the contract's bit for bit but for ONNX Runtime's NaN float8e5m2 code (0x7F, where
      ml_dtypes writes 0x7E); multiact.backend.onnx_quant says how.  int8 with a zero point (symmetric=False)
      adds a third output, `zero_points` (int32, the scales' shape).  The gated ops and bias_act take it too.
    param_inputs: float parameters taken as model inputs (0-d, dtype) instead of values, for the forward
      (a learned swish beta: `param_inputs=("beta",)`); the graph is then the composite.
    `grad="beta"` (swish) and `grad="weight"` (prelu) export the parameter gradient: inputs `dy`, `x`;
    output `dparam` in float64 (swish: the sum over all elements; prelu: one per channel), summed in float64.

    The gated ops (glu, swiglu, geglu, reglu, with their parameters: act and its parameters, activate,
    layout, dim, alpha, limit, approximate) take one input `x` with `ndim` dynamic dims (keyword
    `ndim`, default 2: (tokens, 2 * hidden)), split along `dim` inside the graph (halves or interleaved;
    an odd x.shape[dim] fails in the session), and give `y` (half of x along dim); `grad=True` takes `dy`
    (y's shape) and `x` and gives `dx` (x's shape, both halves).  They compute in float64 (the composite:
    accuracy "auto" or "contract").

    `to_onnx("bias_act", act=..., dim=1, gain=1.0, clamp=None, ndim=4, scale=False, **act_params)`: inputs
    `x`, `b` (x.shape[dim],) and with scale=True `scale`; grad=True takes `dy` first and gives `dx`, `db`
    (and `dscale`), summed in float64.
    """
    from ._opdefs import COMPOSITE_DEFINITIONS

    fn = "to_onnx()"
    dtype = _dtype_name(dtype, fn)
    if quant is not None:
        if grad is not False or from_output:
            raise ValueError(f"{fn}: quant= quantizes a forward's result; it takes no grad= or from_output= "
                             f"(got grad={grad!r}, from_output={from_output!r})")
        opset, q = _quant_opset(quant, opset, fn)
        base = to_onnx(op, dtype="float32", shape=shape, accuracy=accuracy, opset=opset, param_inputs=param_inputs,
                       **params)
        return OQ.quantized_model(base, q, dtype, opset=opset)
    opset = G.check_opset(OPSET if opset is None else opset, fn)
    if dtype == "bfloat16":
        return bfloat16_model(to_onnx(op, dtype="float32", grad=grad, from_output=from_output, shape=shape,
                                      accuracy=accuracy, opset=opset, param_inputs=param_inputs, **params))
    if accuracy not in ACCURACIES:
        raise ValueError(f"{fn}: accuracy must be one of {ACCURACIES}, got {accuracy!r}")
    composite = op == "bias_act" or (isinstance(op, str) and op in COMPOSITE_DEFINITIONS)
    if composite and (shape is not None or accuracy == "runtime" or param_inputs):
        raise ValueError(f"{fn}: {op} takes ndim= (its dims are all dynamic), accuracy='auto' or 'contract' "
                         f"(its graph is a composite) and no param_inputs, got shape={shape!r}, "
                         f"accuracy={accuracy!r}, param_inputs={param_inputs!r}")
    if op == "bias_act":
        return _bias_act_to_onnx(dtype, grad, from_output, params, opset)
    if composite:
        return _gated_to_onnx(COMPOSITE_DEFINITIONS[op], dtype, grad, from_output, params, opset)
    spec = _spec(op)
    param_inputs = tuple(param_inputs)
    floats = [q.name for q in spec.params if q.kind == "float"]
    bad = [n for n in param_inputs if n not in floats or n in params]
    if bad or (param_inputs and grad is not False):
        raise ValueError(f"{fn}: param_inputs names float parameters of {op} ({', '.join(floats) or 'none'}) given "
                         f"as model inputs instead of values (not also as keywords), for the forward only; got "
                         f"{param_inputs!r}{' with grad=' + repr(grad) if grad is not False else ''}")
    p = G.round_params(spec, params)
    param_grad = isinstance(grad, str)
    if param_grad and (spec.param_grad is None or spec.param_grad[0] != grad):
        have = f"{spec.param_grad[0]!r}" if spec.param_grad else "none"
        raise ValueError(f"{fn}: {op} has no gradient for parameter {grad!r} (it has: {have})")
    if grad not in (False, True) and not param_grad:
        raise ValueError(f"{fn}: grad must be False, True or a parameter's name, got {grad!r}")
    if from_output and (grad is not True or not spec.supports_y(p)):
        raise ValueError(f"{fn}: from_output=True needs grad=True and an op whose backward can use the output "
                         f"({spec.y_condition or 'not ' + op})")
    x_shape = None if shape is None else _input_shape(shape, fn)  # None: any rank
    ndim = None if x_shape is None else len(x_shape)
    axis = None
    if spec.defn.array_param:  # its weight per channel along axis
        axis = p.get("axis", 1)
        if ndim is not None:
            if ndim and not -ndim <= axis < ndim:
                raise ValueError(f"{fn}: {op}'s axis {axis} is out of range for x with {ndim} dims "
                                 f"(shape={shape!r})")
            axis = axis % ndim if ndim else None
    direction = "param_grad" if param_grad else ("backward_y" if from_output else "backward" if grad else "forward")
    return G.activation_model(spec, p, direction, dtype, x_shape, axis, accuracy, opset, param_inputs)


def from_onnx_node(node: Any, *inputs: Any) -> tuple[str | None, dict[str, Any]]:
    """(multiact op, its keywords) computing ONNX activation node `node` (an onnx NodeProto), given the
    node's inputs after x as arrays or None (PRelu's slope, Clip's min and max): the inverse of
    `to_onnx(..., accuracy="runtime")`.  ONNX's defaults where an attribute is absent (HardSigmoid alpha
    0.2, Softplus with no threshold, Clip at float32's range).  Clip with min > max maps to
    (None, {"min_val": min, "max_val": max}): ONNX's result is max everywhere, a constant hardtanh refuses.
    ValueError for a node multiact has no activation for.  PRelu maps to prelu(weight=slope, axis=-1): a 1-D
    slope is per channel along the last axis, NumPy's broadcasting of it; a slope of more dims broadcasts."""
    from onnx import helper

    t = node.op_type
    fn = "from_onnx_node()"
    candidates = [d for d in DEFS if d.onnx == t]
    if not candidates:
        raise ValueError(f"{fn}: {t} is not an activation multiact maps")
    given = {at.name: helper.get_attribute_value(at) for at in node.attribute}
    given.update({f"input{i}": v for i, v in enumerate(inputs, 1) if v is not None})
    values = {**_ONNX_DEFAULTS.get(t, {}), **given}
    values = {k: v.decode() if isinstance(v, bytes) else v for k, v in values.items()}
    matches, refusals = [], []
    for d in candidates:  # the op whose spelling (OpDef.onnx_attrs) reads every value of the node
        kinds = {q.name: q.kind for q in d.params}
        kw: dict[str, Any] = {}
        fixed, why = 0, None
        for a, v in d.onnx_attrs.items():
            if a not in values:  # an input without a default (PRelu's slope)
                raise ValueError(f"{fn}: {t} needs its {_ONNX_INPUTS[t][int(a[5:]) - 1]} array")
            got = values[a]
            if isinstance(v, str):  # the attribute carries parameter v
                got = np.asarray(got) if kinds[v] == "array" else got if kinds[v] == "choice" else float(
                    np.asarray(got))
                if v in kw and kw[v] != got:
                    why = (a, False, f"{v} {kw[v]}")
                kw.setdefault(v, got)
            else:
                fixed += 1
                if float(got) != v:
                    why = (a, True, f"{v:g}")
        if why is None and set(values) <= set(d.onnx_attrs):
            matches.append((fixed, d, {**kw, **d.onnx_fixed}))
        elif why is not None:
            refusals.append(why)
    if not matches and not refusals:
        raise ValueError(f"{fn}: {t} with these attributes is not an activation multiact maps")
    if not matches:
        attr = refusals[0][0]
        needs = [w for a, _, w in sorted(refusals, key=lambda r: not r[1]) if a == attr]  # values, then parameters
        raise ValueError(f"{fn}: {t} with {attr} {float(values[attr])} (neither {' nor '.join(needs)}) is not a "
                         "multiact activation")
    _, d, kw = max(matches, key=lambda m: m[0])  # the most specific spelling (Shrink with bias 0: hardshrink)
    if d.condition(kw) is not None:  # e.g. Clip with min > max: ONNX's result is max everywhere
        return None, kw
    return d.name, kw


# ONNX's defaults where a node leaves an attribute (or an optional input) out, per ONNX operator
_ONNX_DEFAULTS: dict[str, dict[str, Any]] = {
    "LeakyRelu": {"alpha": 0.01}, "Elu": {"alpha": 1.0}, "Celu": {"alpha": 1.0},
    # ONNX's Selu defaults are PyTorch's constants rounded to float32
    "Selu": {"alpha": 1.67326319217681884765625, "gamma": 1.05070102214813232421875},
    "Gelu": {"approximate": "none"}, "HardSigmoid": {"alpha": 0.2, "beta": 0.5}, "ThresholdedRelu": {"alpha": 1.0},
    "Shrink": {"lambd": 0.5, "bias": 0.0}, "Clip": {"input1": -F32_MAX, "input2": F32_MAX},
}
# The names ONNX gives a node's inputs after x, per ONNX operator
_ONNX_INPUTS: dict[str, tuple[str, ...]] = {"PRelu": ("slope",), "Clip": ("min", "max")}


# ---- the gated family (glu, swiglu, geglu, reglu): the activation's graph on the gate, times up ------

# ONNX has SwiGLU since opset 28 (Y = Swish_alpha(A) * B, two inputs of one shape).  ONNX Runtime 1.32's
# CPU provider cannot run it: a session expands the function into Swish (opset 24), which it has no
# kernel for ("NOT_IMPLEMENTED: Could not find an implementation for Swish(24)"), in float16, float32 and
# float64 alike (measured with onnx 1.23.2 / onnxruntime 1.32.0; tests/test_gated_onnx.py re-measures
# it).  So every gated graph is a composite at opset 20: the activation's own graph (multiact.backend.onnx_graphs,
# never restated here) on the clipped gate, times the clipped up, all in float64 and rounded once, which
# keeps the product within the activation's bound + 1 ulp (float16 and float32 results).
SWIGLU_NOTE = ("ONNX's SwiGLU (opset 28) does not run on ONNX Runtime 1.32 (no kernel for the Swish(24) it "
               "expands into); the gated graphs are the activation's graph times the other half")


def _gated_to_onnx(cdef: Any, dtype: str, grad: Any, from_output: bool, params: dict, opset: int = OPSET):
    """to_onnx() of a gated op: the one-input form, x of any rank split along dim in the graph."""
    from onnx import helper

    from . import gated

    fn = "to_onnx()"
    if dtype not in DTYPES:
        raise ValueError(f"{fn}: dtype must be one of {DTYPES}, got {dtype!r}")
    if grad not in (False, True) or from_output:
        raise ValueError(f"{fn}: {cdef.name} exports its forward or, with grad=True, dx from (dy, x); "
                         "it has no parameter gradient and no backward from the output")
    params = dict(params)
    ndim = params.pop("ndim", 2)
    if isinstance(ndim, bool) or not isinstance(ndim, int | np.integer) or ndim < 1:
        raise ValueError(f"{fn}: ndim (the rank of x) must be an int >= 1, got {ndim!r}")
    ndim = int(ndim)
    own = {k: v for k, v in params.items() if k in cdef.param_names}
    extra = {k: v for k, v in params.items() if k not in cdef.param_names}
    call = gated.resolve(cdef, own, extra, fn)
    if not -ndim <= call.dim < ndim:
        raise ValueError(f"{fn}: dim {call.dim} is out of range for x with {ndim} dims (ndim={ndim})")
    gated.check_precision(call, np.dtype(dtype), fn)
    p = G.gated_params(call.kp)
    act_key = FAMILY_KEYS[call.key][2]
    dim = call.dim
    axis = dim % ndim
    g = G.Graph(G.GATED_CT)
    elem = G.elem(dtype)
    # x as (..., 2, D/2, ...) (halves) or (..., D/2, 2, ...) (interleaved): a Reshape that fails in the
    # session for an odd D (Split or Slice would give unequal parts that Mul then broadcasts), then the
    # two parts by Gather on the pair axis
    pair_axis = axis if call.layout == "halves" else axis + 1
    half = g.op("Div", g.op("Shape", "x", start=axis, end=axis + 1), g.ints(2))
    parts = [g.op("Shape", "x", start=0, end=axis)] if axis else []
    parts += [g.ints(2), half] if call.layout == "halves" else [half, g.ints(2)]
    parts += [g.op("Shape", "x", start=axis + 1)] if axis + 1 < ndim else []
    paired = g.op("Reshape", g.op("Cast", "x", to=G.elem(G.GATED_CT)), g.op("Concat", *parts, axis=0))
    first, second = (g.op("Gather", paired, g.c(i, "int64"), axis=pair_axis) for i in (0, 1))
    gate, up = (first, second) if call.gate_first else (second, first)
    # every dim dynamic; the split axis is "D" in x and "H" (its half) in y
    x_shape = [("D" if i == axis else f"d{i}") for i in range(ndim)]
    y_shape = [("H" if i == axis else f"d{i}") for i in range(ndim)]
    inputs = ([helper.make_tensor_value_info("dy", elem, y_shape)] if grad else []) + [
        helper.make_tensor_value_info("x", elem, x_shape)]
    if grad:  # both halves of dx: stacked on the pair axis, then x's shape
        dgate, dup = G.gated_backward(g, act_key, p, g.op("Cast", "dy", to=G.elem(G.GATED_CT)), gate, up)
        dfirst, dsecond = (dgate, dup) if call.gate_first else (dup, dgate)
        pa = g.ints(pair_axis)
        pair = g.op("Concat", g.op("Unsqueeze", dfirst, pa), g.op("Unsqueeze", dsecond, pa), axis=pair_axis)
        outputs = [(g.op("Reshape", pair, g.op("Shape", "x")), "dx", x_shape)]
    else:
        outputs = [(G.gated_forward(g, act_key, p, gate, up), "y", y_shape)]
    what = "backward" if grad else "forward"
    settings = ", ".join(f"{k}={v!r}" for k, v in {**own, **extra, "ndim": ndim}.items())
    return G.gated_model(g, f"multiact_{cdef.name}_{what}", dtype, inputs, outputs,
                        f"multiact {cdef.name}({settings}) [{call.key}, {p}] {what}, {dtype}; x split along dim "
                        f"{dim} ({call.layout}); {SWIGLU_NOTE}", opset)


# ---- bias_act: the activation's graph on z = x * scale + b (multiact.backend.onnx_graphs), b (and scale) along dim


def bias_act_model(*, dtype: str, ndim: int, forms: tuple[str | None, str | None], opset: int | None = None,
                   quant: Any = None, **params: Any) -> Any:
    """The forward model of bias_act on x of rank ndim with b and scale in `forms` (each "c": one value per
    channel along dim, "f": x's shape, None: absent); dtype float16, float32 or bfloat16.  quant= (a multiact.Quant,
    opset 21 and up): outputs `codes` and `scales` of the float32 result instead of `y` (as to_onnx's quant=)."""
    fn = "bias_act_model()"
    dtype = _dtype_name(dtype, fn)
    if quant is not None:
        opset, q = _quant_opset(quant, opset, fn)
        base = bias_act_model(dtype="float32", ndim=ndim, forms=forms, opset=opset, **params)
        return OQ.quantized_model(base, q, dtype, opset=opset)
    opset = G.check_opset(OPSET if opset is None else opset, fn)
    if dtype == "bfloat16":
        return bfloat16_model(bias_act_model(dtype="float32", ndim=ndim, forms=forms, opset=opset, **params))
    return _bias_act_to_onnx(dtype, False, False, {**params, "ndim": ndim}, opset, forms)


def _bias_act_to_onnx(dtype: str, grad: Any, from_output: bool, params: dict, opset: int = OPSET,
                      forms: tuple[str | None, str | None] | None = None):
    """to_onnx("bias_act", act=..., dim=..., gain=..., clamp=..., ndim=..., scale=False, **act_params): inputs
    `x` (ndim dynamic dims), `b` (x.shape[dim],) and with scale=True `scale` (the same); output `y`.  With
    grad=True: inputs `dy`, `x`, `b`[, `scale`]; outputs `dx`, `db` (summed over every axis but dim, in float64,
    then x's dtype)[, `dscale`].  forms (b's, scale's): "c" one value per channel along dim, "f" x's shape, None
    absent (the graph has no such input); default ("c", "c" with scale=True, else None)."""
    from onnx import helper

    from . import fused_bias_act as B

    fn = "to_onnx()"
    if dtype not in DTYPES:
        raise ValueError(f"{fn}: dtype must be one of {DTYPES}, got {dtype!r}")
    if grad not in (False, True) or from_output:
        raise ValueError(f"{fn}: bias_act exports its forward or, with grad=True, (dx, db[, dscale]) from (dy, x, "
                         "b[, scale]); it has no parameter gradient and no backward from the output")
    params = dict(params)
    ndim = params.pop("ndim", 4)
    with_scale = params.pop("scale", False)
    if isinstance(ndim, bool) or not isinstance(ndim, int | np.integer) or ndim < 1:
        raise ValueError(f"{fn}: ndim (the rank of x) must be an int >= 1, got {ndim!r}")
    if not isinstance(with_scale, bool):
        raise ValueError(f"{fn}: scale must be True or False (whether the model takes a scale input), "
                         f"got {with_scale!r}")
    b_form, s_form = forms if forms is not None else ("c", "c" if with_scale else None)
    ndim = int(ndim)
    own = {k: v for k, v in params.items() if k in B.DEFN.param_names}
    extra = {k: v for k, v in params.items() if k not in B.DEFN.param_names}
    call = B.resolve(own, extra, fn)
    if not -ndim <= call.dim < ndim:
        raise ValueError(f"{fn}: dim {call.dim} is out of range for x with {ndim} dims (ndim={ndim})")
    B.check_precision(call, np.dtype(dtype), fn)
    axis = call.dim % ndim
    p = G.bias_act_params(call.act_p, call.kp["gain"], call.kp["clamp"])
    act_key = BIAS_ACT_KEYS[call.key][2]
    g = G.Graph(G.BIAS_CT)
    elem, f64 = G.elem(dtype), G.elem(G.BIAS_CT)
    x_shape = [("C" if i == axis else f"d{i}") for i in range(ndim)]
    sides = {n: f for n, f in (("b", b_form), ("scale", s_form)) if f is not None}
    names = (["dy"] if grad else []) + ["x"]
    inputs = [helper.make_tensor_value_info(n, elem, x_shape) for n in names]
    inputs += [helper.make_tensor_value_info(n, elem, ["C"] if f == "c" else x_shape) for n, f in sides.items()]
    tail = tuple(range(1, ndim - axis))  # (C,) -> (C, 1, ..., 1): broadcast along dim

    def along(v: str, form: str) -> str:
        return g.op("Unsqueeze", v, g.ints(*tail)) if tail and form == "c" else v

    v32 = {n: G.to32(g, n, dtype) for n in ("x", *sides)}
    b32 = along(v32["b"], b_form) if "b" in sides else None
    s32 = along(v32["scale"], s_form) if "scale" in sides else None
    z = G.bias_act_z(g, v32["x"], b32, s32)
    if grad:
        dz = G.bias_act_dz(g, act_key, p, g.op("Cast", "dy", to=f64), z)
        s64 = None if s32 is None else g.op("Cast", s32, to=f64)
        outputs = [(dz if s64 is None else g.mul(dz, s64), "dx", x_shape, elem)]
        others = [i for i in range(ndim) if i != axis]

        def total(v: str, form: str) -> str:  # per channel; 1-D x: one channel per element, nothing to sum
            return g.op("ReduceSum", v, g.ints(*others), keepdims=0) if others and form == "c" else v

        if "b" in sides:
            outputs.append((total(dz, b_form), "db", ["C"] if b_form == "c" else x_shape, elem))
        if "scale" in sides:
            outputs.append((total(g.mul(dz, g.op("Cast", "x", to=f64)), s_form), "dscale",
                            ["C"] if s_form == "c" else x_shape, elem))
    else:
        outputs = [(G.bias_act_forward(g, act_key, p, z), "y", x_shape, elem)]
    what = "backward" if grad else "forward"
    settings = ", ".join(f"{k}={v!r}" for k, v in {**own, **extra, "ndim": ndim, "scale": with_scale}.items())
    return G.bias_model(g, f"multiact_bias_act_{what}", inputs, outputs,
                        f"multiact bias_act({settings}) [{call.key}, {p}] {what}, {dtype}; b (and scale) along dim "
                        f"{call.dim}", opset)
