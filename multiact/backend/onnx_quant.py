"""Quantized outputs in ONNX: an activation's float32 graph followed by QuantizeLinear (opset 21), the contract of
multiact.quant where ONNX Runtime computes it.

`quantized_model(model, quant, dtype)` takes a forward model whose output `y` is float32 (to_onnx's, the gated and
bias_act graphs, the backends' kernels), casts its float inputs from `dtype` (float16 and bfloat16 widen exactly, as
the contract's values are the float32 result on inputs widened to float32) and replaces `y` by `codes` and `scales`:

- tensor: one scale; static (`Quant(scale=)`: an initializer) or dynamic, amax = ReduceMax(Abs(y)).
- token: y as (rows, last axis), amax per row, QuantizeLinear per axis 0; scales x.shape[:-1] + (1,).
- group (32/64/128) and mx (32): amax per group by Reshape and ReduceMax, then blocked QuantizeLinear (block_size,
  axis = the last); scales x.shape[:-1] + (groups,).
- scales as the contract makes them: amax capped by scale_ub and raised to amax_floor, divided by qmax (Div: the
  float32 quotient), 2^-149 where that underflows to 0, 1 for an all-zero group, and pow2 / MX's powers of two from
  an exact floor(log2): Floor(Log(a) / ln 2) in float64, corrected by comparing with Pow(2, e) (ONNX has no Log2
  nor a bit cast; Pow(2, e) is exact for every exponent, measured).  MX scales are E8M0 bits as uint8 (exponent +
  127, 255 for NaN), the float8_e8m0fnu bytes.
- specials: ONNX Runtime's ReduceMax skips a NaN after the first element (std::max), so a group's NaN is found by
  ReduceSum(|y|) (a sum of non-negative values is NaN only from a NaN) and its scale made NaN.  QuantizeLinear
  divides (x / y_scale, bit for bit the float32 quotient, measured over every case of the tests) and, with
  saturate=1, gives float8 codes exactly as the contract: RNE, +-inf and beyond qmax to +-qmax, NaN to NaN.  Its
  int8 codes saturate to [-128, 127] and give -128 for a NaN quotient; the contract's are symmetric and 0 there,
  so the graph raises -128 to -127 (Max on the codes: a quotient passes -127.5 with a static scale, scale_ub, or a
  subnormal scale, whose rounding is coarse), sets the codes of a group whose scale is NaN or inf to 0 (Where on
  the int8 codes, per group) and, with a static scale, reads a NaN value as 0.  With these, the codes and
  scales are the contract's bit for bit (tests/test_onnx_quant.py, every bfloat16 input per op) but for one
  thing ONNX Runtime decides: a NaN float8e5m2 code is 0x7F / 0xFF where ml_dtypes writes 0x7E / 0xFE (both
  NaN; the backends rewrite it on the host, an exported model keeps ORT's).

int8 with a zero point (symmetric=False, vLLM's azp form): per group ReduceMin / ReduceMax (their NaN found as above),
the contract's scale and zero point (Round is to nearest even, as np.rint), QuantizeLinear with the int8 zero point
per group, and the codes of a NaN quotient set to 0; a third output, `zero_points` (int32).  `onnx` is imported
lazily.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from multiact import quant as Q

from .onnx_graphs import Graph, elem, make_model

QUANT_OPSET = 21  # QuantizeLinear with float8 outputs, output_dtype and blocked scales (block_size)
_LN2 = math.log(2.0)


def check(q: Any, opset: int, fn: str) -> Q.Quant:
    """quant as a Quant that these graphs build at `opset`; TypeError / ValueError naming fn otherwise."""
    q = Q.check(fn, q)
    if opset < QUANT_OPSET:
        raise ValueError(f"{fn}: quant= needs opset >= {QUANT_OPSET} (QuantizeLinear with float8 outputs, "
                         f"output_dtype and blocked scales), got opset={opset}")
    return q


def supported(q: Q.Quant) -> bool:
    """Whether the graphs build `q` (the backends fall back to the two passes otherwise): every Quant."""
    return isinstance(q, Q.Quant)


def _code_elem(q: Q.Quant) -> int:
    from onnx import TensorProto

    return {"float8_e4m3fn": TensorProto.FLOAT8E4M3FN, "float8_e5m2": TensorProto.FLOAT8E5M2,
            "int8": TensorProto.INT8}[q.dtype]


# ---- the exponent of a power of two ---------------------------------------------------------------------


def _floor_log2(g: Graph, a64: str) -> tuple[str, str]:
    """(e, 2^e) in float64 with 2^e <= a < 2^(e+1), exact for every positive finite float32 a (given as
    float64): Floor(Log(a) / ln 2) is within one of e, and the comparisons with Pow(2, e) correct it."""
    e0 = g.op("Floor", g.op("Div", g.op("Log", a64), g.c(_LN2, "float64")))
    p0 = g.op("Pow", g.c(2.0, "float64"), e0)
    down = g.op("Cast", g.op("Greater", p0, a64), to=elem("float64"))
    up = g.op("Cast", g.op("LessOrEqual", g.op("Mul", p0, g.c(2.0, "float64")), a64), to=elem("float64"))
    e = g.op("Add", g.op("Sub", e0, down), up)
    return e, g.op("Pow", g.c(2.0, "float64"), e)


def _pow2_up(g: Graph, s: str) -> str:
    """float32 scales rounded up to a power of two where positive and finite (others as they are)."""
    s64 = g.op("Cast", s, to=elem("float64"))
    _, p = _floor_log2(g, s64)
    up = g.op("Where", g.op("Equal", p, s64), p, g.op("Mul", p, g.c(2.0, "float64")))
    ok = g.op("And", g.op("Greater", s, g.c(0.0)), g.op("Less", s, g.c(math.inf)))
    return g.op("Where", ok, g.op("Cast", up, to=elem("float32")), s)


# ---- amax and scales ------------------------------------------------------------------------------------


def _amax(g: Graph, a: str, axes: tuple[int, ...] | None) -> str:
    """max |v| over `axes` (None: all) in float32, NaN where the group holds one."""
    args = (a,) if axes is None else (a, g.ints(*axes))
    m = g.op("ReduceMax", *args, keepdims=0)
    total = g.op("ReduceSum", *args, keepdims=0)  # NaN exactly where a NaN is (|v| >= 0: no inf - inf)
    return g.op("Where", g.op("IsNaN", total), g.c(math.nan), m)


def _scales(g: Graph, q: Q.Quant, amax: str) -> str:
    """The contract's float32 scales from amax (quant._scales)."""
    a = amax
    if q.scale_ub is not None:
        a = g.where(g.gt(a, float(np.float32(q.scale_ub))), float(np.float32(q.scale_ub)), a)
    if q.amax_floor is not None:
        a = g.where(g.lt(a, float(np.float32(q.amax_floor))), float(np.float32(q.amax_floor)), a)
    s = g.div(a, q.qmax)
    s = g.where(g.eq(s, 0.0), float(Q.TINY), s)
    s = g.where(g.eq(a, 0.0), 1.0, s)
    return _pow2_up(g, s) if q.pow2 else s


def _e8m0(g: Graph, q: Q.Quant, amax: str) -> tuple[str, str]:
    """(E8M0 bits as uint8, the float32 scale 2^e or NaN) per block (quant._e8m0)."""
    from onnx import TensorProto

    f64 = elem("float64")
    if q.rule == "ceil":
        r = g.div(amax, q.qmax)  # float32, as the contract rounds it
        r64 = g.op("Cast", r, to=f64)
        e, p = _floor_log2(g, r64)
        e = g.op("Add", e, g.op("Cast", g.op("Less", p, r64), to=f64))  # ceil: one more unless r is 2^e
        e = g.op("Where", g.op("Equal", r64, g.c(0.0, "float64")), g.c(-127.0, "float64"), e)
    else:
        e, _ = _floor_log2(g, g.op("Cast", amax, to=f64))
        e = g.op("Sub", e, g.c(float(Q.EMAX[q.dtype]), "float64"))
    e = g.op("Clip", e, g.c(-127.0, "float64"), g.c(127.0, "float64"))
    e = g.op("Where", g.op("Equal", amax, g.c(0.0)), g.c(0.0, "float64"), e)  # an all-zero block: scale 1
    finite = g.op("Less", amax, g.c(math.inf))  # NaN and inf: E8M0's NaN
    bits = g.op("Where", finite, g.op("Add", e, g.c(127.0, "float64")), g.c(255.0, "float64"))
    scale = g.op("Where", finite, g.op("Cast", g.op("Pow", g.c(2.0, "float64"), e), to=elem("float32")),
                 g.c(math.nan))
    return g.op("Cast", bits, to=TensorProto.UINT8), scale


# ---- the quantization of a float32 value ----------------------------------------------------------------


def _linear(g: Graph, q: Q.Quant, v: str, s: str, static: bool, block: int | None = None, **attrs: Any) -> str:
    """QuantizeLinear(v, s) with the contract's int8 conventions (see the module's docstring); `block`: the
    group's length where s has one scale per block of v's last axis (blocked), else s is one per tensor or row."""
    if q.dtype == "int8" and static:  # NaN to 0 (ORT gives -128); +-inf saturate as they should
        v = g.op("Where", g.op("IsNaN", v), g.c(0.0), v)
    if q.dtype != "int8":
        attrs["saturate"] = 1
    if block is not None:
        attrs.update(axis=1, block_size=block)
    codes = g.op("QuantizeLinear", v, s, output_dtype=_code_elem(q), **attrs)
    if q.dtype != "int8":
        return codes
    # a quotient below -127.5 (a static scale, scale_ub, a subnormal scale's coarse rounding) saturates to -128
    codes = g.op("Max", codes, g.c(-127, "int8"))
    if static:
        return codes
    # a NaN or infinite scale: every code of its group is 0 (v / NaN, inf / inf: NaN, which ORT makes -128;
    # finite / inf: 0), set per group on the int8 codes
    bad = g.op("Not", g.op("Less", s, g.c(math.inf)))
    zero = g.c(0, "int8")
    if block is None:
        cond = bad if "axis" not in attrs else g.op("Unsqueeze", bad, g.ints(1))
        return g.op("Where", cond, zero, codes)
    grouped = g.op("Reshape", codes, g.ints(0, -1, block))
    fixed = g.op("Where", g.op("Unsqueeze", bad, g.ints(2)), zero, grouped)
    return g.op("Reshape", fixed, g.op("Shape", v))


def _azp(g: Graph, q: Q.Quant, v: str, v2: str | None) -> tuple[str, str, str]:
    """int8 with a zero point (quant._azp): per group lo and hi (NaN where the group holds one), s = (hi - lo) / 255
    (2^-149 where that underflows, 1 where hi == lo), zp = Round(-128 - lo / s) clipped (0 for NaN), then
    QuantizeLinear with the int8 zero point per group (per axis 0 on v as (groups, group length)); a NaN quotient
    (v NaN, s NaN, inf / inf) gives -128 in ORT and 0 in the contract: found by IsNaN(v / s) and set to 0.
    (codes, scales, zero points as int32) in build's shapes."""
    from onnx import TensorProto

    if v2 is None:  # tensor: one group
        vf, last = g.op("Reshape", v, g.ints(1, -1)), None
    elif q.granularity == "token":
        vf, last = v2, None
    else:
        vf, last = g.op("Reshape", v2, g.ints(-1, q.block)), q.block
    one = g.ints(1)
    lo = g.op("ReduceMin", vf, one, keepdims=0)
    hi = g.op("ReduceMax", vf, one, keepdims=0)
    nan = g.op("IsNaN", g.op("ReduceSum", g.op("Abs", vf), one, keepdims=0))  # ReduceMin/Max skip NaN in ORT
    lo, hi = (g.op("Where", nan, g.c(math.nan), t) for t in (lo, hi))
    sc = g.div(g.sub(hi, lo), 255.0)
    sc = g.where(g.eq(sc, 0.0), float(Q.TINY), sc)
    sc = g.op("Where", g.op("Equal", hi, lo), g.c(1.0), sc)
    zp = g.op("Round", g.sub(-128.0, g.op("Div", lo, sc)))
    zp = g.op("Where", g.op("IsNaN", zp), g.c(0.0), g.op("Clip", zp, g.c(-128.0), g.c(127.0)))
    codes = g.op("QuantizeLinear", vf, sc, g.op("Cast", zp, to=TensorProto.INT8), axis=0)
    quotient_nan = g.op("IsNaN", g.op("Div", vf, g.op("Unsqueeze", sc, one)))
    codes = g.op("Where", quotient_nan, g.c(0, "int8"), codes)
    zp = g.op("Cast", zp, to=TensorProto.INT32)
    if v2 is None:
        scalar = g.ints()
        return (g.op("Reshape", codes, g.op("Shape", v)), g.op("Reshape", sc, scalar),
                g.op("Reshape", zp, scalar))
    if last is None:
        return codes, sc, zp
    rows = g.op("Concat", g.op("Shape", v2, end=1), g.ints(-1), axis=0)
    return g.op("Reshape", codes, g.op("Shape", v2)), g.op("Reshape", sc, rows), g.op("Reshape", zp, rows)


def build(g: Graph, q: Q.Quant, v: str, rows_n: str | None = None) -> tuple[str, ...]:
    """(codes, scales[, zero points]) of float32 value v (any shape) in graph g.  tensor: codes of v's shape, a 0-d
    scale.  Otherwise v as (rows, n) (Reshape to `rows_n`, an int64 [2] value, or to (-1, v's last dim) where None):
    codes (rows, n), scales (rows,) for token and (rows, n / block) for group and mx (uint8 E8M0 bits for mx); int8
    with a zero point adds its int32 zero points, shaped as the scales."""
    if not q.symmetric:
        if q.granularity == "tensor":
            return _azp(g, q, v, None)
        shape2 = rows_n if rows_n is not None else g.op("Concat", g.ints(-1), g.op("Shape", v, start=-1), axis=0)
        return _azp(g, q, v, g.op("Reshape", v, shape2))
    if q.granularity == "tensor":
        if q.scale is not None:
            s = g.c(float(np.float32(q.scale)))
            return _linear(g, q, v, s, True), g.op("Identity", s)
        s = _scales(g, q, _amax(g, g.op("Abs", v), None))
        return _linear(g, q, v, s, False), s
    shape2 = rows_n if rows_n is not None else g.op("Concat", g.ints(-1), g.op("Shape", v, start=-1), axis=0)
    v2 = g.op("Reshape", v, shape2)
    a = g.op("Abs", v2)
    if q.granularity == "token":
        s = _scales(g, q, _amax(g, a, (1,)))
        return _linear(g, q, v2, s, False, axis=0), s
    block = q.block
    amax = _amax(g, g.op("Reshape", a, g.ints(0, -1, block)), (2,))
    if q.granularity == "mx":
        bits, s = _e8m0(g, q, amax)
        return _linear(g, q, v2, s, False, block), bits
    s = _scales(g, q, amax)
    return _linear(g, q, v2, s, False, block), s


# ---- models ---------------------------------------------------------------------------------------------


def _rename(nodes: list, inits: list, keep: set[str], prefix: str) -> None:
    """Prefix every value name the quantization's nodes and constants make (but `keep`), so that they cannot
    meet the activation graph's own names."""
    made = {i.name for i in inits} | {o for n in nodes for o in n.output}
    made -= keep

    def r(name: str) -> str:
        return prefix + name if name in made else name

    for i in inits:
        i.name = r(i.name)
    for n in nodes:
        n.input[:] = [r(x) for x in n.input]
        n.output[:] = [r(x) for x in n.output]


def quantized_model(model: Any, q: Q.Quant, dtype: str, *, fixed_rows: bool = False, opset: int = QUANT_OPSET,
                    doc: str = "") -> Any:
    """model (output `y`, float32) with its float32 inputs read as `dtype` (cast to float32 in the graph) and `y`
    replaced by `codes` (y's shape and q's code type) and `scales` (float32, or uint8 E8M0 bits for mx).  Scales
    have the contract's shape: () for tensor, y.shape[:-1] + (1,) for token, y.shape[:-1] + (groups,) otherwise.
    fixed_rows=True (the backends' kernels): an int64 input `qshape` [rows, n] that y is quantized as, and codes
    (rows, n), scales (rows,) or (rows, groups) (the caller reshapes them)."""
    from onnx import TensorProto, helper

    src = model.graph
    f32 = TensorProto.FLOAT
    outs = [o for o in src.output]
    if [o.name for o in outs] != ["y"] or outs[0].type.tensor_type.elem_type != f32:
        raise ValueError("quantized_model(): the model must have one float32 output, y")
    g = Graph("float32")
    rows_n = "qshape" if fixed_rows and q.granularity != "tensor" else None
    codes, *per_group = build(g, q, "y", rows_n)
    if rows_n is None and q.granularity != "tensor":  # back to y's shape, scales along its last axis
        codes = g.op("Reshape", codes, g.op("Shape", "y"))
        last = g.ints(1) if q.granularity == "token" else g.ints(-1)
        shape = g.op("Concat", g.op("Shape", "y", end=-1), last, axis=0)
        per_group = [g.op("Reshape", t, shape) for t in per_group]
    names = ["codes", "scales", "zero_points"][: 1 + len(per_group)]
    for value, name in zip([codes, *per_group], names, strict=True):
        g.nodes.append(helper.make_node("Identity", [value], [name]))
    _rename(g.nodes, g.inits, {"y", "qshape", *names}, "q_")
    el = elem(dtype) if dtype != "bfloat16" else TensorProto.BFLOAT16
    casts, inputs, renamed = [], [], {}
    for i in src.input:
        i2 = helper.ValueInfoProto()
        i2.CopyFrom(i)
        if dtype != "float32" and i.type.tensor_type.elem_type == f32:
            renamed[i.name] = f"{i.name}_f32"
            casts.append(helper.make_node("Cast", [i.name], [renamed[i.name]], to=f32))
            i2.type.tensor_type.elem_type = el
        inputs.append(i2)
    body = []
    for n in src.node:
        n2 = helper.NodeProto()
        n2.CopyFrom(n)
        n2.input[:] = [renamed.get(x, x) for x in n2.input]
        body.append(n2)
    if rows_n is not None:
        inputs.append(helper.make_tensor_value_info("qshape", TensorProto.INT64, [2]))
    y_shape = _dims(outs[0])
    if fixed_rows:
        code_shape: list | None = None if q.granularity == "tensor" and y_shape is None else (
            y_shape if q.granularity == "tensor" else ["rows", "n"])
        scale_shape: list | None = [] if q.granularity == "tensor" else (
            ["rows"] if q.granularity == "token" else ["rows", "groups"])
    else:
        code_shape = y_shape
        scale_shape = [] if q.granularity == "tensor" else None
    s_elem = TensorProto.UINT8 if q.granularity == "mx" else f32
    outputs = [helper.make_tensor_value_info("codes", _code_elem(q), code_shape),
               helper.make_tensor_value_info("scales", s_elem, scale_shape)]
    if not q.symmetric:
        outputs.append(helper.make_tensor_value_info("zero_points", TensorProto.INT32, scale_shape))
    graph = helper.make_graph(casts + body + g.nodes, src.name + "_quantized", inputs, outputs,
                              list(src.initializer) + g.inits,
                              doc_string=f"{src.doc_string}; quantized: {describe(q)}{doc}")
    return make_model(graph, max(opset, QUANT_OPSET))


def _dims(v: Any) -> list | None:
    """A value's dims as make_tensor_value_info takes them (None: no shape)."""
    t = v.type.tensor_type
    if not t.HasField("shape"):
        return None
    return [d.dim_param if d.HasField("dim_param") else (d.dim_value if d.HasField("dim_value") else None)
            for d in t.shape.dim]


def describe(q: Q.Quant) -> str:
    """The Quant in a model's doc string."""
    fields = {k: v for k, v in vars(q).items() if v is not None and not (k == "rule" and q.granularity != "mx")
              and not (k in ("symmetric",) and v) and not (k == "pow2" and not v)}
    return "Quant(" + ", ".join(f"{k}={v!r}" for k, v in fields.items()) + ")"
