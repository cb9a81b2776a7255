"""The gated kernels (gated:<act>) of the numba and cuda backends against the float64 reference composed
from the table's (`multiact.gated.reference_forward/backward`), through the public functions.

numba: every gated key forward and backward in float32 and float16 (float16 runs the float32 loops),
float64 for a sample; layouts (halves of dim -1 and of dims 0 and 1 of 3-D arrays, interleaved, the
two-input form, transposed and reversed views), the clipped form, in-place backward, specials, the
parallel loop.  cuda: the same checks on a sample of keys under the CUDA simulator, in a child process
(NUMBA_ENABLE_CUDASIM must be set before numba is imported; tiny arrays, the simulator runs every thread
in Python).  On a GPU, MULTIACT_CUDA_REAL=1 runs the cuda checks on numba device arrays instead.

The bound is the activation's tolerance plus one ulp (the product with the other input), as
`multiact.consistency.compare` applies it with the limit and the activation's parameters rounded to
float32 below float64.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from conftest import skip_unless_sampled

import multiact as ma
from multiact import consistency as C
from multiact import gated, registry
from multiact.optable import FAMILY_KEYS

CHILD = os.environ.get("MULTIACT_GATED_CUDA_CHILD") == "1"  # this process runs the cuda checks
REAL = os.environ.get("MULTIACT_CUDA_REAL") == "1"
KEYS = [k for k, (fam, _, _) in FAMILY_KEYS.items() if fam.name == "gated"]
# float64 loops (libm namespace) and the cuda simulator: a sample of the keys, spread over the table and
# with every activation whose cuda kernel computes in float64 (formulas.WIDE)
SAMPLE = KEYS[::5]
CUDA_SAMPLE = ["gated:silu", "gated:gelu", "gated:relu", "gated:sigmoid", "gated:softplus"]


def _call_params(key: str) -> dict:
    """glu's arguments that select kernel key `key`: act= and the activation's first case for that key."""
    _, spec, act_key = FAMILY_KEYS[key]
    return {"act": spec.name, "activate": "first", **C.key_cases(spec, act_key)[0]}


# ---- inputs and the check ----------------------------------------------------------------------------------


def _inputs(key: str, dtype, shape, seed: int = 0):
    """(gate, up, dy): gate over the activation's working range with its kinks and +-0, up and dy random
    with +-0 and +-1 mixed in; values where products neither overflow nor underflow."""
    _, spec, act_key = FAMILY_KEYS[key]
    rng = np.random.default_rng(seed)
    n = math.prod(shape)
    p = C._rounded(spec, C.key_cases(spec, act_key)[0], np.dtype(dtype))
    kinks = [k for k in spec.kinks(p) if abs(k) < 30]
    special = np.array([0.0, -0.0, 1.0, -1.0, *kinks, *[np.nextafter(k, 9.0) for k in kinks]])
    g = np.concatenate([special, rng.uniform(-8, 8, n)])[:n]
    u = np.concatenate([[0.0, -0.0, 1.0, -1.0, 2.0, -0.0], rng.standard_normal(n) * 3])[:n]
    dy = np.concatenate([[1.0, -1.0, 0.0, -0.0, 0.5], rng.standard_normal(n)])[:n]
    return tuple(rng.permutation(a).reshape(shape).astype(dtype) for a in (g, u, dy))


def _check(key: str, params: dict, gate, up, dy, y=None, dgate=None, dup=None) -> None:
    """Assert y (forward) and/or dgate, dup (backward) against the float64 reference."""
    _, spec, act_key = FAMILY_KEYS[key]
    dtype = np.dtype(gate.dtype)
    cdef = gated.COMPOSITE_DEFINITIONS[params.get("op", "glu")]
    own = {k: v for k, v in params.items() if k in cdef.param_names}
    extra = {k: v for k, v in params.items() if k not in cdef.param_names and k != "op"}
    call = gated.resolve(cdef, own, extra, "test")
    assert call.key == key
    kp = {**call.kp, **C._rounded(call.act, call.act_p, dtype)}
    if dtype != np.float64 and kp["limit"] != math.inf:
        kp["limit"] = float(np.float32(kp["limit"]))
    t = call.act.tol
    wide = replace(call.act, tol=replace(t, ulp32=t.ulp32 + 1, ulp64=t.ulp64 + 1, ulp16=t.ulp16 + 1))
    g64, u64 = gated.clipped(gate.astype(np.float64), up.astype(np.float64), kp)
    g = g64.astype(dtype)
    d64 = dy.astype(np.float64)
    checks = []
    with np.errstate(all="ignore"):
        if y is not None:
            checks.append(("forward y", y, gated.reference_forward(call.act, kp, gate, up), "forward", g64 * u64))
        if dgate is not None:
            rg, ru = gated.reference_backward(call.act, kp, dy, gate, up)
            checks += [("backward dgate", dgate, rg, "backward", d64 * u64),
                       ("backward dup", dup, ru, "forward", d64 * g64)]
        for what, got, ref, direction, scale in checks:
            got = np.asarray(got)
            assert got.shape == ref.shape and got.dtype == dtype, (what, got.shape, got.dtype)
            v = C.compare(got, ref, g, wide, direction, scale=scale, params=call.act_p)
            assert v.passed, f"{key} {dtype} {what}: {v.describe()}"


# ---- the two backends' array kinds --------------------------------------------------------------------------


class Host:
    backend = "numba"

    @staticmethod
    def to(a):
        return np.array(a, copy=True, order="K")

    @staticmethod
    def back(a):
        return np.asarray(a)


class Device:
    backend = "cuda"

    @staticmethod
    def to(a):
        if REAL:
            from numba import cuda

            return cuda.to_device(np.ascontiguousarray(a))
        from multiact.backend.cuda_sim import to_device

        return to_device(a)

    @staticmethod
    def back(a):
        return a.copy_to_host()


def _layout_case(kind, key: str, dtype, shape, dim: int, layout: str, seed: int = 0, **extra) -> None:
    """One-input form: build x from (gate, up) in `layout` along `dim`, run forward and backward, check."""
    params = {**_call_params(key), **extra}
    op = params.pop("op", "glu")
    half = list(shape)
    gate, up, dy = _inputs(key, dtype, tuple(half), seed)
    full = list(half)
    full[dim] *= 2
    x = np.empty(full, dtype)
    first, second = gated.split(x, dim % x.ndim, layout)
    first[...] = gate
    second[...] = up
    if op != "glu":
        params = {k: v for k, v in params.items() if k not in ("act",)}
    fn, grad = getattr(ma, op), getattr(ma, f"{op}_grad")
    y = kind.back(fn(kind.to(x), dim=dim, layout=layout, backend=kind.backend, **params))
    dx = kind.back(grad(kind.to(dy), kind.to(x), dim=dim, layout=layout, backend=kind.backend, **params))
    dgate, dup = gated.split(dx, dim % x.ndim, layout)
    _check(key, {"op": op, "dim": dim, "layout": layout, **params}, gate, up, dy, y, dgate, dup)


def _two_input_case(kind, key: str, dtype, shape) -> None:
    params = _call_params(key)
    gate, up, dy = _inputs(key, dtype, shape, 1)
    y = kind.back(ma.glu(kind.to(gate), up=kind.to(up), backend=kind.backend, **params))
    dg, du = ma.glu_grad(kind.to(dy), kind.to(gate), up=kind.to(up), backend=kind.backend, **params)
    _check(key, params, gate, up, dy, y, kind.back(dg), kind.back(du))


def _clipped_case(kind, dtype, shape) -> None:
    """GPT-OSS's clipped SwiGLU, interleaved, with the limit hit on both halves."""
    half = shape
    gate, up, dy = _inputs("gated:swish", dtype, half, 2)
    gate = (gate.astype(np.float64) * 1.6).astype(dtype)  # beyond +-7 in places
    up = (up.astype(np.float64) * 3).astype(dtype)
    gate.reshape(-1)[:3] = [7.0, 7.5, -9.0]
    up.reshape(-1)[:4] = [7.0, -7.0, 8.0, -8.0]
    full = list(half)
    full[-1] *= 2
    x = np.empty(full, dtype)
    x[..., 0::2], x[..., 1::2] = gate, up
    p = {"alpha": 1.702, "limit": 7.0, "layout": "interleaved"}
    y = kind.back(ma.swiglu(kind.to(x), backend=kind.backend, **p))
    dx = kind.back(ma.swiglu_grad(kind.to(dy), kind.to(x), backend=kind.backend, **p))
    assert (np.abs(gate) > 7).any() and (np.abs(up) > 7).any()
    _check("gated:swish", {"op": "swiglu", **p}, gate, up, dy, y, dx[..., 0::2], dx[..., 1::2])


def _in_place_case(kind, key: str, dtype, layout: str) -> None:
    """out=x: both halves of dx over x, read before written, element by element."""
    params = _call_params(key)
    gate, up, dy = _inputs(key, dtype, (6, 20), 3)
    x = np.empty((6, 40), dtype)
    first, second = gated.split(x, 1, layout)
    first[...], second[...] = gate, up
    xd = kind.to(x)
    res = ma.glu_grad(kind.to(dy), xd, layout=layout, out=xd, backend=kind.backend, **params)
    assert res is xd
    dx = kind.back(xd)
    dgate, dup = gated.split(dx, 1, layout)
    _check(key, {"layout": layout, **params}, gate, up, dy, None, dgate, dup)
    # the two-input form into its own inputs
    g2, u2 = kind.to(gate), kind.to(up)
    ma.glu_grad(kind.to(dy), g2, up=u2, out=(g2, u2), backend=kind.backend, **params)
    _check(key, params, gate, up, dy, None, kind.back(g2), kind.back(u2))


def _specials_case(kind, key: str, dtype) -> None:
    """NaN, +-inf and -0 in every input: the reference's NaN/inf/signed-zero results, exactly."""
    params = _call_params(key)
    vals = np.array([0.0, -0.0, 1.0, -1.0, 3.0, -3.0, np.inf, -np.inf, np.nan])
    g, u, d = (a.reshape(-1) for a in np.meshgrid(vals, vals, np.array([1.0, -1.0, 0.0, -0.0, np.inf, np.nan]),
                                                  indexing="ij"))
    gate, up, dy = (a.astype(dtype) for a in (g, u, d))
    y = kind.back(ma.glu(kind.to(gate), up=kind.to(up), backend=kind.backend, **params))
    dg, du = ma.glu_grad(kind.to(dy), kind.to(gate), up=kind.to(up), backend=kind.backend, **params)
    _check(key, params, gate, up, dy, y, kind.back(dg), kind.back(du))


# ---- numba ----------------------------------------------------------------------------------------------------

# the numba checks run in the parent process of a CPU run (not in the simulator child, not on a GPU run)
needs_numba = pytest.mark.skipif(CHILD or REAL or not registry.availability("numba")[0],
                                 reason=f"numba checks run on the CPU test run ({registry.availability('numba')[1]})")


@needs_numba
def test_numba_supports_every_gated_key_forward_and_backward():
    nb = registry.module("numba")
    for key in KEYS:
        for dtype in ("float16", "float32", "float64"):
            assert nb.supports(key, "forward", dtype) and nb.supports(key, "backward", dtype), key
        assert not nb.supports(key, "backward_y", "float32") and not nb.supports(key, "param_grad", "float32")
    assert not nb.supports(KEYS[0], "forward", "int32")
    assert registry.select(KEYS[0], "forward", "float32", "numpy", "numba")[0] is nb


@needs_numba
@pytest.mark.parametrize("key", KEYS)
def test_numba_every_key(key):
    skip_unless_sampled("numba", key, KEYS)
    for dtype in (np.float32, np.float16):
        _layout_case(Host, key, dtype, (8, 3, 25), -1, "halves")
    if key in SAMPLE:
        _layout_case(Host, key, np.float64, (8, 3, 25), -1, "halves")


@needs_numba
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
@pytest.mark.parametrize("dim, layout, shape", [(-1, "halves", (7, 3, 20)), (0, "halves", (5, 3, 7)),
                                                (1, "halves", (4, 5, 6)), (-1, "interleaved", (7, 3, 20)),
                                                (0, "interleaved", (5, 3, 7)), (1, "interleaved", (4, 5, 6))])
def test_numba_layouts(dtype, dim, layout, shape):
    _layout_case(Host, "gated:silu", dtype, shape, dim, layout)


@needs_numba
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
def test_numba_two_input_and_odd_views(dtype):
    _two_input_case(Host, "gated:gelu_tanh", dtype, (5, 33))
    # views of any strides: transposed (more than two dims that do not merge), reversed, a 0-d pair
    params = _call_params("gated:silu")
    gate, up, dy = _inputs("gated:silu", dtype, (6, 5, 4), 4)
    views = [(gate.transpose(2, 0, 1), np.asfortranarray(up.transpose(2, 0, 1)), dy.transpose(2, 0, 1)),
             (gate[::-1, :, ::-2], up[:, ::-1, ::-2], dy[::-1, ::-1, ::2]), (gate[0, 0, 0], up[0, 0, 0], dy[0, 0, 0])]
    for g, u, d in views:
        g, u, d = np.asarray(g), np.asarray(u), np.asarray(d)
        y = ma.glu(g, up=u, backend="numba", **params)
        dg, du = ma.glu_grad(d, g, up=u, backend="numba", **params)
        _check("gated:silu", params, g, u, d, y, dg, du)


@needs_numba
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
def test_numba_clipped_swiglu(dtype):
    _clipped_case(Host, dtype, (9, 40))


@needs_numba
@pytest.mark.parametrize("layout", ["halves", "interleaved"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_numba_backward_in_place(dtype, layout):
    _in_place_case(Host, "gated:silu", dtype, layout)


@needs_numba
@pytest.mark.parametrize("key", ["gated:silu", "gated:gelu", "gated:relu", "gated:softplus"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_numba_specials(key, dtype):
    _specials_case(Host, key, dtype)


@needs_numba
def test_numba_parallel_loop_matches_serial(monkeypatch):
    """Past _PAR_MIN elements with two threads the prange loop runs: the same bits as the serial loop."""
    nb = registry.module("numba")
    x = (np.random.default_rng(5).standard_normal((300, 2 * 300)) * 3).astype(np.float32)
    dy = np.random.default_rng(6).standard_normal((300, 300)).astype(np.float32)
    monkeypatch.setattr(nb, "_threads", lambda: 2)
    y2 = ma.swiglu(x, layout="interleaved", backend="numba")
    dx2 = ma.swiglu_grad(dy, x, backend="numba")
    assert nb._gated_loops(("gated:silu", "forward", "float32"))._loops[1] is not None  # the prange loop ran
    monkeypatch.setattr(nb, "_threads", lambda: 1)
    np.testing.assert_array_equal(ma.swiglu(x, layout="interleaved", backend="numba"), y2)
    np.testing.assert_array_equal(ma.swiglu_grad(dy, x, backend="numba"), dx2)
    _layout_case(Host, "gated:silu", np.float32, (300, 300), -1, "interleaved")


# ---- cuda: under the simulator in a child process (or on a GPU with MULTIACT_CUDA_REAL=1) -----------------------


@pytest.mark.skipif(CHILD, reason="the child runs the cuda checks themselves")
@pytest.mark.skipif(REAL, reason="MULTIACT_CUDA_REAL=1: the cuda checks run in this process")
def test_cuda_under_the_simulator(tmp_path):
    pytest.importorskip("numba.cuda")
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1", "MULTIACT_GATED_CUDA_CHILD": "1"}
    xml = tmp_path / "cuda.xml"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-p", "no:xdist",
                           "-k", "cuda_ and not under_the_simulator", f"--junitxml={xml}", str(Path(__file__))],
                          capture_output=True, text=True, env=env, cwd=Path(__file__).resolve().parents[1],
                          timeout=600)
    tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-30:])
    print(tail)
    assert proc.returncode == 0, tail
    import xml.etree.ElementTree as ET

    suite = ET.parse(xml).getroot().find("testsuite")
    assert int(suite.get("tests")) >= 10 and suite.get("skipped") == "0" and suite.get("failures") == "0", tail


needs_cuda = pytest.mark.skipif(not (CHILD or REAL), reason="cuda checks run in the simulator child or on a GPU")


@needs_cuda
def test_cuda_supports_every_gated_key():
    cb = registry.module("cuda")
    assert registry.availability("cuda")[0], registry.availability("cuda")[1]
    for key in KEYS:
        assert cb.supports(key, "forward", "float16") and cb.supports(key, "backward", "float64"), key
    assert not cb.supports(KEYS[0], "backward_y", "float32")


@needs_cuda
@pytest.mark.parametrize("key", CUDA_SAMPLE)
def test_cuda_sample_keys(key):
    for dtype in (np.float32, np.float16, np.float64):
        _layout_case(Device, key, dtype, (3, 10), -1, "halves")


@needs_cuda
@pytest.mark.parametrize("dim, layout, shape", [(0, "halves", (3, 2, 5)), (1, "halves", (2, 3, 4)),
                                                (-1, "interleaved", (3, 12)), (0, "interleaved", (3, 2, 5))])
def test_cuda_layouts(dim, layout, shape):
    _layout_case(Device, "gated:silu", np.float32, shape, dim, layout)
    _layout_case(Device, "gated:silu", np.float16, shape, dim, layout)


@needs_cuda
def test_cuda_two_input_clipped_in_place_specials():
    _two_input_case(Device, "gated:gelu_tanh", np.float32, (4, 9))
    _clipped_case(Device, np.float32, (3, 16))
    _clipped_case(Device, np.float16, (2, 12))
    _in_place_case(Device, "gated:silu", np.float32, "interleaved")
    _in_place_case(Device, "gated:silu", np.float16, "halves")
    _specials_case(Device, "gated:silu", np.float32)
