"""ma.to_onnx's graphs per op: which form the default (accuracy="auto") picks, its error, and its ONNX Runtime time
against ORT's own operator and ma.<op>.

    python benchmarks/onnx_export.py [--n 16777216] [--reps 5] [--threads 1] [--ops gelu,sigmoid] [--out FILE.json]

Per op, at its default parameters (PARAMS for the ops without defaults):
- the form of each dtype's default graph: ORT's own operator (one node) or the composite (its nodes, and whether it
  computes in float64);
- its largest error (in ulp of the dtype, and as a share of the op's contract bound: <= 1 is within it; the
  bound has an absolute part where the op cancels), and that of ORT's own operators (accuracy="runtime": the op's ONNX
  operator where ONNX has one, else ORT's operators composed, e.g. x * Sigmoid(x)), on the consistency suite's
  inputs (specials, kinks, tails) and a grid on [-30, 30] against the float64 reference, judged as every backend is
  (multiact.consistency.compare: whether it meets the contract, and the largest ulp error where it does not);
- float32 forward time at --n elements: the default graph, the composite (accuracy="contract"), ORT's own
  operators (accuracy="runtime") and ma.<op> with out=, alternated within each repetition (median, spread = IQR /
  median);
  the backward graph (a composite in every mode) against ma.<op>_grad.
The JSON (results/onnx-export-*.json) holds the CPU, the load average before and after, and every row; the docs
table (docs/performance.md, `python -m dev.docs`) is generated from it.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import math
import os
import sys
import time

import numpy as np

PARAMS = {"threshold": {"threshold": 0.5, "value": 0.0}}  # the ops without defaults (value 0: ThresholdedRelu)


def _session(model, threads: int):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"],
                                disabled_optimizers=["NoopElimination"])


def _channels(op: str, x: np.ndarray) -> tuple[dict, dict, dict]:
    """(extra feeds, ma keywords, reference parameters) for an op with an array parameter (prelu: one weight 0.25,
    x as (1, 1, N)); empty otherwise."""
    from multiact.optable import OPS

    array = OPS[op].defn.array_param
    if not array:
        return {}, {}, {}
    w = np.array([0.25], x.dtype)
    return {array: w}, {array: w, "axis": 1}, {array: np.full((1, 1, 1), 0.25), "axis": 1}


_PLUMBING = ("Shape", "Slice", "Min", "Max", "Sub", "Reshape")  # a weight along its axis (onnx_graphs.along_axis)


def form(model, weight: bool = False) -> str:
    """ORT's own operator ("Gelu"), up to three nodes by name ("Neg, Softplus, Neg"), or the composite ("composite,
    46 nodes, float64"); weight: the model puts an array parameter along its axis first (not the op's nodes)."""
    from onnx import TensorProto

    nodes = [n for n in model.graph.node if not (weight and n.op_type in _PLUMBING)]
    if len(nodes) <= 3:  # ORT's operator, or a few named
        return ", ".join(n.op_type for n in nodes)
    f64 = any(n.op_type == "Cast" and n.attribute[0].i == TensorProto.DOUBLE for n in model.graph.node)
    return f"composite, {len(model.graph.node)} nodes{', float64' if f64 else ''}"


def error(op: str, model, dtype: str) -> dict:
    """The model's forward judged against the float64 reference: passed (the contract), the largest ulp error,
    and the first failure's description where it does not pass."""
    from multiact import consistency as C
    from multiact.optable import OPS

    spec = OPS[op]
    p = dict(PARAMS.get(op, {}))
    dt = np.dtype(dtype)
    sample_p = {**p, spec.defn.array_param: "single"} if spec.defn.array_param else p  # one weight
    x = np.concatenate([C.zero_pairs(dt)[0], C.sample_x(spec, sample_p, dtype, n=400),
                        np.linspace(-30, 30, 60001).astype(dtype)])
    feeds, _, rp = _channels(op, x)
    xs = x.reshape(1, 1, -1) if feeds else x
    (got,) = _session(model, 1).run(None, {"x": xs, **feeds})
    full = rp or spec.validate(p)
    ref = C.reference(spec, "forward", full, dt, xs)
    v = C.compare(got.reshape(xs.shape), ref, xs, spec, "forward", params=p)
    worst = v.max_ulp if math.isfinite(v.max_ulp) else None
    return {"passed": bool(v.passed), "max_ulp": worst, "of_bound": v.max_of_bound, "n_bad": v.n_bad,
            "first_bad": v.bad[:3], "why": "" if v.passed else v.describe()[:300]}


def _time(fns: dict, reps: int) -> tuple[dict, float]:
    times: dict[str, list[float]] = {k: [] for k in fns}
    for f in fns.values():
        f()  # warm
    for _ in range(reps):
        for k, f in fns.items():
            t0 = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t0)
    med = {k: float(np.median(v)) * 1e3 for k, v in times.items()}
    spread = max(float(np.subtract(*np.percentile(v, [75, 25])) / np.median(v)) for v in times.values())
    return med, spread


def row(op: str, x: np.ndarray, dy: np.ndarray, y: np.ndarray, reps: int, threads: int) -> dict:
    import multiact as ma
    from multiact.onnx_export import DTYPES, to_onnx
    from multiact.optable import OPS

    p = dict(PARAMS.get(op, {}))
    spec = OPS[op]
    out: dict = {"op": op, "params": p, "forms": {}, "errors": {}, "ort_forms": {}, "ort_errors": {}}
    weight = bool(spec.defn.array_param)
    for dtype in DTYPES:
        auto = to_onnx(op, dtype=dtype, **p)
        runtime = to_onnx(op, dtype=dtype, accuracy="runtime", **p)
        out["forms"][dtype] = form(auto, weight)
        out["errors"][dtype] = error(op, auto, dtype)
        out["ort_forms"][dtype] = form(runtime, weight)
        out["ort_errors"][dtype] = error(op, runtime, dtype)
    feeds, ma_kw, _ = _channels(op, x)
    xs = x.reshape(1, 1, -1) if feeds else x
    models = {"auto": to_onnx(op, **p), "contract": to_onnx(op, accuracy="contract", **p),
              "ort": to_onnx(op, accuracy="runtime", **p)}
    fns = {k: functools.partial(_session(m, threads).run, None, {"x": xs, **feeds}) for k, m in models.items()}
    fns["ma"] = functools.partial(ma.forward, op, x, out=y, **(ma_kw or p))
    med, spread = _time(fns, reps)
    out["fwd_ms"], out["fwd_spread"] = med, spread
    bwd = {"onnx": functools.partial(_session(to_onnx(op, grad=True, **p), threads).run, None,
                                     {"x": xs, "dy": dy.reshape(xs.shape), **feeds}),
           "ma": functools.partial(ma.backward, op, dy, x, out=y, **(ma_kw or p))}
    out["bwd_ms"], out["bwd_spread"] = _time(bwd, reps)
    return out


def main(argv: list[str] | None = None) -> int:
    import subprocess

    import multiact as ma
    from multiact.optable import OPS

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1 << 24)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1, help="ONNX Runtime's and multiact's threads (default 1)")
    ap.add_argument("--ops", default="")
    ap.add_argument("--out", default="")
    a = ap.parse_args(argv)
    ma.set_num_threads(a.threads)
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(a.n) * 3).astype(np.float32)
    dy = rng.standard_normal(a.n).astype(np.float32)
    y = np.empty_like(x)
    ops = [o for o in a.ops.split(",") if o] or list(OPS)
    info = subprocess.run([sys.executable, "-m", "multiact", "info"], capture_output=True, text=True).stdout
    cpu = next((ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("CPU identity")), "")
    import onnxruntime

    args = sys.argv[1:] if argv is None else argv
    meta = {"date": datetime.date.today().isoformat(), "argv": args,
            "command": " ".join(["python benchmarks/onnx_export.py", *args]),
            "n": a.n, "reps": a.reps, "threads": a.threads, "dtype": "float32",
            "cpu": {"summary": cpu or "not recorded"}, "load_before": [round(v, 2) for v in os.getloadavg()],
            "onnxruntime": onnxruntime.__version__, "python": sys.version.split()[0]}
    print(f"# CPU: {meta['cpu']['summary']}; load {meta['load_before']}; n={a.n}, {a.threads} thread(s)", flush=True)
    rows = []
    for op in ops:
        r = row(op, x, dy, y, a.reps, a.threads)
        rows.append(r)
        f, m = r["fwd_ms"], r["fwd_ms"]["auto"]
        print(f"{op:12s} {r['forms']['float32']:28s} {r['errors']['float32']['max_ulp'] or 0:8.3g} ulp  "
              f"auto {m:8.1f} ms  /ort {m / f['ort']:6.2f}  /ma {m / f['ma']:6.2f}  "
              f"bwd/ma {r['bwd_ms']['onnx'] / r['bwd_ms']['ma']:6.2f}  spread {r['fwd_spread']:.0%}", flush=True)
    meta["load_after"] = [round(v, 2) for v in os.getloadavg()]
    if a.out:
        with open(a.out, "w") as fh:
            json.dump({"meta": meta, "rows": rows}, fh, indent=1)
            fh.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
