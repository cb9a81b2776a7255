"""native against PyTorch (CPU), ONNX Runtime and a copy: ns per element, one thread, out= given.

pytest-benchmark file (not part of the default test run):
    pytest benchmarks/test_native_vs_peers.py --benchmark-only
A plain table, implementations interleaved and the median of several rounds, ns/element:
    python benchmarks/test_native_vs_peers.py [--n 16777216] [--grad] [--threads 1]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np
import pytest

import multiact as ma

N_BIG = 1 << 24
PARAMS: dict[str, dict] = {"threshold": {"threshold": 0.1, "value": 0.0}}
OPS = ["relu", "relu6", "leaky_relu", "elu", "selu", "celu", "gelu", "gelu_tanh", "fast_gelu", "silu", "swish",
       "hardswish", "hardsigmoid", "sigmoid", "logsigmoid", "tanh", "hardtanh", "softplus", "softsign", "mish",
       "softshrink", "hardshrink", "tanhshrink", "threshold"]


def _ma_call(op: str, grad: bool) -> tuple[str, dict]:
    if op == "gelu_tanh":
        return "gelu", {"approximate": "tanh"}
    return op, PARAMS.get(op, {})


def native_fn(op: str, x: np.ndarray, out: np.ndarray, grad: bool = False) -> Callable[[], object]:
    name, kw = _ma_call(op, grad)
    if grad:
        f = getattr(ma, name + "_grad")
        dy = np.ones_like(x)
        return lambda: f(dy, x, out=out, backend="native", **kw)
    f = getattr(ma, name)
    return lambda: f(x, out=out, backend="native", **kw)


def torch_fn(op: str, x: np.ndarray, out: np.ndarray, grad: bool = False) -> Callable[[], object] | None:
    """torch writing into a preallocated tensor (the out= / grad_input= overloads)."""
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(max(1, ma.get_num_threads()))
    xt, ot = torch.from_numpy(x), torch.from_numpy(out)
    nn, a = torch._C._nn, torch.ops.aten
    if grad:
        dy = torch.ones_like(xt)
        table = {
            "gelu": lambda: a.gelu_backward.grad_input(dy, xt, grad_input=ot),
            "gelu_tanh": lambda: a.gelu_backward.grad_input(dy, xt, approximate="tanh", grad_input=ot),
            "sigmoid": lambda: a.sigmoid_backward.grad_input(dy, xt, grad_input=ot),
            "tanh": lambda: a.tanh_backward.grad_input(dy, xt, grad_input=ot),
            "silu": lambda: a.silu_backward.grad_input(dy, xt, grad_input=ot),
            "softplus": lambda: a.softplus_backward.grad_input(dy, xt, 1.0, 20.0, grad_input=ot),
            "hardswish": lambda: a.hardswish_backward.out(dy, xt, out=ot),
            "leaky_relu": lambda: a.leaky_relu_backward.grad_input(dy, xt, 0.01, False, grad_input=ot),
            "hardtanh": lambda: a.hardtanh_backward.grad_input(dy, xt, -1.0, 1.0, grad_input=ot),
            "elu": lambda: a.elu_backward.grad_input(dy, 1.0, 1.0, 1.0, False, xt, grad_input=ot),
            "threshold": lambda: a.threshold_backward.grad_input(dy, xt, 0.1, grad_input=ot),
            "softshrink": lambda: a.softshrink_backward.grad_input(dy, xt, 0.5, grad_input=ot),
            "hardshrink": lambda: a.hardshrink_backward.grad_input(dy, xt, 0.5, grad_input=ot),
            "hardsigmoid": lambda: a.hardsigmoid_backward.grad_input(dy, xt, grad_input=ot),
            "mish": lambda: ot.copy_(a.mish_backward(dy, xt)),  # no out= overload: allocates
        }
        return table.get(op)
    table = {
        "relu": lambda: torch.clamp_min(xt, 0.0, out=ot),
        "relu6": lambda: nn.hardtanh(xt, 0.0, 6.0, out=ot),
        "leaky_relu": lambda: nn.leaky_relu(xt, 0.01, out=ot),
        "elu": lambda: nn.elu(xt, out=ot),
        "gelu": lambda: nn.gelu(xt, out=ot),
        "gelu_tanh": lambda: nn.gelu(xt, approximate="tanh", out=ot),
        "silu": lambda: nn.silu(xt, out=ot),
        "hardswish": lambda: nn.hardswish(xt, out=ot),
        "hardsigmoid": lambda: nn.hardsigmoid(xt, out=ot),
        "sigmoid": lambda: torch.sigmoid(xt, out=ot),
        "logsigmoid": lambda: nn.log_sigmoid(xt, out=ot),
        "tanh": lambda: torch.tanh(xt, out=ot),
        "hardtanh": lambda: nn.hardtanh(xt, -1.0, 1.0, out=ot),
        "softplus": lambda: nn.softplus(xt, 1.0, 20.0, out=ot),
        "mish": lambda: nn.mish(xt, out=ot),
        "softshrink": lambda: nn.softshrink(xt, 0.5, out=ot),
        "hardshrink": lambda: torch.hardshrink(xt, 0.5, out=ot),
        "threshold": lambda: torch.threshold(xt, 0.1, 0.0, out=ot),
        "selu": lambda: ot.copy_(torch.selu(xt)),  # no out= overload: allocates
        "celu": lambda: ot.copy_(torch.celu(xt)),
        "softsign": lambda: ot.copy_(torch.nn.functional.softsign(xt)),
        "tanhshrink": lambda: ot.copy_(torch.nn.functional.tanhshrink(xt)),
    }
    return table.get(op)


_ONNX = {"relu": ("Relu", {}), "leaky_relu": ("LeakyRelu", {"alpha": 0.01}), "elu": ("Elu", {}), "selu": ("Selu", {}),
         "celu": ("Celu", {}), "gelu": ("Gelu", {}), "gelu_tanh": ("Gelu", {"approximate": "tanh"}),
         "hardswish": ("HardSwish", {}), "hardsigmoid": ("HardSigmoid", {"alpha": 1 / 6, "beta": 0.5}),
         "sigmoid": ("Sigmoid", {}), "tanh": ("Tanh", {}), "softplus": ("Softplus", {}), "softsign": ("Softsign", {}),
         "mish": ("Mish", {}), "softshrink": ("Shrink", {"bias": 0.5, "lambd": 0.5}),
         "hardshrink": ("Shrink", {"lambd": 0.5})}


def ort_fn(op: str, x: np.ndarray, out: np.ndarray, grad: bool = False) -> Callable[[], object] | None:
    """A one-node ONNX graph run with io_binding into `out` (forward only: ORT has no gradients)."""
    if grad or op not in _ONNX:
        return None
    try:
        import onnx
        import onnxruntime as ort
        from onnx import TensorProto, helper
    except ImportError:
        return None
    node_op, attrs = _ONNX[op]
    node = helper.make_node(node_op, ["x"], ["y"], **attrs)
    vi = lambda n: helper.make_tensor_value_info(n, TensorProto.FLOAT, [None])  # noqa: E731
    model = helper.make_model(helper.make_graph([node], "g", [vi("x")], [vi("y")]),
                              opset_imports=[helper.make_opsetid("", 20)])
    model.ir_version = min(model.ir_version, 10)
    so = ort.SessionOptions()
    so.intra_op_num_threads = max(1, ma.get_num_threads())
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    s = ort.InferenceSession(onnx._serialize(model) if hasattr(onnx, "_serialize") else model.SerializeToString(),
                             so, providers=["CPUExecutionProvider"])
    b = s.io_binding()
    b.bind_ortvalue_input("x", ort.OrtValue.ortvalue_from_numpy(x))
    b.bind_ortvalue_output("y", ort.OrtValue.ortvalue_from_numpy(out))
    return lambda: s.run_with_iobinding(b)


def copy_fn(op: str, x: np.ndarray, out: np.ndarray, grad: bool = False) -> Callable[[], object]:
    if grad:  # a 3-stream copy: read dy and x, write out
        dy = np.ones_like(x)
        return lambda: np.add(dy, x, out=out)
    return lambda: np.copyto(out, x)


IMPLS = {"native": native_fn, "torch": torch_fn, "onnxruntime": ort_fn, "copy": copy_fn}


@pytest.fixture(scope="module")
def big():
    x = (np.random.default_rng(0).standard_normal(N_BIG) * 3).astype(np.float32)
    return x, np.empty_like(x)


@pytest.mark.parametrize("impl", list(IMPLS))
@pytest.mark.parametrize("op", OPS)
def test_forward_16m_one_thread(benchmark, big, op, impl):
    ma.set_num_threads(1)
    fn = IMPLS[impl](op, *big)
    if fn is None:
        pytest.skip(f"{impl} has no {op}")
    benchmark.extra_info["ns_per_element"] = None
    benchmark.pedantic(fn, rounds=5, warmup_rounds=1)
    benchmark.extra_info["ns_per_element"] = benchmark.stats.stats.median / N_BIG * 1e9


@pytest.mark.parametrize("impl", ["native", "torch", "copy"])
@pytest.mark.parametrize("op", OPS)
def test_backward_16m_one_thread(benchmark, big, op, impl):
    ma.set_num_threads(1)
    fn = IMPLS[impl](op, *big, grad=True)
    if fn is None:
        pytest.skip(f"{impl} has no {op} backward")
    benchmark.pedantic(fn, rounds=5, warmup_rounds=1)
    benchmark.extra_info["ns_per_element"] = benchmark.stats.stats.median / N_BIG * 1e9


@pytest.mark.parametrize("op", OPS)
def test_1k_without_out(benchmark, op):
    x = np.random.default_rng(0).standard_normal(1024).astype(np.float32)
    name, kw = _ma_call(op, False)
    f = getattr(ma, name)
    benchmark(lambda: f(x, **kw))


def table(n: int, grad: bool, rounds: int = 7) -> None:
    """Print ns/element per op and implementation, interleaving implementations round by round."""
    x = (np.random.default_rng(0).standard_normal(n) * 3).astype(np.float32)
    out = np.empty_like(x)
    impls = ["native", "torch", "copy"] + ([] if grad else ["onnxruntime"])
    from multiact.tools import bench

    print(bench.header())  # the CPU these figures are measured on
    print(f"n={n} threads={ma.get_num_threads()} {'backward' if grad else 'forward'}: ns/element (median, min)")
    print(f"{'op':12s}" + "".join(f"{i:>20s}" for i in impls))
    for op in OPS:
        fns = {i: IMPLS[i](op, x, out, grad=grad) for i in impls}
        times: dict[str, list[float]] = {i: [] for i in impls if fns[i] is not None}
        for f in (f for f in fns.values() if f is not None):
            f()
        for _ in range(rounds):
            for i in times:
                t0 = time.perf_counter()
                fns[i]()
                times[i].append((time.perf_counter() - t0) / n * 1e9)
        cells = [f"{np.median(times[i]):8.3f} ({min(times[i]):6.3f})" if i in times else f"{'-':>20s}" for i in impls]
        print(f"{op:12s}" + "".join(f"{c:>20s}" for c in cells), flush=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=N_BIG)
    ap.add_argument("--grad", action="store_true")
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    ma.set_num_threads(a.threads)
    table(a.n, a.grad)
