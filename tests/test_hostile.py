"""Hostile inputs: misaligned, broadcast, huge-stride and mixed-library arrays never crash or lie."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import host_backends, require, supports

import multiact as ma
from multiact import consistency as C
from multiact.optable import OPS

BACKENDS = host_backends()


def _misaligned(values: np.ndarray) -> np.ndarray:
    """A view of `values` at an odd byte offset (not aligned to its itemsize)."""
    raw = np.zeros(values.nbytes + 1, dtype=np.uint8)
    view = np.frombuffer(raw.data, dtype=values.dtype, count=values.size, offset=1).reshape(values.shape)
    view = view.view()
    view.flags.writeable = True if raw.flags.writeable else False
    view[...] = values
    return view


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_misaligned_buffers(backend, dtype):
    """Within the op's tolerance (a SIMD library may round an unaligned head differently)."""
    require(backend, "relu", "forward", dtype)
    x = np.linspace(-5, 5, 1001).astype(dtype)
    xm = _misaligned(x)
    assert not xm.flags.aligned
    for op in ("relu", "gelu", "sigmoid", "softplus", "hardswish"):
        if not supports(backend, op, "forward", dtype):  # native's float64: the piecewise ops only
            continue
        spec = OPS[op]
        want = C.reference(spec, "forward", {}, dtype, x)
        assert C.compare(ma.forward(op, xm, backend=backend), want, x, spec, "forward", params={}).passed
        out = _misaligned(np.zeros_like(x))
        ma.forward(op, x, out=out, backend=backend)
        assert C.compare(out, want, x, spec, "forward", params={}).passed
        dy = _misaligned(np.ones_like(x))
        gwant = C.reference(spec, "backward", {}, dtype, np.ones_like(x), x)
        got = ma.backward(op, dy, xm, backend=backend)
        assert C.compare(got, gwant, x, spec, "backward", scale=np.ones_like(x), params={}).passed


@pytest.mark.parametrize("backend", BACKENDS)
def test_zero_stride_broadcast_inputs(backend):
    require(backend, "relu", "forward", "float32")
    x = np.broadcast_to(np.float32(-1.5), (1000, 3))
    assert x.strides == (0, 0) and not x.flags.writeable
    for op in OPS:
        if op in ("prelu", "threshold"):
            continue
        y = ma.forward(op, x, backend=backend)
        assert y.shape == x.shape and y.flags.writeable
        np.testing.assert_array_equal(y, np.full(x.shape, y[0, 0]))
    with pytest.raises(ValueError, match="read-only"):
        ma.relu(np.ones((1000, 3), np.float32), out=x)


@pytest.mark.parametrize("backend", BACKENDS)
def test_large_strides_and_negative_steps(backend):
    base = np.random.default_rng(0).standard_normal((64, 1024)).astype(np.float32)
    x = base[::-7, ::-33]
    np.testing.assert_array_equal(ma.tanh(x, backend=backend), ma.tanh(np.ascontiguousarray(x), backend=backend))


def test_mixed_libraries_are_refused_by_name():
    torch = pytest.importorskip("torch")
    x = np.ones(4, np.float32)
    with pytest.raises(TypeError, match=r"dy is torch.Tensor\(cpu\)"):
        ma.relu_grad(torch.ones(4), x)


def test_python_scalars_and_nested_lists():
    np.testing.assert_array_equal(ma.relu([[-1.0, 2.0], [3.0, -4.0]]), [[0, 2], [3, 0]])
    assert ma.sigmoid(0.0) == 0.5


def _mem_available() -> int:
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


@pytest.mark.skipif(_mem_available() < (12 << 30), reason="needs 12 GiB of free memory")
def test_more_than_2_to_the_31_elements_on_the_native_path():
    """64-bit indexing: one in-place call over 2^31 + 17 float16 elements (4 GiB), checked at both ends."""
    info = {b.name: b for b in ma.backends()}
    if not info["native"].available:
        pytest.skip(f"native: {info['native'].reason}")
    n = (1 << 31) + 17
    x = np.empty(n, dtype=np.float16)
    x[: 1 << 20] = -1.5
    x[(1 << 20):] = 2.0
    x[-17:] = -3.0
    ma.leaky_relu(x, 0.5, out=x, backend="native")
    assert x[0] == -0.75 and x[(1 << 20) - 1] == -0.75 and x[1 << 20] == 2.0
    assert x[(1 << 31) - 1] == 2.0 and np.all(x[-17:] == -1.5)
    del x
