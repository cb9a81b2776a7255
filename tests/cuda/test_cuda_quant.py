"""quant= on CUDA arrays (issue 46 item 1): the cuda backend's quantizing kernels under the simulator.

`ma.<op>(x_dev, quant=Q)` (and `ma.<op>_grad(dy_dev, x_dev, quant=Q)`) is bit for bit `ma.quantize` of the same
backend's float32 result on x widened to float32 (multiact.quant's contract "on a backend": the cuda formulas'
float32 results differ from the host backends' by ulps in the transcendental ops, as the float kernels do), codes
and scales, for a sample of the table's ops (every op with MULTIACT_TEST_FULL=1; their backwards from dy and x,
and from dy and y) and swiglu, every granularity and target, float32, float16 and
bfloat16 inputs, rows holding NaN, +-inf, -0, all zeros, values beyond the format's range, subnormal codes and
scales that underflow to 2^-149; strided, non-mergeable and 0-d layouts; SimDeviceArrays (ml_dtypes codes)
and Numba's own simulated arrays (uint8 codes).  With MULTIACT_CUDA_REAL=1 (scripts/gpu_check.sh) the op, swiglu
and error tests run on the GPU with Numba device arrays (codes and E8M0 scales as uint8 bits).  The float8
conversion the kernels compile is also run on the host, on NumPy uint32 arrays, against ml_dtypes through
ma.quantize with scale 1.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import multiact as ma
from multiact import consistency as C
from multiact import registry
from multiact.optable import OPS

cuda = pytest.importorskip("numba.cuda")
ml_dtypes = pytest.importorskip("ml_dtypes")
OK, WHY = registry.availability("cuda")
pytestmark = pytest.mark.skipif(not OK, reason=f"cuda: {WHY}")
REAL = os.environ.get("MULTIACT_CUDA_REAL") == "1"  # scripts/gpu_check.sh: Numba device arrays on the GPU
sim_only = pytest.mark.skipif(REAL, reason="SimDeviceArray layouts and FakeCUDAArray kinds: the simulator's")
FULL = os.environ.get("MULTIACT_TEST_FULL") == "1"
BF = np.dtype(ml_dtypes.bfloat16)

QUANTS = [ma.Quant("float8_e4m3fn", "tensor"), ma.Quant("float8_e4m3fn", "tensor", scale=0.03),
          ma.Quant("int8", "tensor", pow2=True),
          ma.Quant("float8_e5m2", "token"), ma.Quant("int8", "token"),
          ma.Quant("int8", "group", group_size=32), ma.Quant("float8_e4m3fn", "group", group_size=64, pow2=True),
          ma.Quant("float8_e5m2", "group", group_size=128, scale_ub=5.0, amax_floor=1e-3),
          ma.Quant("float8_e4m3fn", "mx"), ma.Quant("float8_e5m2", "mx", rule="floor"),
          ma.Quant("float8_e4m3fn", "mx", rule="floor"), ma.Quant("float8_e5m2", "mx")]


def _dev(a: np.ndarray):
    if REAL:
        return cuda.to_device(np.ascontiguousarray(a))
    from multiact.backend.cuda_sim import to_device

    return to_device(a)


def _x(dtype=np.float32) -> np.ndarray:
    """4 x 128: a ramp; all zeros; the specials and values beyond float8's range; a group with one large value
    and tiny ones (subnormal codes) beside a group of float32 subnormals (a scale that underflows)."""
    x = np.linspace(-9, 9, 512).astype(np.float32).reshape(4, 128)
    x[1] = 0.0
    x[2, :8] = (np.nan, np.inf, -np.inf, -0.0, 1e4, -3e4, 7e4, 65504.0)
    x[3, :64] = np.linspace(-2e-3, 2e-3, 64)
    x[3, 0] = 300.0
    x[3, 64:] = np.float32(1e-42) * np.arange(64)
    with np.errstate(over="ignore"):  # 7e4 is inf in float16: one more special there
        return x.astype(dtype)


def _bits(a) -> np.ndarray:
    a = np.ascontiguousarray(np.asarray(a)).reshape(-1)
    return a.view(np.uint8) if a.dtype.itemsize == 1 else a.view(np.uint32)


def _same(got, want, what: str) -> None:
    assert len(got) == len(want) == 2, what
    for g, w in zip(got, want, strict=True):
        h = g.copy_to_host()  # on a GPU, Numba arrays: float8 codes and E8M0 scales as uint8 bits
        assert h.shape == w.shape and (REAL or h.dtype == w.dtype), (what, h.shape, w.shape, h.dtype, w.dtype)
        np.testing.assert_array_equal(_bits(h), _bits(w), err_msg=what)


def _ops() -> list[str]:
    mod = registry.module("cuda")
    names = [n for n in sorted(OPS) if not OPS[n].defn.array_param and mod.supports(n, "forward", "float32")]
    return names if FULL else names[::4]


@pytest.mark.parametrize("name", _ops())
def test_ops_quantize_their_float32_result_on_the_device(name):
    p = C.param_cases(OPS[name])[-1]
    want_y = ma.forward(name, _dev(_x()), **p).copy_to_host()  # the backend's float32 result
    for i, q in enumerate(QUANTS):
        _same(ma.forward(name, _dev(_x()), quant=q, **p), ma.quantize(want_y, q), f"{name} float32 {q}")
        for dtype in (np.float16, BF):  # narrower inputs: a turn of the quants each
            if FULL or i % 4 == (len(name) + (dtype == BF)) % 4:
                x = _x(dtype)
                wy = ma.forward(name, _dev(x.astype(np.float32)), **p).copy_to_host()
                _same(ma.forward(name, _dev(x), quant=q, **p), ma.quantize(wy, q), f"{name} {x.dtype} {q}")


@pytest.mark.parametrize("name", _ops())
def test_backwards_quantize_their_float32_result_on_the_device(name):
    """dx from dy and x (and from dy and y where the op has that form) quantized in the same kernels."""
    spec = OPS[name]
    p = C.param_cases(spec)[-1]
    x = _x()
    dy = np.linspace(-2, 2, x.size).astype(np.float32).reshape(x.shape)[:, ::-1].copy()
    dy[0, 5] = np.nan
    forms = [{"x": x}]
    if spec.supports_y(ma.optable.get(name).validate(p, name), np.dtype(np.float32)):
        forms.append({"y": ma.forward(name, x, **p)})
    qs = QUANTS if FULL else QUANTS[len(name) % 3::3]  # a third of the quants per op (every one with FULL)
    for form in forms:
        for i, q in enumerate(qs):
            dev = {k: _dev(v) for k, v in form.items()}
            want = ma.backward(name, _dev(dy), **dev, **p).copy_to_host()
            _same(ma.backward(name, _dev(dy), **dev, quant=q, **p), ma.quantize(want, q),
                  f"{name} backward ({next(iter(form))}) float32 {q}")
            if FULL or i % 2 == len(name) % 2:  # bfloat16 dy and x: every other quant
                db, xb = dy.astype(BF), {k: v.astype(BF) for k, v in form.items()}
                want = ma.backward(name, _dev(db.astype(np.float32)),
                                   **{k: _dev(v.astype(np.float32)) for k, v in xb.items()}, **p).copy_to_host()
                _same(ma.backward(name, _dev(db), **{k: _dev(v) for k, v in xb.items()}, quant=q, **p),
                      ma.quantize(want, q), f"{name} backward bfloat16 {q}")


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_swiglu_quantizes_on_the_device(dtype):
    x = _x(dtype)  # gate | up halves of 64
    wy = ma.swiglu(_dev(x.astype(np.float32))).copy_to_host()
    fits = [q for q in QUANTS if (q.block or 0) <= x.shape[-1] // 2]  # the result's rows are 64 long
    qs = fits if FULL else [q for q in fits if q.block in (None, 32)][::2]
    for q in qs:
        _same(ma.swiglu(_dev(x), quant=q), ma.quantize(wy, q), f"swiglu {dtype.__name__} {q}")
    up = _x(dtype)[:, ::-1].copy()
    wy = ma.swiglu(_dev(x.astype(np.float32)), up=_dev(up.astype(np.float32))).copy_to_host()
    q = ma.Quant("float8_e4m3fn", "group", group_size=64)
    _same(ma.swiglu(_dev(x), up=_dev(up), quant=q), ma.quantize(wy, q), "swiglu(x, up=)")
    wy = ma.swiglu(_dev(x.astype(np.float32)), limit=7.0).copy_to_host()  # the clamped form: limit and shift
    q = ma.Quant("float8_e5m2", "mx")
    _same(ma.swiglu(_dev(x), limit=7.0, quant=q), ma.quantize(wy, q), "swiglu(x, limit=7)")


@sim_only
def test_layouts_strided_unmergeable_zero_d_and_empty():
    x = np.linspace(-4, 4, 3 * 4 * 128).astype(np.float32).reshape(3, 4, 128)
    d = _dev(x)
    cases = [(d[:, ::2, :], x[:, ::2, :]), (d[:, :, ::2], x[:, :, ::2]), (d[::-1, 1:, :64], x[::-1, 1:, :64]),
             (_dev(np.asfortranarray(x[0])), x[0])]
    for q in (ma.Quant("float8_e4m3fn", "group", group_size=32), ma.Quant("int8", "tensor"),
              ma.Quant("float8_e5m2", "mx"), ma.Quant("float8_e4m3fn", "token")):
        for dv, hv in cases:
            wy = ma.gelu(_dev(np.ascontiguousarray(hv))).copy_to_host()
            _same(ma.gelu(dv, quant=q), ma.quantize(wy, q), f"{hv.shape} {q}")
    x64 = _x().astype(np.float64)  # float64 in: computed in float64, each result rounded once to float32
    for q in (ma.Quant("float8_e5m2", "group", group_size=32), ma.Quant("int8", "tensor")):
        _same(ma.silu(_dev(x64), quant=q), ma.quantize(ma.silu(_dev(x64)).copy_to_host(), q), f"float64 {q}")
    q = ma.Quant("float8_e4m3fn", "tensor")
    _same(ma.silu(_dev(np.float32(3.0)), quant=q), ma.quantize(ma.silu(_dev(np.float32(3.0))).copy_to_host(), q),
          "0-d")
    for q in (ma.Quant("float8_e4m3fn", "tensor"), ma.Quant("int8", "group", group_size=32)):
        e = np.zeros((0, 64), np.float32)
        _same(ma.relu(_dev(e), quant=q), ma.quantize(e, q), f"empty {q}")


@sim_only
def test_numba_arrays_get_uint8_codes_of_the_same_bits():
    x = _x()
    for q in (ma.Quant("float8_e5m2", "group", group_size=32), ma.Quant("float8_e4m3fn", "mx"),
              ma.Quant("int8", "token")):
        c, s = ma.mish(cuda.to_device(x), quant=q)
        assert type(c).__name__ == "FakeCUDAArray" and c.dtype == (np.int8 if q.dtype == "int8" else np.uint8)
        wc, ws = ma.quantize(ma.mish(_dev(x)).copy_to_host(), q)
        np.testing.assert_array_equal(_bits(c.copy_to_host()), _bits(wc))
        np.testing.assert_array_equal(_bits(s.copy_to_host()), _bits(ws))


def test_what_the_device_does_not_quantize_is_a_type_error_naming_it():
    x = _dev(_x())
    q = ma.Quant("int8", "token", symmetric=False)
    with pytest.raises(TypeError, match=r"silu\(\): quant= on cuda arrays .*zero point"):
        ma.silu(x, quant=q)
    with pytest.raises(TypeError, match=r"bias_act_grad\(\): quant= on cuda arrays .* backward"):
        ma.bias_act_grad(x, x, _dev(np.zeros(128, np.float32)), act="relu", dim=1,
                         quant=ma.Quant("float8_e4m3fn", "token"))
    with pytest.raises(TypeError, match=r"quant= on cuda arrays"):
        ma.bias_act(x, _dev(np.zeros(128, np.float32)), act="relu", dim=1, quant=ma.Quant("int8", "token"))
    with pytest.raises(ValueError, match=r"gelu\(\): the last axis \(48\) must be a multiple of the group size"):
        ma.gelu(_dev(_x()[:, :48]), quant=ma.Quant("int8", "group", group_size=32))
    with pytest.raises(ValueError, match=r"needs an array with a last axis"):
        ma.gelu(_dev(np.float32(1)), quant=ma.Quant("int8", "token"))


# ---- the float8 conversion, on the host: the very functions the kernels compile, on NumPy uint32 arrays ---------


def _patterns(step: int) -> np.ndarray:
    """Every step-th float32 bit pattern and the specials: zeros, the float8 formats' boundaries (largest finite,
    rounding ties at and around them, least subnormals and their halves), infinities and NaNs of both signs."""
    special = []
    for v in (0.0, 448.0, 464.0, 463.99997, 480.0, 57344.0, 61440.0, 61439.996, 2.0 ** -6, 2.0 ** -9, 2.0 ** -10,
              3 * 2.0 ** -11, 2.0 ** -14, 2.0 ** -16, 2.0 ** -17, 3 * 2.0 ** -18, 1.5 * 2.0 ** -9, 2.5 * 2.0 ** -9):
        b = int(np.float32(v).view(np.uint32))
        special += [max(b - 1, 0), b, b + 1]
    special += [0x7F800000, 0x7F800001, 0x7FC00000, 0x7FFFFFFF, 0x00000001, 0x007FFFFF, 0x00800000, 0x7F7FFFFF]
    special = np.array(special, np.uint32)
    special = np.concatenate([special, special | np.uint32(0x80000000)])
    return np.union1d(np.arange(0, 2 ** 32, step, dtype=np.uint64).astype(np.uint32), special)


def check_conversion(u: np.ndarray) -> dict[str, int]:
    """Mismatches of the kernels' conversion against ml_dtypes (ma.quantize with scale 1: clip to +-qmax, then
    ml_dtypes' RNE cast) on the quotients x / 1 of the patterns u (what a kernel converts: a division's result)."""
    from multiact.backend import cuda_backend as cb

    with np.errstate(invalid="ignore"):
        r = u.view(np.float32) / np.float32(1)
    out = {}
    for name, fn in (("float8_e4m3fn", cb.e4m3fn_bits), ("float8_e5m2", cb.e5m2_bits)):
        want = ma.quantize(r, ma.Quant(name, "tensor", scale=1.0))[0].view(np.uint8)
        got = fn(r.view(np.uint32)).astype(np.uint8)
        out[name] = int(np.count_nonzero(got != want))
    return out


def test_the_float8_conversion_matches_ml_dtypes_on_2_24_patterns_and_the_specials():
    u = _patterns(2 ** 8)  # 2^24 evenly strided patterns (every 256th), plus the specials
    assert u.size > 2 ** 24
    for lo in range(0, u.size, 2 ** 22):
        assert check_conversion(u[lo:lo + 2 ** 22]) == {"float8_e4m3fn": 0, "float8_e5m2": 0}
