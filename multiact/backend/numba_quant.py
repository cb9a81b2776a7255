"""The numba backend's one pass of a quantized forward (`numba_backend.quantized`; multiact.quant's contract, the
bits of its two passes).

Per block of whole rows (at most _BLOCK elements, or one row where a row is longer): the inputs widened exactly to
float32 (bfloat16 by its bits, float16 by NumPy), the backend's float32 kernel of the op into a float32 block buffer
held in cache, then compiled loops that take each group's amax, derive its scale with multiact.quant's float32
operations in the same order and write the codes of `v / scale` (a division, as multiact.quant divides), before the
next block.  The conversion is integer arithmetic on the quotient's float32 bits (as native/src/ma_quant.inc): the
magnitude capped at qmax's bits, one round-to-nearest-even shift for normal and subnormal codes, the sign in bit 7
(float8) or a negation (int8), NaN as ml_dtypes writes it (float8 sign | 0x7f / 0x7e, int8 0).  Granularity
"tensor" without a static scale: two passes over the blocks, the first for the amax (the activation computed twice).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

_BLOCK = 1 << 15  # elements per block: 128 KB of float32, in L2
# (qmax's float32 bits, the smallest normal's biased exponent, shift base, mantissa bits, NaN code, int8?)
_FMT = {"float8_e4m3fn": (0x43E00000, 121, 141, 3, 0x7F, 0), "float8_e5m2": (0x47600000, 113, 134, 2, 0x7E, 0),
        "int8": (0x42FE0000, 150, 150, 0, 0, 1)}
_loops: dict[str, Any] = {}


def _compile() -> dict[str, Any]:
    if _loops:
        return _loops
    from numba import njit

    jit = njit(cache=True, error_model="numpy", nogil=True)
    f32 = np.float32
    fmax = f32(np.finfo(np.float32).max)
    tiny = f32(np.finfo(np.float32).smallest_subnormal)  # multiact.quant.TINY: a scale is never 0

    @jit
    def codes_of(r, qbits, emin, base, mbits, nanc, isint, out):
        """codes of the float32 quotients r (their bits as uint32) into out (uint8)."""
        for i in range(r.shape[0]):
            b = np.int64(r[i])
            sign = b >> 31
            a = b & 0x7FFFFFFF
            if a > 0x7F800000:
                c = 0 if isint else (sign << 7) | nanc
            else:
                a = min(a, qbits)
                e = a >> 23
                m = (a & 0x7FFFFF) | 0x800000
                s = min(base - min(e, emin), 31)
                q = ((m + (1 << (s - 1)) - 1 + ((m >> s) & 1)) >> s) + ((max(e, emin) - emin) << mbits)
                c = ((-q if sign else q) & 0xFF) if isint else q | (sign << 7)
            out[i] = c

    @jit
    def amax_of(v):
        """max |v| in float32; the default quiet NaN where v holds a NaN (as native's q_amax)."""
        a = f32(0.0)
        for i in range(v.shape[0]):
            x = abs(v[i])
            if x != x:
                return f32(np.nan)
            if x > a:
                a = x
        return a

    @jit
    def scale_of(a, qmax, ub, floor_, pow2):
        """multiact.quant._scales on one amax."""
        a, ub, floor_, qmax = f32(a), f32(ub), f32(floor_), f32(qmax)  # float32 arithmetic, whatever the caller passed
        if ub > 0 and a > ub:
            a = ub
        if floor_ > 0 and a < floor_:
            a = floor_
        s = f32(a / qmax)
        if s == 0:
            s = tiny
        if a == 0:
            s = f32(1.0)
        if pow2 and s > 0 and s <= fmax:
            m, e = math.frexp(np.float64(s))
            if m != 0.5:
                s = f32(math.ldexp(1.0, e))
        return s

    @jit
    def e8m0_of(amax, qmax, ceil, emax):
        """multiact.quant._e8m0 on one amax: the bits."""
        if not (amax <= fmax):
            return 255
        if amax == 0:
            return 127
        if ceil:
            r = f32(amax / qmax)
            m, e = math.frexp(np.float64(r))
            if m == 0.5:
                e -= 1
            elif r == 0:
                e = -127
        else:
            m, e = math.frexp(np.float64(amax))
            e = e - 1 - emax
        return min(max(e, -127), 127) + 127

    @jit
    def groups(v, g, fmt, mode, qmax, ub, floor_, pow2, emax, codes, sf, sb, rbuf):
        """Every group of g values of the block v (flat, float32): amax, scale (float32 sf, or E8M0 bits sb for mode
        2 ceil / 3 floor), codes."""
        qbits, emin, base, mbits, nanc, isint = fmt
        for k in range(v.shape[0] // g):
            grp = v[k * g:(k + 1) * g]
            a = amax_of(grp)
            if mode == 0:
                s = scale_of(a, qmax, ub, floor_, pow2)
                sf[k] = s
            else:
                bits = e8m0_of(a, qmax, mode == 2, emax)
                sb[k] = bits
                s = f32(np.nan) if bits == 255 else f32(math.ldexp(1.0, bits - 127))
            for i in range(g):
                rbuf[i] = grp[i] / s
            codes_of(rbuf[:g].view(np.uint32), qbits, emin, base, mbits, nanc, isint, codes[k * g:(k + 1) * g])

    @jit
    def whole(v, s, fmt, codes, rbuf):
        """codes of the block v under one scale s."""
        s = f32(s)
        qbits, emin, base, mbits, nanc, isint = fmt
        n = v.shape[0]
        for i in range(n):
            rbuf[i] = v[i] / s
        codes_of(rbuf[:n].view(np.uint32), qbits, emin, base, mbits, nanc, isint, codes)

    @jit
    def minmax(v):
        """(min, max) of v, NaN for both where v holds a NaN."""
        lo = v[0]
        hi = v[0]
        for i in range(v.shape[0]):
            x = v[i]
            if x != x:
                return f32(np.nan), f32(np.nan)
            if x < lo:
                lo = x
            if x > hi:
                hi = x
        return lo, hi

    @jit
    def azp_params(lo, hi):
        """multiact.quant._azp's scale and zero point from the group's min and max."""
        lo, hi = f32(lo), f32(hi)
        s = f32((hi - lo) / f32(255.0))
        if s == 0:
            s = tiny
        if hi == lo:
            s = f32(1.0)
        z = np.rint(f32(f32(-128.0) - f32(lo / s)))
        zi = 0 if z != z else int(min(max(z, f32(-128.0)), f32(127.0)))
        return s, zi

    @jit
    def azp_codes(v, s, zi, out):
        s = f32(s)
        for i in range(v.shape[0]):
            t = np.float64(np.rint(f32(v[i] / s))) + zi
            out[i] = 0 if t != t else int(min(max(t, -128.0), 127.0))

    @jit
    def azp_groups(v, g, codes, sf, zp):
        for k in range(v.shape[0] // g):
            grp = v[k * g:(k + 1) * g]
            lo, hi = minmax(grp)
            s, zi = azp_params(lo, hi)
            sf[k] = s
            zp[k] = zi
            azp_codes(grp, s, zi, codes[k * g:(k + 1) * g])

    _loops.update(groups=groups, whole=whole, amax_of=amax_of, scale_of=scale_of, minmax=minmax,
                  azp_params=azp_params, azp_codes=azp_codes, azp_groups=azp_groups)
    return _loops


def _widen(a: np.ndarray) -> np.ndarray:
    from multiact.dtypes import is_bf16, to_float32

    if is_bf16(a.dtype):
        return to_float32(a)
    return a.astype(np.float32)


def run(kernel32: Any, p: dict, ins: tuple, q: Any) -> tuple | None:
    """The one pass over the inputs (x, or gate and up, all of one shape) with the float32 kernel `kernel32`
    (kernel32(*inputs, out, p)); (codes, scales[, zero points]) or None where the two passes should run."""
    from multiact import quant as Q

    shape = tuple(ins[0].shape)
    if not shape or ins[0].size == 0:
        return None
    n = shape[-1]
    g = q.block or n
    if n % g:
        return None
    rows = ins[0].size // n
    views = [a.reshape(rows, n) for a in ins]  # a view where the layout allows, else a copy
    L = _compile()
    step = max(1, _BLOCK // n)
    tensor = q.granularity == "tensor"
    codes = np.empty((rows, n), np.uint8)
    sshape = () if tensor else shape[:-1] + (n // g,)
    sf = np.empty((1,) if tensor else (rows, n // g), np.float32)
    sb = np.empty((rows, n // g), np.uint8) if q.granularity == "mx" else np.empty((1, 1), np.uint8)
    zp = np.empty(sf.shape, np.int32) if not q.symmetric else None
    buf = np.empty(min(rows, step) * n, np.float32)
    rbuf = np.empty(g if not tensor else buf.size, np.float32)
    fmt = _FMT[q.dtype]
    qmax = np.float32(q.qmax)
    ub, floor_ = np.float32(q.scale_ub or 0.0), np.float32(q.amax_floor or 0.0)

    def block(r0):
        m = min(step, rows - r0)
        v = buf[:m * n]
        kernel32(*(_widen(w[r0:r0 + m]) for w in views), v.reshape(m, n), p)
        return v, m

    if tensor:
        if q.scale is not None:
            s = np.float32(q.scale)
        elif zp is not None:
            lo, hi = np.float32(np.inf), np.float32(-np.inf)
            for r0 in range(0, rows, step):
                v, _ = block(r0)
                bl, bh = L["minmax"](v)
                if bl != bl:
                    lo = hi = np.float32(np.nan)
                    break
                lo, hi = min(lo, bl), max(hi, bh)
            s, zi = L["azp_params"](lo, hi)
            zp[0] = zi
        else:
            a = np.float32(0)
            for r0 in range(0, rows, step):
                v, _ = block(r0)
                ba = L["amax_of"](v)
                if ba != ba:
                    a = ba
                    break
                a = max(a, ba)
            s = L["scale_of"](a, qmax, ub, floor_, q.pow2)
        sf[0] = s
        for r0 in range(0, rows, step):
            v, m = block(r0)
            out = codes[r0:r0 + m].reshape(-1)
            if zp is not None:
                L["azp_codes"](v, s, int(zp[0]), out)
            else:
                L["whole"](v, s, fmt, out, rbuf)
    else:
        mode = (2 if q.rule == "ceil" else 3) if q.granularity == "mx" else 0
        emax = Q.EMAX.get(q.dtype, 0)
        for r0 in range(0, rows, step):
            v, m = block(r0)
            out = codes[r0:r0 + m].reshape(-1)
            if zp is not None:
                L["azp_groups"](v, g, out, sf[r0:r0 + m].reshape(-1), zp[r0:r0 + m].reshape(-1))
            else:
                L["groups"](v, g, fmt, mode, qmax, ub, floor_, q.pow2, emax, out, sf[r0:r0 + m].reshape(-1),
                            sb[r0:r0 + m].reshape(-1) if mode else sb.reshape(-1), rbuf)
    res = codes.reshape(shape).view(Q._code_dtype(q.dtype))
    if q.granularity == "mx":
        import ml_dtypes

        return res, sb.reshape(sshape).view(ml_dtypes.float8_e8m0fnu)
    scales = sf.reshape(sshape)
    return (res, scales) if zp is None else (res, scales, zp.reshape(sshape))
