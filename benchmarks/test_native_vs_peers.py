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
from multiact.cli import peers
from multiact.optable import KEYS

N_BIG = 1 << 24
PARAMS: dict[str, dict] = {"threshold": {"threshold": 0.1, "value": 0.0}}  # the ops without defaults
# Every kernel key but those of an op with an array parameter (prelu's weight): gelu_tanh is gelu(approximate="tanh")
OPS = [key for key, spec in KEYS.items() if not spec.defn.array_param]


def _ma_call(op: str, grad: bool) -> tuple[str, dict]:
    """The op and its parameters for kernel key `op`."""
    spec = KEYS[op]
    return spec.name, {**PARAMS.get(spec.name, {}), **spec.defn.selecting(op)}


def native_fn(op: str, x: np.ndarray, out: np.ndarray, grad: bool = False) -> Callable[[], object]:
    name, kw = _ma_call(op, grad)
    if grad:
        f = getattr(ma, name + "_grad")
        dy = np.ones_like(x)
        return lambda: f(dy, x, out=out, backend="native", **kw)
    f = getattr(ma, name)
    return lambda: f(x, out=out, backend="native", **kw)


def _peer_fn(peer: str, op: str, x: np.ndarray, out: np.ndarray, grad: bool) -> Callable[[], object] | None:
    """The peer (multiact.cli.peers: the op's definition's torch spelling, ONNX Runtime's own node) writing
    into `out` where it has an out= form, else allocating and copying."""
    name, kw = _ma_call(op, grad)
    params = KEYS[op].validate(kw)
    arrays = (np.ones_like(x), x) if grad else (x,)
    bound = peers.make(peer, name, "backward" if grad else "forward", params, arrays, out,
                       max(1, ma.get_num_threads()))
    if isinstance(bound, str):
        return None
    if bound.into is not None:
        return bound.into
    alloc = bound.alloc
    return lambda: np.copyto(out, np.asarray(alloc()))


def torch_fn(op: str, x: np.ndarray, out: np.ndarray, grad: bool = False) -> Callable[[], object] | None:
    """torch writing into a preallocated tensor (the out= / grad_input= overloads)."""
    return _peer_fn("torch", op, x, out, grad)


def ort_fn(op: str, x: np.ndarray, out: np.ndarray, grad: bool = False) -> Callable[[], object] | None:
    """A one-node ONNX graph run with io_binding into `out` (forward only: ORT has no gradients)."""
    return None if grad else _peer_fn("onnxruntime", op, x, out, grad)


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
    from multiact.cli import bench

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
