"""ONNX Runtime time of multiact's exported graphs vs ORT's built-in operator vs ma.<op>, per op.

    python benchmarks/onnx_export.py [--n 16777216] [--reps 5] [--ops gelu,sigmoid] [--out FILE]

Forward rows: the accuracy="contract" graph (to_onnx's default), the accuracy="runtime" graph, ORT's
built-in operator alone (where ONNX has the op; "-" otherwise) and ma.<op>.  Backward rows: the exported
backward graph vs ma.backward (ONNX Runtime has no gradient kernels to compare with).  The variants of a
row alternate within each repetition; the median is reported with the spread (IQR / median).  The
CPU line and the load average go in the header: figures from a loaded machine are noisy.
"""

from __future__ import annotations

import argparse
import functools
import os
import platform
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


def _builtin_model(op: str, p: dict):
    """ORT's own one-node graph of op, or None where ONNX has no operator for it."""
    from multiact.onnx_export import to_onnx

    m = to_onnx(op, accuracy="runtime", **p)
    compute = [n for n in m.graph.node if n.op_type != "Unsqueeze"]  # prelu's weight along axis: 1 element
    return m if len(compute) == 1 else None


def _row(op: str, direction: str, x: np.ndarray, dy: np.ndarray, y: np.ndarray, reps: int, threads: int) -> str:
    """One table row: every variant of (op, direction) alternated `reps` times."""
    import multiact as ma
    from multiact.onnx_export import to_onnx
    from multiact.optable import OPS

    p = dict(PARAMS.get(op, {}))
    feeds = {"x": x}
    ma_p = dict(p)
    array = OPS[op].defn.array_param
    if array:  # one weight (prelu's): x as (1, 1, N)
        w = np.array([0.25], np.float32)
        feeds = {"x": x.reshape(1, 1, -1), array: w}
        ma_p = {array: w}
    grad = direction == "bwd"
    models = {"contract": to_onnx(op, grad=grad, **p), "runtime": to_onnx(op, grad=grad, accuracy="runtime", **p)}
    if not grad:
        b = _builtin_model(op, p)
        if b is not None:
            models["builtin"] = b
    if grad:
        feeds["dy"] = dy.reshape(feeds["x"].shape)
    sessions = {k: _session(m, threads) for k, m in models.items()}
    fns = {k: functools.partial(s.run, None, feeds) for k, s in sessions.items()}
    fns["ma"] = (functools.partial(ma.backward, op, dy, x, out=y, **ma_p) if grad
                 else functools.partial(ma.forward, op, x, out=y, **ma_p))
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

    def ms(k: str) -> str:
        return f"{med[k]:.1f}" if k in med else "-"

    def ratio(k: str, base: str) -> str:
        return f"{med[k] / med[base]:.2f}x" if k in med and base in med else "-"

    nodes = f"{len(models['contract'].graph.node)}/{len(models['runtime'].graph.node)}"
    return (f"{op:12s} {direction:4s} {ms('contract'):>12s} {ms('runtime'):>11s} {ms('builtin'):>11s} "
            f"{ms('ma'):>8s} {ratio('contract', 'builtin'):>17s} {ratio('runtime', 'builtin'):>16s} "
            f"{ratio('contract', 'ma'):>12s}  {nodes:>10s}  {spread:.0%}")


def main(argv: list[str] | None = None) -> int:
    import multiact as ma
    from multiact.optable import OPS

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1 << 24)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--ops", default="")
    ap.add_argument("--out", default="")
    a = ap.parse_args(argv)
    threads = ma.get_num_threads()
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(a.n) * 3).astype(np.float32)
    dy = rng.standard_normal(a.n).astype(np.float32)
    y = np.empty_like(x)
    ops = [o for o in a.ops.split(",") if o] or list(OPS)
    import subprocess

    info = subprocess.run([sys.executable, "-m", "multiact", "info"], capture_output=True, text=True).stdout
    cpu = "; ".join(ln.strip() for ln in info.splitlines() if ln.startswith("CPU"))
    load = os.getloadavg()
    lines = [f"# multiact ONNX export vs ONNX Runtime's built-in operators vs ma.<op>: float32, n={a.n}, "
             f"{threads} threads, median of {a.reps}",
             f"# {cpu or platform.processor() or platform.machine()} ({os.cpu_count()} cpus); "
             f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; {sys.version.split()[0]}",
             "# ratio = exported graph time / built-in time (the 1.3x bound of issue 21); spread = IQR / median",
             f"{'op':12s} {'dir':4s} {'contract ms':>12s} {'runtime ms':>11s} {'builtin ms':>11s} {'ma ms':>8s} "
             f"{'contract/builtin':>17s} {'runtime/builtin':>16s} {'contract/ma':>12s}  nodes(c/r)  spread max"]
    print("\n".join(lines), flush=True)
    for op in ops:
        for direction in ("fwd", "bwd"):
            row = _row(op, direction, x, dy, y, a.reps, threads)
            print(row, flush=True)
            lines.append(row)
    load = os.getloadavg()
    lines.append(f"# load average at the end {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    if a.out:
        with open(a.out, "w") as f:
            f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
