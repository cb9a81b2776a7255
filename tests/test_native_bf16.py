"""The native bfloat16 kernels from below the dispatcher: each is its float32 kernel on the widened inputs,
rounded once by multiact.dtypes' rule (`f32_bits_to_bf16`), bit for bit, on every ISA this machine runs.
A NaN result only has to be a quiet NaN where the float32 kernel's is a NaN: which NaN an op body makes from
two NaN operands depends on the operand order the compiler picked for that kernel (x86 keeps the first), so
two compilations of one body may differ there; the store's NaN rule itself is checked bit for bit on
bias_act's linear kernel (x * s + b: one NaN operand at a time).

The float32 kernels are held to the reference elsewhere (test_native_kernels.py, the shared suites); what is
bfloat16's own is the load (a shift) and the store (round to nearest even, NaN kept quiet with its sign,
overflow to inf), so these tests run every bfloat16 bit pattern through every elementwise kernel (every
NaN payload, subnormal and boundary), the families on their layouts, and the streaming stores; all of it in
about a second.  The C harness checks the same equality on the vector paths of every ISA it builds.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import native_bf16_cvt, native_kernels

from multiact import registry
from multiact.dtypes import bf16_bits_to_f32, f32_bits_to_bf16

ROOT = Path(__file__).resolve().parents[1]
native = pytest.importorskip("multiact._native", reason="the native extension is not built")
lib, ffi = native.lib, native.ffi



K = native_kernels()
ISAS = [isa for isa in K.isas() if lib.ma_isa_supported(isa.encode())]
# avx512's stores narrow with vcvtneps2bf16 where the CPU has AVX512_BF16, else with integer operations: every
# test of this file runs with each way this machine has
HAS_CVT, CVT_WHY = native_bf16_cvt(lib, ffi)
STORES = ["integer", "vcvtneps2bf16"] if HAS_CVT else ["integer"]


@pytest.fixture(autouse=True, params=STORES)
def bf16_store(request):
    before = lib.ma_get_bf16_cvt()
    on = request.param == "vcvtneps2bf16"
    if lib.ma_set_bf16_cvt(on) != on:
        pytest.skip(f"vcvtneps2bf16 is not used here: {CVT_WHY}")
    yield request.param
    lib.ma_set_bf16_cvt(before)


ALL = np.arange(1 << 16, dtype=np.uint16)
# every pattern, then 13 more: a tail after the vector steps, and misaligned by one element from the start
BITS = np.concatenate([ALL, ALL[12345:12358]])
DY = f32_bits_to_bf16(np.random.default_rng(5).standard_normal(BITS.size).astype(np.float32) * 3)
G = f32_bits_to_bf16(np.random.default_rng(6).standard_normal(BITS.size).astype(np.float32))  # backward2's g


def _nan16(b: np.ndarray) -> np.ndarray:
    return (b & np.uint16(0x7FFF)) > np.uint16(0x7F80)


def _mismatch(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Where got differs from want: other bits, except that any quiet NaN stands for a NaN."""
    quiet = _nan16(got) & ((got & np.uint16(0x0040)) != 0)
    return (got != want) & ~(quiet & _nan16(want))


def _assert_same(got: np.ndarray, want: np.ndarray, what: str = "") -> None:
    bad = _mismatch(got, want)
    if bad.any():
        i = int(np.flatnonzero(bad.reshape(-1))[0])
        raise AssertionError(f"{what}: {int(bad.sum())} differ, first at {i}: got 0x{got.reshape(-1)[i]:04x} "
                             f"want 0x{want.reshape(-1)[i]:04x}")


def _pair(cname: str, isa: str):
    return getattr(lib, K.symbol(cname, "bfloat16", isa)), getattr(lib, K.symbol(cname, "float32", isa))


def _params(cname: str):
    # parameters for every packed slot: 0.75 suits each (alpha, beta, lambda, slopes, thresholds)
    return ffi.new("ma_params *", [0.75] * len(K.params_of(cname)) + [0.0] * (4 - len(K.params_of(cname))))


def test_conversions_follow_the_rule():
    f = np.empty(ALL.size, np.float32)
    lib.ma_bf16_to_f32(ffi.from_buffer("uint16_t[]", ALL), ffi.from_buffer("float[]", f), ALL.size)
    np.testing.assert_array_equal(f.view(np.uint32), bf16_bits_to_f32(ALL).view(np.uint32))
    hi = ALL.astype(np.uint32) << 16
    u = np.concatenate([hi | np.uint32(0x8000), hi | np.uint32(0x7FFF), hi | np.uint32(0x8001),  # ties, next to them
                        np.random.default_rng(2).integers(0, 1 << 32, 200_000, dtype=np.uint32)])
    h = np.empty(u.size, np.uint16)
    lib.ma_f32_to_bf16(ffi.from_buffer("float[]", u.view(np.float32)), ffi.from_buffer("uint16_t[]", h), u.size)
    np.testing.assert_array_equal(h, f32_bits_to_bf16(u.view(np.float32)))


def _elementwise_rows():
    seen, rows = set(), []
    for k in K.table():
        if (k.dtype == "bfloat16" and k.isa in ISAS and k.signature in ("unary", "binary", "ternary")
                and k.symbol not in seen):
            seen.add(k.symbol)
            rows.append(k)
    return rows


@pytest.mark.parametrize("isa", ISAS)
def test_every_pattern_through_every_elementwise_kernel(isa):
    """All 65,536 patterns (and a tail) as x, a fixed bfloat16 dy (and g): the bits of the float32 kernel,
    rounded."""
    x32, dy32, g32 = bf16_bits_to_f32(BITS), bf16_bits_to_f32(DY), bf16_bits_to_f32(G)
    out16, out32 = np.empty_like(BITS), np.empty(BITS.size, np.float32)
    bad = []
    for k in [k for k in _elementwise_rows() if k.isa == isa]:
        f16, f32 = _pair(k.cname, isa)
        p = _params(k.cname)
        for start in (0, 1):  # aligned and shifted by one element (other lanes, a head)
            b, x, d = BITS[start:], x32[start:], dy32[start:]
            if k.signature == "unary":
                f16(ffi.from_buffer("uint16_t[]", b), ffi.from_buffer("uint16_t[]", out16), b.size, p)
                f32(ffi.from_buffer("float[]", x), ffi.from_buffer("float[]", out32), b.size, p)
            elif k.signature == "ternary":
                f16(ffi.from_buffer("uint16_t[]", G[start:]), ffi.from_buffer("uint16_t[]", DY[start:]),
                    ffi.from_buffer("uint16_t[]", b), ffi.from_buffer("uint16_t[]", out16), b.size, p)
                f32(ffi.from_buffer("float[]", g32[start:]), ffi.from_buffer("float[]", d),
                    ffi.from_buffer("float[]", x), ffi.from_buffer("float[]", out32), b.size, p)
            else:
                f16(ffi.from_buffer("uint16_t[]", DY[start:]), ffi.from_buffer("uint16_t[]", b),
                    ffi.from_buffer("uint16_t[]", out16), b.size, p)
                f32(ffi.from_buffer("float[]", d), ffi.from_buffer("float[]", x), ffi.from_buffer("float[]", out32),
                    b.size, p)
            want = f32_bits_to_bf16(out32[:b.size])
            if _mismatch(out16[:b.size], want).any():
                i = int(np.flatnonzero(_mismatch(out16[:b.size], want))[0])
                bad.append(f"{k.symbol} start={start}: x=0x{b[i]:04x} got 0x{out16[i]:04x} want 0x{want[i]:04x}")
    assert not bad, "\n".join(bad[:10])


@pytest.mark.parametrize("isa", ISAS)
def test_prelu_and_the_parameter_gradients(isa):
    rng = np.random.default_rng(7)
    xb = f32_bits_to_bf16(rng.standard_normal(3 * 5 * 37).astype(np.float32) * 4)
    db = f32_bits_to_bf16(rng.standard_normal(xb.size).astype(np.float32))
    x, d = bf16_bits_to_f32(xb), bf16_bits_to_f32(db)
    w = np.linspace(-0.5, 1.5, 5).astype(np.float32)
    u16, f32 = (lambda a: ffi.from_buffer("uint16_t[]", a)), (lambda a: ffi.from_buffer("float[]", a))
    p16, p32 = _pair("prelu", isa)
    for grad in (False, True):
        y16, y32 = np.empty_like(xb), np.empty_like(x)
        p16(u16(db) if grad else ffi.NULL, u16(xb), u16(y16), 3, 5, 37, f32(w), 1)
        p32(f32(d) if grad else ffi.NULL, f32(x), f32(y32), 3, 5, 37, f32(w), 1)
        _assert_same(y16, f32_bits_to_bf16(y32), 'prelu')
    g16, g32 = _pair("prelu_weight_grad", isa)
    a16, a32 = np.zeros(5), np.zeros(5)
    g16(u16(db), u16(xb), 3, 5, 37, ffi.from_buffer("double[]", a16))
    g32(f32(d), f32(x), 3, 5, 37, ffi.from_buffer("double[]", a32))
    np.testing.assert_array_equal(a16, a32)
    s16, s32 = _pair("swish_beta_grad", isa)
    assert s16(u16(db), u16(xb), xb.size, 1.3, 1, 1) == s32(f32(d), f32(x), x.size, 1.3, 1, 1)


def _family_keys(family: str) -> list[str]:
    return sorted({k.key for k in K.table() if k.op == family and k.dtype == "bfloat16"})


def _bf16_pair(key: str, direction: str):
    nb = registry.module("native")
    return nb.kernel(key, direction, "bfloat16"), nb.kernel(key, direction, "float32")


def _rand_bf16(rng, shape, scale=3.0):
    return f32_bits_to_bf16(rng.standard_normal(shape).astype(np.float32) * np.float32(scale))


def test_gated_kernels_on_their_layouts():
    """Two halves of one array and its interleaved pairs (de-interleaved in registers, results stored in pairs),
    clipped and not; the backward in place too."""
    rng = np.random.default_rng(9)
    both = _rand_bf16(rng, (7, 2 * 45))
    both[0, :6] = [0x7FC1, 0xFF80, 0x7F80, 0x0001, 0x8000, 0x7F7F]  # NaN, -inf, inf, subnormal, -0, max
    dyb = _rand_bf16(rng, (7, 45))
    halves, pairs = (slice(None, 45), slice(45, None)), (slice(0, None, 2), slice(1, None, 2))
    for key in _family_keys("gated"):
        fb, ff = _bf16_pair(key, "forward")
        gb, gf = _bf16_pair(key, "backward")
        for p in ({"limit": float("inf"), "shift": 0.0}, {"limit": 7.0, "shift": 1.0}):
            p = {**p, **_act_params(key)}
            for sg, su in (halves, pairs):
                g, u = both[:, sg], both[:, su]
                g32, u32, d32 = (bf16_bits_to_f32(a) for a in (g, u, dyb))
                y16, y32 = np.empty(g.shape, np.uint16), np.empty(g.shape, np.float32)
                fb(g, u, y16, p)
                ff(g32, u32, y32, p)
                _assert_same(y16, f32_bits_to_bf16(y32), key)
                o16, o32 = np.empty_like(both), np.empty(both.shape, np.float32)
                gb(dyb, g, u, o16[:, sg], o16[:, su], p)
                gf(d32, g32, u32, o32[:, sg], o32[:, su], p)
                _assert_same(o16, f32_bits_to_bf16(o32), key)
                ip = both.copy()
                gb(dyb, ip[:, sg], ip[:, su], ip[:, sg], ip[:, su], p)
                np.testing.assert_array_equal(ip, o16, err_msg=f"{key} in place")


def _act_params(key: str) -> dict:
    """The activation's parameters of a family key, 0.75 each (as _params)."""
    return dict.fromkeys(K.params_of(K.cname(key, "forward")), 0.75)


@pytest.mark.parametrize("isa", ISAS)
def test_the_store_rounds_every_pattern_and_keeps_nan_bits(isa):
    """bias_act's linear kernel computes x * s + b (no other operation): with every pattern as x and non-NaN s, b
    (per element, full shape), its result is NumPy's float32 x * s + b rounded by f32_bits_to_bf16, NaN bits
    included (sign and payload of x's NaN, quiet), ties, overflow to inf and subnormals with them."""
    rng = np.random.default_rng(13)
    x = BITS.reshape(1, 1, -1)
    s = f32_bits_to_bf16(rng.uniform(-3, 3, BITS.size).astype(np.float32)).reshape(x.shape)
    s.reshape(-1)[::97] = 0x3F81  # 1 + 2^-7: products a tie away or exactly halfway, for even and odd x
    b = f32_bits_to_bf16(rng.standard_normal(BITS.size).astype(np.float32) * 1e-3).reshape(x.shape)
    b.reshape(-1)[::5] = 0x8000  # -0: x * s alone
    x32, s32, b32 = (bf16_bits_to_f32(a) for a in (x, s, b))
    with np.errstate(all="ignore"):
        want = f32_bits_to_bf16(x32 * s32 + b32)
    sym = getattr(lib, K.symbol("bias_act_linear", "bfloat16", isa))
    y = np.empty_like(x)
    sh = ffi.new("ma_bshape *", [1, 1, x.size, 2, 2, 1, 1])
    p = ffi.new("ma_params *", [0.0, 0.0, 0.0, 0.0, 0, float("inf"), 0.0, 1.0, float("inf")])
    u16 = (lambda a: ffi.cast("uint16_t *", a.ctypes.data))
    sym(u16(x), u16(b), u16(s), u16(y), sh, p)
    np.testing.assert_array_equal(y, want)


def test_bias_act_kernels_per_channel_full_and_summed():
    rng = np.random.default_rng(10)
    for key in _family_keys("bias_act"):
        fb, ff = _bf16_pair(key, "forward")
        gb, gf = _bf16_pair(key, "backward")
        for shape, side in (((3, 5, 37), (5,)), ((30, 40, 1), (40,)), ((2, 7, 45), (2, 7, 45))):
            x, dy, b, s = (_rand_bf16(rng, sh) for sh in (shape, shape, side, side))
            x.reshape(-1)[:4] = [0x7FC1, 0xFF80, 0x0001, 0x8000]
            x32, dy32, b32, s32 = (bf16_bits_to_f32(a) for a in (x, dy, b, s))
            full = len(side) == 3
            for clamp in (float("inf"), 2.0):
                p = {"gain": 1.5, "clamp": clamp, "sum_db": not full, "sum_dscale": not full, **_act_params(key)}
                y16, y32 = np.empty_like(x), np.empty_like(x32)
                fb(x, b, s, y16, p)
                ff(x32, b32, s32, y32, p)
                _assert_same(y16, f32_bits_to_bf16(y32), key)
                dx16, dx32 = np.empty_like(x), np.empty_like(x32)
                db16, db32 = (np.empty_like(x), np.empty_like(x32)) if full else (None, None)
                sums16 = gb(dy, x, b, s, dx16, db16, None, p)
                sums32 = gf(dy32, x32, b32, s32, dx32, db32, None, p)
                _assert_same(dx16, f32_bits_to_bf16(dx32), key)
                if full:
                    _assert_same(db16, f32_bits_to_bf16(db32), key)
                else:
                    np.testing.assert_array_equal(sums16, sums32, err_msg=key)
                if registry.module("native").supports(key, "backward_y", "bfloat16"):  # from y: b, s unread
                    yb, yf = _bf16_pair(key, "backward_y")
                    sums16 = yb(dy, y16, None, None, dx16, db16, None, {**p, "sum_dscale": False})
                    sums32 = yf(dy32, bf16_bits_to_f32(y16), None, None, dx32, db32, None, {**p, "sum_dscale": False})
                    _assert_same(dx16, f32_bits_to_bf16(dx32), key + " y")
                    if full:
                        _assert_same(db16, f32_bits_to_bf16(db32), key + " y")
                    else:
                        np.testing.assert_array_equal(sums16, sums32, err_msg=key + " y")


@pytest.mark.parametrize("cname", ["gelu_tanh", "sigmoid_grad"])
def test_large_calls_with_streaming_stores(cname):
    """Above the cache size the stores stream (16-byte aligned after a padded head): the same bits at any
    alignment, and in place."""
    isa = ISAS[-1]
    n = (8 << 20) // 2 + 37
    base = _rand_bf16(np.random.default_rng(11), n + 8, 4.0)
    f16, f32 = _pair(cname, isa)
    fn = ffi.cast("void *", ffi.addressof(lib, K.symbol(cname, "bfloat16", isa)))
    binary = cname.endswith("_grad")
    for off_x, off_y in ((0, 0), (1, 3)):
        x = base[off_x:off_x + n]
        buf = np.empty(n + 8, np.uint16)
        out = buf[off_y:off_y + n]
        y32 = np.empty(n, np.float32)
        x32 = bf16_bits_to_f32(x)
        if binary:
            f32(ffi.from_buffer("float[]", x32), ffi.from_buffer("float[]", x32), ffi.from_buffer("float[]", y32), n,
                _params(cname))
            lib.ma_run_binary(fn, ffi.from_buffer(x), ffi.from_buffer(x), ffi.from_buffer(out), n, 2, 1, 0, 0, 0, 0, 1)
        else:
            f32(ffi.from_buffer("float[]", x32), ffi.from_buffer("float[]", y32), n, _params(cname))
            lib.ma_run_unary(fn, ffi.from_buffer(x), ffi.from_buffer(out), n, 2, 1, 0, 0, 0, 0, 1)
        _assert_same(out, f32_bits_to_bf16(y32), f"offsets {off_x},{off_y}")
    if not binary:
        inplace = base[:n].copy()
        lib.ma_run_unary(fn, ffi.from_buffer(inplace), ffi.from_buffer(inplace), n, 2, 1, 0, 0, 0, 0, 1)
        f32(ffi.from_buffer("float[]", bf16_bits_to_f32(base[:n])), ffi.from_buffer("float[]", y32), n, _params(cname))
        _assert_same(inplace, f32_bits_to_bf16(y32), "in place")


def test_the_backend_claims_bfloat16_and_takes_ml_dtypes_arrays():
    """supports() for every kernel of the table; ml_dtypes arrays (strided ones through the blocks) in and out."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    nb = registry.module("native")
    for k in K.table():
        if k.dtype == "bfloat16" and k.isa == nb.info()["isa"]:
            assert nb.supports(k.key, k.direction, "bfloat16"), k
    bits = _rand_bf16(np.random.default_rng(12), (40, 33))
    x = bits.view(ml_dtypes.bfloat16)
    fwd = nb.kernel("silu", "forward", "bfloat16")
    f32 = nb.kernel("silu", "forward", "float32")
    for view in (x, x[:, ::2], x.T):
        out = np.empty(view.shape, ml_dtypes.bfloat16)
        fwd(view, out, {})
        y32 = np.empty(view.shape, np.float32)
        f32(view.astype(np.float32), y32, {})
        _assert_same(out.view(np.uint16), f32_bits_to_bf16(y32).reshape(view.shape), "silu")
