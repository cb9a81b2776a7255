"""Quantizing activations in ONNX Runtime: ma.to_onnx(op, quant=Q)'s graph against ORT's own composition and
against ma.<op>(x, quant=Q) (native), float32 at --n elements, one thread.

    python benchmarks/onnx_quant.py [--n 16777216] [--cols 4096] [--reps 5] [--ops relu,gelu,silu,swiglu] [--out F]
    python benchmarks/onnx_quant.py --contract [--out F]    # codes that differ from the contract, per op

Per op and Quant (x of shape (n / cols, cols); swiglu's x is that, its result half of it):
- export:   ma.to_onnx(op, quant=Q): the contract's float graph (accuracy="auto") and the contract's quantization
            (NaN found by ReduceSum(|y|), 2^-149 floor, all-zero groups, int8's fixes);
- runtime:  ma.to_onnx(op, quant=Q, accuracy="runtime"): ORT's own activation operator, the same quantization
            (what the contract's quantization costs over the plain composition below);
- ort:      ORT's own composition: the activation's ORT operators (ma.to_onnx(act, accuracy="runtime"): Relu,
            Gelu, x * Sigmoid(x); a gated op: Split, that on the gate, times up), then Abs, ReduceMax, Div by qmax
            and QuantizeLinear (per axis for tokens,
            blocked for groups), with no special cases (a NaN after a group's first element is missed, an all-zero
            group divides by 0, no MX);
- native:   ma.<op>(x, quant=Q) on the native backend (the call core's path: its results allocated per call).
ORT sessions run with io_binding into preallocated outputs.  Implementations alternate within each repetition;
times are medians (ms), spread = IQR / median of the export graph.  Ratios: export / ort, runtime / ort,
export / native.
"""

from __future__ import annotations

import argparse
import datetime
import os
import subprocess
import sys
import time

import numpy as np

QUANTS = {
    "e4m3 tensor": ("float8_e4m3fn", "tensor", None),
    "e4m3 token": ("float8_e4m3fn", "token", None),
    "e4m3 group128": ("float8_e4m3fn", "group", 128),
    "int8 token": ("int8", "token", None),
    "e4m3 mx": ("float8_e4m3fn", "mx", None),
}


def _session(model, threads: int):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _bound(sess, x: np.ndarray, q, y_shape: tuple) -> callable:
    """A call of sess on x into preallocated codes and scales (their shapes from the Quant)."""
    import onnxruntime as ort
    from onnx import TensorProto

    rows, n = y_shape
    codes = np.empty(y_shape, np.int8 if q.dtype == "int8" else np.uint8)
    shape = {"tensor": (), "token": (rows, 1), "group": (rows, n // (q.block or 1)), "mx": (rows, n // 32)}
    scales = np.empty(shape[q.granularity], np.uint8 if q.granularity == "mx" else np.float32)
    b = sess.io_binding()
    b.bind_ortvalue_input("x", ort.OrtValue.ortvalue_from_numpy(x))
    kind = {"float8_e4m3fn": TensorProto.FLOAT8E4M3FN, "int8": TensorProto.INT8}[q.dtype]
    b.bind_ortvalue_output("codes", ort.OrtValue.ortvalue_from_numpy_with_onnx_type(codes, kind))
    b.bind_ortvalue_output("scales", ort.OrtValue.ortvalue_from_numpy(scales))
    return lambda: sess.run_with_iobinding(b)


def _act_of(op: str) -> tuple[str, bool]:
    """(the activation an op computes, whether the op is gated: its activation on the first half of x times the
    second), from the op's definition."""
    from multiact import gated
    from multiact._opdefs import COMPOSITE_DEFINITIONS
    from multiact.optable import FAMILY_KEYS, KEYS

    if op not in COMPOSITE_DEFINITIONS:
        return op, False
    cdef = COMPOSITE_DEFINITIONS[op]
    call = gated.resolve(cdef, {}, {}, f"{op}()")
    if call.layout != "halves" or not call.gate_first:
        raise ValueError(f"onnx_quant.py times gated ops that gate the first half, not {op}")
    return KEYS[FAMILY_KEYS[call.key][2]].name, True


def composition(op: str, q, opset: int = 21):
    """ORT's own composition (see the module's docstring): input x (rows, cols), outputs codes and scales.  The
    activation is ma.to_onnx(act, accuracy="runtime")'s graph (ORT's own operators: Relu, Gelu, x * Sigmoid(x));
    a gated op runs it on the first half of x (Split) and multiplies by the second."""
    from onnx import TensorProto, helper, numpy_helper

    import multiact as ma

    act, gated = _act_of(op)
    act_model = ma.to_onnx(act, accuracy="runtime", shape=2, opset=opset)
    src = "gate" if gated else "x"
    rename = {"x": src, "y": "act" if gated else "y"}
    nodes, inits = [], [numpy_helper.from_array(numpy_helper.to_array(i), f"a_{i.name}")
                        for i in act_model.graph.initializer]
    made = {o for n in act_model.graph.node for o in n.output} | {i.name for i in act_model.graph.initializer}
    if gated:
        nodes.append(helper.make_node("Split", ["x"], ["gate", "up"], axis=-1, num_outputs=2))
    for n in act_model.graph.node:
        n2 = helper.make_node(n.op_type, [rename.get(v, f"a_{v}" if v in made else v) for v in n.input],
                              [rename.get(v, f"a_{v}") for v in n.output])
        n2.attribute.extend(n.attribute)
        nodes.append(n2)

    def c(name: str, v: np.ndarray) -> str:
        inits.append(numpy_helper.from_array(v, name))
        return name

    def node(op_type: str, ins: list, out: str, **kw) -> str:
        nodes.append(helper.make_node(op_type, ins, [out], **kw))
        return out

    y = node("Mul", ["act", "up"], "y") if gated else "y"
    a = node("Abs", [y], "a")
    qmax = c("qmax", np.array(q.qmax, np.float32))
    kind = {"float8_e4m3fn": TensorProto.FLOAT8E4M3FN, "int8": TensorProto.INT8}[q.dtype]
    attrs = {"output_dtype": kind, **({} if q.dtype == "int8" else {"saturate": 1})}
    if q.granularity == "tensor":
        s = node("Div", [node("ReduceMax", [a], "amax", keepdims=0), qmax], "scales")
        node("QuantizeLinear", [y, s], "codes", **attrs)
    elif q.granularity == "token":
        amax = node("ReduceMax", [a, c("ax1", np.array([1], np.int64))], "amax", keepdims=0)
        s = node("Div", [amax, qmax], "s")
        node("QuantizeLinear", [y, s], "codes", axis=0, **attrs)
        node("Unsqueeze", [s, c("ax1b", np.array([1], np.int64))], "scales")
    else:
        block = q.block
        a3 = node("Reshape", [a, c("g3", np.array([0, -1, block], np.int64))], "a3")
        amax = node("ReduceMax", [a3, c("ax2", np.array([2], np.int64))], "amax", keepdims=0)
        s = node("Div", [amax, qmax], "scales")
        node("QuantizeLinear", [y, s], "codes", axis=1, block_size=block, **attrs)
    f32 = TensorProto.FLOAT
    graph = helper.make_graph(nodes, f"ort_{op}_quant", [helper.make_tensor_value_info("x", f32, ["R", "C"])],
                              [helper.make_tensor_value_info("codes", kind, None),
                               helper.make_tensor_value_info("scales", f32, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    return model


def cpu() -> str:
    info = subprocess.run([sys.executable, "-m", "multiact", "info"], capture_output=True, text=True).stdout
    ident = next((ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("CPU identity")), "")
    name = ""
    try:
        with open("/proc/cpuinfo") as fh:
            name = next((ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")), "")
    except OSError:
        pass
    return f"{name}; {ident}" if name else ident or "not recorded"


CONTRACT_QUANTS = {
    "e4m3 tensor": ("float8_e4m3fn", "tensor", None, None),
    "e5m2 static 0.05": ("float8_e5m2", "tensor", None, 0.05),
    "int8 token": ("int8", "token", None, None),
    "e5m2 token": ("float8_e5m2", "token", None, None),
    "e4m3 group32": ("float8_e4m3fn", "group", 32, None),
    "int8 group128": ("int8", "group", 128, None),
    "e5m2 mx floor": ("float8_e5m2", "mx", None, None),
    "e4m3 mx ceil": ("float8_e4m3fn", "mx", None, None),
    "int8 azp group32": ("int8", "group", 32, None),  # symmetric=False: zero points compared with the scales
}


def contract(out: str) -> None:
    """Per op and Quant, over every bfloat16 input as (512, 128): the codes and scales of ma.to_onnx(op, quant=Q)
    that differ from ma.quantize of the float32 model's result, and how many of the differing codes are NaN in
    both (ORT's float8e5m2 NaN is 0x7F, ml_dtypes' 0x7E)."""
    import ml_dtypes
    import onnxruntime as ort
    from onnx import TensorProto

    import multiact as ma
    from multiact import consistency
    from multiact.optable import OPS

    x = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(ml_dtypes.bfloat16).astype(np.float32)
    x = x.reshape(512, 128)
    kinds = {"float8_e4m3fn": TensorProto.FLOAT8E4M3FN, "float8_e5m2": TensorProto.FLOAT8E5M2}
    lines = [f"# {datetime.date.today().isoformat()} python benchmarks/onnx_quant.py --contract",
             f"# CPU: {cpu()}; onnxruntime {ort.__version__}",
             "# ma.to_onnx(op, quant=Q) against ma.quantize(the float32 model's result, Q), every bfloat16 input as "
             "(512, 128), each op at its first parameter case (multiact.consistency.param_cases); codes and scales "
             "(and zero points) that differ (of them NaN in both); prelu's weight per column",
             f"{'op':12s} {'quant':18s} {'codes':>6s} {'NaN':>6s} {'scales':>6s}"]
    total = 0
    for op, spec in OPS.items():
        array = spec.defn.array_param  # prelu's weight: an input of the model, one per column
        p = {k: v for k, v in consistency.param_cases(spec)[0].items() if k != array}
        feeds = {"x": x}
        if array:
            feeds[array] = np.linspace(-1.5, 1.5, 128).astype(np.float32)
            p = {"axis": 1}
        base = _session(ma.to_onnx(op, shape=2, **p), 1)
        y = base.run(None, feeds)[0]
        for label, (dt, gran, gs, scale) in CONTRACT_QUANTS.items():
            q = ma.Quant(dt, gran, group_size=gs, scale=scale, symmetric="azp" not in label)
            want_c, want_s, *want_zp = ma.quantize(y, q)
            sess = _session(ma.to_onnx(op, shape=2, quant=q, **p), 1)
            codes = np.empty(want_c.shape, np.int8 if dt == "int8" else np.uint8)
            scales = np.empty(np.shape(want_s), np.uint8 if gran == "mx" else np.float32)
            b = sess.io_binding()
            for k, v in feeds.items():
                b.bind_ortvalue_input(k, ort.OrtValue.ortvalue_from_numpy(v))
            b.bind_ortvalue_output("codes", ort.OrtValue.ortvalue_from_numpy_with_onnx_type(codes, kinds[dt])
                                   if dt in kinds else ort.OrtValue.ortvalue_from_numpy(codes))
            b.bind_ortvalue_output("scales", ort.OrtValue.ortvalue_from_numpy(scales))
            zps = [np.empty(np.shape(w), np.int32) for w in want_zp]
            for z in zps:
                b.bind_ortvalue_output("zero_points", ort.OrtValue.ortvalue_from_numpy(z))
            sess.run_with_iobinding(b)
            diff = codes.view(np.uint8) != want_c.view(np.uint8)
            nan = 0
            if dt in kinds:
                g = codes.view(getattr(ml_dtypes, dt)).astype(np.float32)
                nan = int((diff & np.isnan(g) & np.isnan(want_c.astype(np.float32))).sum())
            sd = int((np.atleast_1d(scales).view(np.uint8) != np.atleast_1d(want_s).view(np.uint8)).sum())
            sd += sum(int((z != w).sum()) for z, w in zip(zps, want_zp, strict=True))
            total += int(diff.sum()) - nan + sd
            lines.append(f"{op:12s} {label:18s} {int(diff.sum()):6d} {nan:6d} {sd:6d}")
    lines.append(f"# differing codes that are not NaN in both, and differing scales, in all: {total}")
    print("\n".join(lines))
    if out:
        with open(out, "w") as fh:
            fh.write("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> None:
    import multiact as ma

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1 << 24)
    ap.add_argument("--cols", type=int, default=4096)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--ops", default="relu,gelu,silu,swiglu")
    ap.add_argument("--out", default="")
    ap.add_argument("--contract", action="store_true", help="count the codes that differ from the contract instead")
    a = ap.parse_args(argv)
    if a.contract:
        contract(a.out)
        return
    ma.set_num_threads(1)
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(a.n) * 3).astype(np.float32).reshape(-1, a.cols)
    import onnxruntime

    lines = [f"# {datetime.date.today().isoformat()} python benchmarks/onnx_quant.py "
             f"{' '.join(sys.argv[1:] if argv is None else argv)}",
             f"# CPU: {cpu()}; load {[round(v, 2) for v in os.getloadavg()]}",
             f"# n={a.n} float32 as ({a.n // a.cols}, {a.cols}), 1 thread, onnxruntime {onnxruntime.__version__}, "
             f"median of {a.reps} (ms); ratios: export/ort, runtime/ort, export/native",
             f"{'op':8s} {'quant':14s} {'export':>8s} {'runtime':>8s} {'ort':>8s} {'native':>8s} "
             f"{'exp/ort':>8s} {'rt/ort':>8s} {'exp/nat':>8s} {'spread':>7s}"]
    for ln in lines:
        print(ln, flush=True)
    for op in [o for o in a.ops.split(",") if o]:
        gated = _act_of(op)[1]
        y_shape = (x.shape[0], x.shape[1] // 2) if gated else x.shape
        for label, (dt, gran, gs) in QUANTS.items():
            q = ma.Quant(dt, gran, group_size=gs)
            kw = {"ndim": 2} if gated else {"shape": 2}
            calls = {"export": _bound(_session(ma.to_onnx(op, quant=q, **kw), 1), x, q, y_shape)}
            if not gated:
                calls["runtime"] = _bound(_session(ma.to_onnx(op, quant=q, accuracy="runtime", **kw), 1), x, q,
                                          y_shape)
            if gran != "mx":
                calls["ort"] = _bound(_session(composition(op, q), 1), x, q, y_shape)
            fn = getattr(ma, op)
            calls["native"] = lambda fn=fn, q=q: fn(x, quant=q, backend="native")
            times: dict[str, list[float]] = {k: [] for k in calls}
            for f in calls.values():  # warm up
                f()
            for _ in range(a.reps):
                for k, f in calls.items():
                    t0 = time.perf_counter()
                    f()
                    times[k].append((time.perf_counter() - t0) * 1e3)
            med = {k: float(np.median(v)) for k, v in times.items()}
            q1, q3 = np.percentile(times["export"], [25, 75])
            spread = (q3 - q1) / med["export"]
            cells = " ".join(f"{med[k]:8.1f}" if k in med else f"{'-':>8s}"
                             for k in ("export", "runtime", "ort", "native"))
            ratios = " ".join(f"{med[k1] / med[k2]:8.2f}" if k1 in med and k2 in med else f"{'-':>8s}"
                              for k1, k2 in (("export", "ort"), ("runtime", "ort"), ("export", "native")))
            ln = f"{op:8s} {label:14s} {cells} {ratios} {spread:7.0%}"
            print(ln, flush=True)
            lines.append(ln)
    lines.append(f"# load after {[round(v, 2) for v in os.getloadavg()]}")
    print(lines[-1])
    if a.out:
        with open(a.out, "w") as fh:
            fh.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
