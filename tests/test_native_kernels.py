"""The native extension seen from below the dispatcher: every kernel symbol of every ISA this
machine runs, called directly, against the float64 reference; tails, in place, threads, the
half conversions, the tail-scaled exponentials, and MULTIACT_NATIVE_ISA.

The shared suite (test_consistency.py) already runs the `native` backend through the public
API on the ISA it picks; this file covers what that cannot see.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import native_kernels

from multiact import consistency as C
from multiact.optable import OPS

ROOT = Path(__file__).resolve().parents[1]
native = pytest.importorskip("multiact._native", reason="the native extension is not built")
lib, ffi = native.lib, native.ffi



K = native_kernels()
ISAS = [isa for isa in K.isas() if lib.ma_isa_supported(isa.encode())]
WIDTH = {"scalar": 1, "avx2": 8, "avx512": 16, "neon": 4}
CT = {"float32": "float[]", "float16": "uint16_t[]", "float64": "double[]"}
# Parameter corners beyond the shared suite's: negative alpha (celu's exp of a positive
# argument), tiny and large beta.
EXTRA_CASES = {
    "celu": ({"alpha": -1.5},), "elu": ({"alpha": -0.5},), "swish": ({"beta": 1e-3}, {"beta": 40.0}),
    "softplus": ({"beta": 50.0, "threshold": 100.0},),
}


def _rows(signatures=("unary", "binary", "ternary")):
    """The float32, float16 and float64 kernels (bfloat16's: test_native_bf16.py, bit for bit against float32's)."""
    seen, out = set(), []
    for k in K.table():
        if (k.signature in signatures and k.isa in ISAS and k.dtype != "bfloat16"
                and (k.symbol, k.direction) not in seen):
            seen.add((k.symbol, k.direction))
            out.append(k)
    return out


def _params(k) -> list[dict]:
    spec = OPS[k.op]
    if k.op == "prelu":
        return [{"weight": 0.25}]  # backward2 only (its own signature otherwise): f'' is 0 whatever the weight
    cases = C.key_cases(spec, k.key) + list(EXTRA_CASES.get(k.op, ()))
    if k.direction == "backward_y":
        cases = [c for c in cases if spec.supports_y(spec.validate(c))]
    return [spec.validate(c) for c in cases]


def _pack(k, p: dict):
    """ma_params as the runtime fills it: a..d rounded to float32, da..dd as given (the float64 kernels')."""
    vals = [float(p[n]) for n in K.params_of(k.cname)] + [0.0] * (4 - len(K.params_of(k.cname)))
    return ffi.new("ma_params *", {**dict(zip("abcd", vals, strict=True)),
                                   **{"d" + f: v for f, v in zip("abcd", vals, strict=True)}})


def _call(k, p: dict, *arrays: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    fn = getattr(lib, k.symbol)
    out = np.empty_like(arrays[-1]) if out is None else out
    ct = CT[k.dtype]
    fn(*(ffi.from_buffer(ct, a) for a in arrays), ffi.from_buffer(ct, out), out.size, _pack(k, p))
    return out


def _inputs(k, p: dict, n: int = 600):
    spec, dtype = OPS[k.op], np.dtype(k.dtype)
    x = C.sample_x(spec, p, dtype, n=n)
    # the exponential tails where a subnormal factor meets a normal result
    tails = np.array([-13.1, -13.0, -60.0, -85.0, -88.0, -90.0, -95.0, -103.0, -110.0, 45.0, 50.0, 60.0, 88.0],
                     dtype=np.float64)
    with np.errstate(over="ignore"):
        x = np.concatenate([x, tails.astype(dtype), (-tails).astype(dtype)])
    dy = np.random.default_rng(1).standard_normal(x.size).astype(dtype) * dtype.type(3)
    return x, dy


def _g_of(dy):
    """backward2's upstream gradient: elementwise in dy, so a slice of the inputs slices it too."""
    return dy * dy.dtype.type(-0.7) + dy.dtype.type(0.25)


def _check(k, p, got, x, dy):
    spec = OPS[k.op]
    if k.direction == "backward2":
        g, rp = _g_of(dy), p
        if k.op == "prelu":
            rp, g, dy, x, got = {"weight": np.array([[0.25]]), "axis": 1}, *(a.reshape(-1, 1) for a in (g, dy, x, got))
        ref = C.backward2_reference(spec, rp, k.dtype, g, dy, x)
        return C.compare(got, ref, x, C.backward2_tolerance(spec), "backward2", params=p,
                         scale=g.astype(np.float64) * dy, zero_sign=C.backward2_zero_sign(spec, rp, k.dtype, g, dy, x))
    if k.direction == "forward":
        ref = C.reference(spec, "forward", p, k.dtype, x)
        return C.compare(got, ref, x, spec, "forward", params=p)
    if k.direction == "backward":
        ref = C.reference(spec, "backward", p, k.dtype, dy, x)
        return C.compare(got, ref, x, spec, "backward", scale=dy, params=p)
    ref = C.reference(spec, "backward_y", p, k.dtype, dy, x)
    with np.errstate(over="ignore"):  # float64 y near its largest finite value
        scale = dy.astype(np.float64) * x
    return C.compare(got, ref, x, spec, "backward_y", scale=scale)


def _run(k, p, x, dy, out=None):
    if k.direction == "forward":
        return _call(k, p, x, out=out)
    if k.direction == "backward2":
        return _call(k, p, _g_of(dy), dy, x, out=out)
    return _call(k, p, dy, x, out=out)


def _y_of(k, p, x):
    with np.errstate(all="ignore"):
        return np.asarray(C.reference(OPS[k.op], "forward", p, k.dtype, x)).astype(k.dtype)


ROWS = _rows()


def test_embedded_table_is_the_source_table():
    embedded = ffi.string(lib.ma_kernel_table()).decode()
    assert embedded == K.table_text()
    for k in K.table():
        assert hasattr(lib, k.symbol), k.symbol


def test_every_public_op_has_all_its_kernels():
    for op, spec in OPS.items():
        for dtype in K.DTYPES:
            have = {k.direction for k in K.table() if k.op == op and k.dtype == dtype}
            want = {"forward", "backward"} | ({"backward_y"} if spec.backward_y else set()) | (
                {"param_grad"} if spec.param_grad else set()) | ({"backward2"} if spec.backward2 else set())
            if dtype == "float64":  # the elementwise directions (param_grad is a reduction: numba), or backward2
                elementwise = want - {"param_grad"}  # only (prelu, whose forward takes a weight)
                assert have in (elementwise, want & {"backward2"}), (op, have)
                continue
            assert have == want, (op, dtype)


@pytest.mark.parametrize("k", ROWS, ids=lambda k: f"{k.isa}-{k.dtype}-{k.cname}-{k.direction}")
def test_kernel_matches_reference(k):
    for p in _params(k):
        x, dy = _inputs(k, p)
        if k.direction == "backward_y":
            x = _y_of(k, p, x)
        v = _check(k, p, _run(k, p, x, dy), x, dy)
        assert v.passed, f"{p}: {v.describe()}"


@pytest.mark.parametrize("k", [k for k in ROWS if k.isa != "scalar"], ids=lambda k: f"{k.isa}-{k.dtype}-{k.cname}")
def test_tails_round_like_the_main_loop(k):
    """Every n around the vector width and the two-vector unroll gives exactly the long-run values."""
    p = _params(k)[0]
    x, dy = _inputs(k, p, n=90)
    if k.direction == "backward_y":
        x = _y_of(k, p, x)
    full = _run(k, p, x, dy)
    w = max(1, WIDTH[k.isa] // (2 if k.dtype == "float64" else 1))  # float64: half the lanes
    for n in sorted({1, w - 1, w, w + 1, 2 * w - 1, 2 * w, 2 * w + 1, 7 * 2 * w + 3}):
        part = _run(k, p, x[:n].copy(), dy[:n].copy())
        np.testing.assert_array_equal(part, full[:n], err_msg=f"n={n}")
        # shifted start: unaligned pointers, other lanes
        part = _run(k, p, x[1 : n + 1].copy(), dy[1 : n + 1].copy())
        np.testing.assert_array_equal(part, full[1 : n + 1], err_msg=f"n={n} shifted")


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_in_place_equals_out_of_place(isa, dtype):
    for k in [k for k in ROWS if k.isa == isa and k.dtype == dtype]:
        p = _params(k)[0]
        x, dy = _inputs(k, p, n=60)
        want = _run(k, p, x, dy)
        buf = (x if k.direction == "forward" else dy).copy()
        if k.direction == "forward":
            _call(k, p, buf, out=buf)
        elif k.direction == "backward2":
            _call(k, p, _g_of(buf), buf, x, out=buf)
        else:
            _call(k, p, buf, x, out=buf)
        np.testing.assert_array_equal(buf, want, err_msg=k.symbol)


def test_isas_agree_within_tolerance():
    """Each ISA is held to the reference; here also to each other, op by op, on one grid."""
    if len(ISAS) < 2:
        pytest.skip("only one ISA runs on this machine")
    by = {}
    for k in ROWS:
        by.setdefault((k.cname, k.direction, k.dtype), {})[k.isa] = k
    for _, ks in by.items():
        ka, kb = ks[ISAS[0]], ks[ISAS[1]]
        p = _params(ka)[0]
        x, dy = _inputs(ka, p, n=300)
        if ka.direction == "backward_y":
            x = _y_of(ka, p, x)
        a, b = _run(ka, p, x, dy), _run(kb, p, x, dy)
        assert np.array_equal(np.isnan(a), np.isnan(b)), ka.cname


@pytest.mark.parametrize("isa", ISAS)
def test_exponential_tails_keep_relative_accuracy(isa):
    """x * e^x style results stay within a few ULP where e^x alone is subnormal (the eK / sc scaling)."""
    cases = [("silu", "forward", -90.0), ("mish", "forward", -90.0),
             ("gelu", "forward", -13.0), ("silu", "backward", -90.0), ("tanh", "backward", 43.5),
             ("sigmoid", "backward", 86.5), ("elu", "backward", -86.5), ("gelu", "backward", -12.9)]
    for op, direction, xv in cases:
        k = next(k for k in ROWS if k.isa == isa and k.op == op and k.direction == direction
                 and k.dtype == "float32" and k.cname not in ("gelu_tanh", "gelu_tanh_grad"))
        x = np.array([xv, xv - 0.1, xv + 0.1], dtype=np.float32)
        dy = np.array([1.5, -0.75, 2.0], dtype=np.float32)
        spec = OPS[op]
        p = spec.validate({})
        got = _run(k, p, x, dy).astype(np.float64)
        ref = np.asarray(C.reference(spec, direction, p, "float32", *((x,) if direction == "forward" else (dy, x))))
        normal = np.abs(ref) > np.finfo(np.float32).tiny
        assert normal.sum() >= 2, (op, ref)
        ulps = (np.abs(got - ref) / np.spacing(np.abs(ref).astype(np.float32)))[normal]
        assert ulps.max() <= 8, (op, direction, xv, got, ref, ulps)


def test_costs_name_real_kernels_and_scale_the_threading_threshold():
    """Expensive kernels go parallel at fewer elements: the threshold is on elements x cost."""
    listed = set(K.UNARY) | set(K.BINARY) | set(K.TERNARY) | set(K.GATED) | set(K.BIAS)
    assert set(K.COST) <= listed | {"swish_beta_grad"}
    n = lib.ma_get_parallel_min() // 8  # below the minimum as elements, above it as gelu's work
    assert lib.ma_chunks_for(n, 1, 2) == 1
    assert lib.ma_chunks_for(n, K.COST["gelu"], 2) > 1
    assert lib.ma_chunks_for(n, K.COST["gelu"], 1) == 1


def test_split_kernels_are_found_in_the_op_bodies():
    """The loops test a whole step for the kernels with a fast path; a header line the pattern missed
    would quietly lose that (every kernel still computes the same bits, only slower)."""
    header = Path(K.__file__).parent / "src" / "ma_ops.h"
    lines = header.read_text().splitlines()
    n_split = sum(ln.startswith("MA_SPLIT_") for ln in lines)  # every variant (mish_grad's is MA_SPLIT_BINARY_IF)
    n_gate = sum(ln.startswith("MA_GATE_OPS(") for ln in lines)
    split = K.split_kernels()
    assert len(split) == n_split + 2 * n_gate and split <= set(K.UNARY) | set(K.BINARY)
    assert {"sigmoid", "silu", "silu_grad", "gelu", "gelu_grad", "mish_grad"} <= split and "relu" not in split
    assert "MA_UNARY(gelu, split)" in K.x_macro_header() and "MA_UNARY(relu, plain)" in K.x_macro_header()


@pytest.mark.parametrize("isa", ISAS)
def test_threads_split_exactly(isa):
    """The thread pool's split gives the same bits as one thread (cut points are whole vectors)."""
    k = next(k for k in ROWS if k.isa == isa and k.cname == "gelu_tanh" and k.dtype == "float32")
    x = np.random.default_rng(2).standard_normal(100_003).astype(np.float32)
    fn = ffi.cast("void *", ffi.addressof(lib, k.symbol))
    old = lib.ma_get_parallel_min()
    try:
        lib.ma_set_parallel_min(1000)
        outs = []
        for nt in (1, 2, 3):
            y = np.empty_like(x)
            lib.ma_run_unary(fn, ffi.from_buffer(x), ffi.from_buffer(y), x.size, 4, 1, 0, 0, 0, 0, nt)
            outs.append(y)
    finally:
        lib.ma_set_parallel_min(old)
    np.testing.assert_array_equal(outs[0], outs[1])
    np.testing.assert_array_equal(outs[0], outs[2])
    np.testing.assert_array_equal(outs[0], _call(k, {}, x))


def test_half_conversions_match_numpy():
    bits = np.arange(1 << 16, dtype=np.uint16)
    f = np.empty(bits.size, np.float32)
    lib.ma_f16_to_f32(ffi.from_buffer("uint16_t[]", bits), ffi.from_buffer("float[]", f), bits.size)
    want = bits.view(np.float16).astype(np.float32)
    np.testing.assert_array_equal(f.view(np.uint32)[~np.isnan(want)], want.view(np.uint32)[~np.isnan(want)])
    assert np.isnan(f[np.isnan(want)]).all()
    rng = np.random.default_rng(4)
    xs = np.concatenate([
        rng.standard_normal(100_000).astype(np.float32) * np.float32(2.0) ** rng.integers(-30, 20, 100_000),
        want[~np.isnan(want)],
        (want[~np.isnan(want)].astype(np.float64) + np.spacing(want[~np.isnan(want)]).astype(np.float64) / 2)
        .astype(np.float32),  # ties
        np.array([65504, 65519.99, 65520, 1e30, -1e30, np.inf, -np.inf, 2.0**-25, 2.0**-26, 3 * 2.0**-26],
                 dtype=np.float32),
    ]).astype(np.float32)
    h = np.empty(xs.size, np.uint16)
    lib.ma_f32_to_f16(ffi.from_buffer("float[]", xs), ffi.from_buffer("uint16_t[]", h), xs.size)
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(h, xs.astype(np.float16).view(np.uint16))
    nan = np.array([np.nan, -np.nan], np.float32)
    hn = np.empty(2, np.uint16)
    lib.ma_f32_to_f16(ffi.from_buffer("float[]", nan), ffi.from_buffer("uint16_t[]", hn), 2)
    assert np.isnan(hn.view(np.float16)).all()


def _backend_in_subprocess(isa: str) -> str:
    code = ("from multiact import registry; nb = registry.module('native'); ok, why = nb.available(); "
            "print(ok, nb.info().get('isa'), why, sep='|')")
    env = {**os.environ, "MULTIACT_NATIVE_ISA": isa}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout


def test_forced_isa_is_used_and_a_missing_one_is_refused():
    for isa in ISAS:
        ok, got, _ = _backend_in_subprocess(isa).strip().split("|")
        assert ok == "True" and got == isa
    missing = "neon" if "avx2" in K.isas() else "avx2"
    ok, _, why = _backend_in_subprocess(missing).strip().split("|")
    assert ok == "False" and "MULTIACT_NATIVE_ISA" in why and missing in why
    for isa in set(K.isas()) - set(ISAS):  # built but not run here (avx512 on a CPU without it): the reason
        reason = ffi.string(lib.ma_isa_why(isa.encode())).decode()
        ok, _, why = _backend_in_subprocess(isa).strip().split("|")
        assert ok == "False" and reason and reason in why and "not supported by this machine" in why


def test_avx512_needs_every_cpuid_bit_and_the_os_zmm_state():
    """The avx512 decision (ma_x86_avx512_why, fed CPUID and XCR0 words of CPUs this machine is not): F, BW,
    DQ and VL in CPUID leaf 7 EBX, OSXSAVE, and XCR0 with the opmask and ZMM state (bits 5-7) and SSE/AVX (1-2)."""
    def why(ecx1, ebx7, xcr0):
        return ffi.string(lib.ma_x86_avx512_why(ecx1, ebx7, xcr0)).decode()

    f, dq, bw, vl, osxsave, full = 1 << 16, 1 << 17, 1 << 30, 1 << 31, 1 << 27, 0xE7
    assert why(osxsave, f | dq | bw | vl, full) == ""
    assert why(osxsave, f | dq | bw | vl, 0x2E7) == ""  # other state components do not matter
    assert "AVX512F" in why(osxsave, dq | bw | vl, full)
    assert "AVX512BW" in why(osxsave, f | dq | vl, full)
    assert "AVX512DQ" in why(osxsave, f | bw | vl, full)
    assert "AVX512VL" in why(osxsave, f | dq | bw, full)
    assert "OSXSAVE" in why(0, f | dq | bw | vl, full)
    for missing in (5, 6, 7, 1, 2):  # the OS enabled AVX but not the opmask / ZMM state (or less)
        assert "XCR0" in why(osxsave, f | dq | bw | vl, full & ~(1 << missing))
    assert (lib.ma_isa_supported(b"avx512") == 1) == ("avx512" in ISAS)


def test_backend_reports_isa_and_what_float64_leaves_to_others():
    from multiact import registry

    nb = registry.module("native")
    ok, why = nb.available()
    assert ok, why
    assert nb.info()["isa"] in ISAS
    assert nb.supports("gelu", "forward", "float32") and nb.supports("prelu", "param_grad", "float16")
    assert nb.supports("gelu", "backward", "bfloat16") and nb.supports("prelu", "param_grad", "bfloat16")
    assert nb.supports("gelu", "forward", "float64") and nb.supports("gelu", "backward2", "float64")
    assert not nb.supports("swish", "param_grad", "float64") and not nb.supports("prelu", "forward", "float64")
    assert not nb.supports("gelu", "backward_y", "float32")


def test_pool_under_concurrent_callers_and_for_prelu_and_beta_grad():
    """Several Python threads calling at once (the GIL is released) all get exact results; the
    pooled prelu and the chunked beta gradient equal their one-thread runs."""
    import threading

    isa = ISAS[-1]
    k = next(k for k in ROWS if k.isa == isa and k.cname == "sigmoid" and k.dtype == "float32")
    fn = ffi.cast("void *", ffi.addressof(lib, k.symbol))
    rng = np.random.default_rng(6)
    xs = [rng.standard_normal(300_001).astype(np.float32) for _ in range(4)]
    old = lib.ma_get_parallel_min()
    lib.ma_set_parallel_min(1000)
    try:
        outs = [np.empty_like(x) for x in xs]

        def go(i):
            for _ in range(3):
                lib.ma_run_unary(fn, ffi.from_buffer(xs[i]), ffi.from_buffer(outs[i]), xs[i].size, 4, 1, 0, 0, 0, 0, 2)

        threads = [threading.Thread(target=go, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for x, o in zip(xs, outs, strict=True):
            np.testing.assert_array_equal(o, _call(k, {}, x))
        x, dy = xs[0][:280_000].reshape(7, -1).copy(), xs[1][:280_000].reshape(7, -1).copy()
        w = np.linspace(-1, 1, 7).astype(np.float32)
        prelu = getattr(lib, f"ma_f32_prelu__{isa}")
        res = []
        for nt in (1, 2):
            y = np.empty_like(x)
            prelu(ffi.from_buffer("float[]", dy), ffi.from_buffer("float[]", x), ffi.from_buffer("float[]", y),
                  1, 7, 40_000, ffi.from_buffer("float[]", w), nt)
            res.append(y)
        np.testing.assert_array_equal(res[0], res[1])
        np.testing.assert_array_equal(res[0], np.where(x > 0, dy, dy * w[:, None]))
        bg = getattr(lib, f"ma_f32_swish_beta_grad__{isa}")
        bdy, bx = ffi.from_buffer("float[]", dy), ffi.from_buffer("float[]", x)
        b1, b2 = (bg(bdy, bx, x.size, 1.3, 1, nt) for nt in (1, 2))
        assert b1 == b2
    finally:
        lib.ma_set_parallel_min(old)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_prelu_layouts_through_the_backend(dtype):
    """Fortran order (channels found in reversed memory order), strided (NumPy fallback), in place."""
    import multiact as ma

    rng = np.random.default_rng(8)
    base = (rng.standard_normal((4, 6, 5)) * 2).astype(dtype)
    dy = rng.standard_normal(base.shape).astype(dtype)
    spec = OPS["prelu"]
    for axis in (0, 1, 2):
        w = np.linspace(-0.5, 1.5, base.shape[axis]).astype(dtype)
        shape = [1] * 3
        shape[axis] = w.size
        wb = w.reshape(shape).astype(np.float64)
        for x in (base, np.asfortranarray(base), base[:, ::-1, :], base.transpose(1, 0, 2).copy().transpose(1, 0, 2)):
            want = spec.forward(x.astype(np.float64), wb, axis)
            v = C.compare(ma.prelu(x, w, axis=axis, backend="native"), want, x, spec, "forward")
            assert v.passed, v.describe()
            g = ma.prelu_grad(dy, x, w, axis=axis, backend="native")
            v = C.compare(g, spec.backward(dy.astype(np.float64), x.astype(np.float64), wb, axis), x, spec,
                          "backward", scale=dy)
            assert v.passed, v.describe()
            wg = ma.prelu_weight_grad(dy, x, w, axis=axis, backend="native")
            np.testing.assert_allclose(wg.astype(np.float64), spec.param_grad[1](
                dy.astype(np.float64), x.astype(np.float64), w, axis), rtol=2e-3, atol=1e-2)
            inplace = x.copy(order="K")
            ma.prelu(inplace, w, axis=axis, out=inplace, backend="native")
            v = C.compare(inplace, want, x, spec, "forward")
            assert v.passed, v.describe()


DENSE_OPS = ("gelu", "gelu_tanh", "fast_gelu", "silu", "swish", "mish", "sigmoid", "logsigmoid", "tanh", "softplus",
             "tanhshrink", "elu", "selu", "celu", "softsign")


@pytest.mark.parametrize("isa", ISAS)
def test_dense_grid_float32(isa):
    """The transcendental kernels on 60K points: a fine sweep of [-16, 12] and magnitudes 1e-30..1e30."""
    lin = np.linspace(-16, 12, 40_001)
    mags = np.logspace(-30, 30, 10_000)
    grid = np.concatenate([lin, mags, -mags]).astype(np.float32)
    dy = np.random.default_rng(3).standard_normal(grid.size).astype(np.float32)
    for k in ROWS:
        if k.isa != isa or k.dtype != "float32" or k.direction == "backward_y":
            continue
        base = k.cname[:-5] if k.cname.endswith("_grad") else k.cname
        if base not in DENSE_OPS:
            continue
        for p in _params(k):
            v = _check(k, p, _run(k, p, grid, dy), grid, dy)
            assert v.passed, f"{k.symbol} {p}: {v.describe()}"


@pytest.mark.parametrize("isa", ISAS)
def test_every_float16_value_forward(isa):
    """All 65536 half inputs through every forward kernel: computed in float32, rounded once."""
    x = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    for k in ROWS:
        if k.isa == isa and k.dtype == "float16" and k.direction == "forward":
            p = _params(k)[0]
            v = _check(k, p, _run(k, p, x, x), x, x)
            assert v.passed, f"{k.symbol} {p}: {v.describe()}"


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_large_calls_with_streaming_stores_match(dtype):
    """Calls above the cache size take the non-temporal store path: any alignment, in place too."""
    isa = ISAS[-1]
    rng = np.random.default_rng(11)
    n = (8 << 20) // np.dtype(dtype).itemsize + 37
    base = (rng.standard_normal(n + 8) * 4).astype(dtype)
    for cname, off_x, off_y in (("gelu_tanh", 0, 0), ("gelu_tanh", 1, 3), ("sigmoid_grad", 2, 5)):
        k = next(k for k in ROWS if k.isa == isa and k.cname == cname and k.dtype == dtype)
        x = base[off_x : off_x + n]
        want = _run(k, {}, x, x)  # direct call: regular stores
        buf = np.empty(n + 8, dtype=dtype)
        out = buf[off_y : off_y + n]
        fn = ffi.cast("void *", ffi.addressof(lib, k.symbol))
        if k.signature == "unary":
            lib.ma_run_unary(fn, ffi.from_buffer(x), ffi.from_buffer(out), n, x.itemsize, 1, 0, 0, 0, 0, 1)
        else:
            lib.ma_run_binary(fn, ffi.from_buffer(x), ffi.from_buffer(x), ffi.from_buffer(out), n, x.itemsize,
                              1, 0, 0, 0, 0, 1)
        np.testing.assert_array_equal(out, want, err_msg=f"{cname} offsets {off_x},{off_y}")
        if k.signature == "unary":
            inplace = x.copy()
            lib.ma_run_unary(fn, ffi.from_buffer(inplace), ffi.from_buffer(inplace), n, x.itemsize, 1, 0, 0, 0, 0, 1)
            np.testing.assert_array_equal(inplace, want)


def test_helper_threads_compute_in_the_callers_flush_to_zero_mode():
    """With torch.set_flush_denormal(True) in the calling thread, a pooled call over subnormals gives
    the one-thread bits on every chunk; the same once the caller stops flushing (helpers started
    while it flushed included)."""
    torch = pytest.importorskip("torch")
    import multiact as ma

    x = np.resize(np.float32([1e-39, -1e-39, 3e-41, -2.5e-40, 1.0, -1.0]), 1 << 20)  # past the threading threshold
    calls = {"relu": lambda: ma.relu(x, backend="native"),
             "leaky_relu": lambda: ma.leaky_relu(x, 0.5, backend="native")}

    def agree(threads: int) -> None:
        for name, call in calls.items():
            ma.set_num_threads(1)
            want = call().view(np.uint32)
            ma.set_num_threads(threads)
            for _ in range(5):
                got = call().view(np.uint32)
                assert (got == want).all(), f"{name} on {threads} threads: {int((got != want).sum())} elements differ"

    old = ma.get_num_threads()
    try:
        ma.set_num_threads(2)
        calls["relu"]()  # a helper started before the caller flushes
        torch.set_flush_denormal(True)
        try:
            agree(2)
            agree(3)  # starts a helper while the caller flushes
        finally:
            torch.set_flush_denormal(False)
        agree(3)
    finally:
        ma.set_num_threads(old)
