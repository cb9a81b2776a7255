"""The `native` backend: C kernels (scalar, AVX2+FMA+F16C, AVX-512 F+BW+DQ+VL, NEON) built by cffi into
multiact._native.

The ISA is chosen once per process: the best one this CPU (and, for AVX-512, the OS) runs, in multiact.vocab's
order of preference, or MULTIACT_NATIVE_ISA (scalar|avx2|avx512|neon) to force one.  The kernel table is embedded
in the extension (generated from native/kernels.py), so this module never guesses a symbol.  Calls release the
GIL; large contiguous calls are split over a pthread pool (multiact.get_num_threads()); inputs that are
not contiguous in the same order as `out` are streamed through cache-sized blocks, so an
in-place call never allocates a result-sized temporary.

dtypes: float32, float16 and bfloat16 (ml_dtypes' NumPy dtype; its bits go to C as uint16): the half
types are widened into float32 in registers, computed by the float32 bodies and rounded once to nearest
even on the store (bfloat16: multiact.dtypes' rule, the same bits on every ISA).  float64: computed in
float64 lanes for every kernel with a float64 body (native/kernels.py's float64_bodies: all but swish's beta
gradient and prelu's forward and backward); for those float64 falls through to the next backend (the table has
no such kernel).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np

from multiact import vocab

NAME = "native"
PRIORITY = 30
KINDS = ("numpy",)

ISA_ENV = "MULTIACT_NATIVE_ISA"
_PREFERENCE = tuple(vocab.ISAS)  # best first
_BLOCK = 1 << 14
_ELSIZE = {name: d.itemsize for name, d in vocab.DTYPES.items()}
_CTYPE = {name: d.ctype + "[]" for name, d in vocab.DTYPES.items()}

_state: dict[str, Any] = {}


def _load() -> dict[str, Any]:
    """Import the extension, pick the ISA and parse the kernel table (once; never raises)."""
    if _state:
        return _state
    try:
        from multiact import _native
    except ImportError as e:
        _state.update(ok=False, why=f"the C extension multiact._native is not built ({e}); reinstall multiact "
                                    "with a C compiler and cffi (pip install -e . builds it)")
        return _state
    lib, ffi = _native.lib, _native.ffi
    rows = [line.split() for line in ffi.string(lib.ma_kernel_table()).decode().splitlines()]
    built = sorted({r[4] for r in rows}, key=_PREFERENCE.index)
    runs = [isa for isa in built if lib.ma_isa_supported(isa.encode())]
    # why each built ISA this machine cannot run is left out (`multiact info` shows it)
    not_run = {isa: ffi.string(lib.ma_isa_why(isa.encode())).decode() for isa in built if isa not in runs}
    forced = os.environ.get(ISA_ENV, "").strip().lower()
    if forced:
        if forced not in runs:
            why = ("is not built into this extension" if forced not in built
                   else f"is not supported by this machine ({not_run[forced]})")
            _state.update(ok=False, why=f"{ISA_ENV}={forced!r} {why}; this machine runs: {', '.join(runs)}",
                          not_run=not_run)
            return _state
        isa = forced
    else:
        isa = runs[0]
    table, by_isa = {}, {}
    for _op, key, direction, dtype, row_isa, cname, symbol, signature, params, cost in rows:
        if row_isa in runs:
            by_isa[(key, direction, dtype, row_isa)] = (
                cname, symbol, signature, () if params == "-" else tuple(params.split(",")), int(cost)
            )
            if row_isa == isa:
                table[(key, direction, dtype)] = by_isa[(key, direction, dtype, row_isa)]
    skipped = "".join(f"; {name} not run here: {why}" for name, why in not_run.items())
    cvt = " (bfloat16 stores: vcvtneps2bf16)" if isa == "avx512" and lib.ma_get_bf16_cvt() else ""
    _state.update(ok=True, why=f"C kernels, {isa}" + cvt + (" (forced)" if forced else "") + skipped, lib=lib, ffi=ffi,
                  isa=isa, isas=runs, not_run=not_run, table=table, by_isa=by_isa)
    return _state


def available() -> tuple[bool, str]:
    s = _load()
    return s["ok"], s["why"]


def info() -> dict:
    s = _load()
    if not s["ok"]:
        return {"isa": None, **({"isas_not_run": s["not_run"]} if "not_run" in s else {})}
    from multiact import get_num_threads

    return {"isa": s["isa"], "isas": s["isas"], "isas_not_run": s["not_run"], "thread_pool": "pthreads",
            "threads": get_num_threads(), "parallel_min": int(s["lib"].ma_get_parallel_min()),
            "bf16_store": bf16_store()}


def bf16_store() -> str:
    """How the chosen ISA's bfloat16 kernels round their results: the same bits either way (ma_simd.h)."""
    s = _load()
    lib, ffi = s["lib"], s["ffi"]
    if s["isa"] == "avx512" and lib.ma_get_bf16_cvt():
        return "vcvtneps2bf16 / vcvtne2ps2bf16 (AVX512_BF16), subnormal lanes by the integer sequence"
    why = ffi.string(lib.ma_bf16_cvt_why()).decode()
    return "integer round-to-nearest-even sequence" + (f" (vcvtneps2bf16 not used: {why})" if s["isa"] == "avx512"
                                                       else "")


def supports(key: str, direction: str, dtype: str) -> bool:
    s = _load()
    return s["ok"] and (key, direction, dtype) in s["table"]


def entry(key: str, direction: str, dtype: str, isa: str | None = None) -> tuple:
    """The kernel table's row (C name, symbol, signature, packed parameter names, cost) of the chosen ISA or
    of `isa`; raises why there is none."""
    s = _load()
    if not s["ok"]:
        raise RuntimeError(f"native backend unavailable: {s['why']}")
    if isa is not None and isa not in s["isas"]:
        raise ValueError(f"native: ISA {isa!r} does not run here; this machine runs: {', '.join(s['isas'])}")
    row = s["table"].get((key, direction, dtype)) if isa is None else s["by_isa"].get((key, direction, dtype, isa))
    if not row:
        raise NotImplementedError(f"native has no {key} {direction} kernel for {dtype}")
    return row


def kernel(key: str, direction: str, dtype: str, isa: str | None = None) -> Callable:
    """The kernel of the chosen ISA, or of `isa` (any this machine runs: `multiact check --exhaustive`
    judges every ISA against one reference in one pass)."""
    s = _load()
    row = entry(key, direction, dtype, isa)
    _, symbol, signature, _, cost = row
    if signature in ("unary", "binary"):
        return _elementwise(s, row, dtype, signature == "binary")
    if signature == "ternary":
        return _ternary(s, row, dtype)
    if signature == "channel":  # an array parameter (prelu's weight), per channel along axis
        return _channel(s, symbol, dtype, key, direction)
    if signature == "channel_param_grad":
        return _channel_param_grad(s, symbol, dtype, key)
    if signature in ("gated", "gated_grad"):
        return _gated(s, row, dtype, signature == "gated_grad")
    if signature in ("bias_act", "bias_act_grad"):
        return _bias_act(s, row, dtype, signature == "bias_act_grad")
    return _scalar_param_grad(s, symbol, dtype, key, cost)  # scalar_param_grad (swish's beta)


def _packer(names: tuple[str, ...]) -> Callable[[dict], tuple[float, float, float, float]]:
    if not names:
        return lambda p: (0.0, 0.0, 0.0, 0.0)
    return lambda p: (*(float(p[n]) for n in names), *(0.0,) * (4 - len(names)))


def _flat(*arrays: np.ndarray, aligned: bool = False) -> tuple[np.ndarray, ...] | None:
    """The arrays as flat views in memory order when all are contiguous in the same order (and, if
    asked, aligned), else None.  The elementwise runner bounces misaligned arrays itself."""
    order = _order(*arrays, aligned=aligned)
    return None if order is None else tuple(a.reshape(-1, order=order) for a in arrays)


def _blocks(ins: tuple[np.ndarray, ...], out: np.ndarray):
    """(contiguous input blocks, out block) pairs; out blocks that are strided get a small buffer."""
    it = np.nditer(
        (*ins, out),
        flags=["external_loop", "buffered", "zerosize_ok", "grow_inner"],
        op_flags=[["readonly"]] * len(ins) + [["writeonly"]],
        buffersize=_BLOCK,
    )
    with it:
        for chunk in it:
            *blocks, ob = chunk
            blocks = [np.ascontiguousarray(b) for b in blocks]
            if ob.flags.c_contiguous:
                yield blocks, ob
            else:
                tmp = np.empty(ob.shape, ob.dtype)
                yield blocks, tmp
                ob[...] = tmp


def _elementwise(s: dict, row: tuple, dtype: str, binary: bool) -> Callable:
    """A kernel closure: C-contiguous arrays go straight to C (one cffi call); others in blocks."""
    from multiact import get_num_threads

    lib, ffi = s["lib"], s["ffi"]
    fb = ffi.from_buffer
    elsize = _ELSIZE[dtype]
    _, sym, _, names, cost = row
    fn, pack = ffi.cast("void *", ffi.addressof(lib, sym)), _packer(names)
    const = pack({}) if not names else None
    run = lib.ma_run_binary if binary else lib.ma_run_unary
    entry = lib.ma_call_binary if binary else lib.ma_call_unary

    def at(p: dict) -> tuple[Callable, Any]:
        """(entry, handle) running this kernel with the parameters p on contiguous memory given as addresses
        (Python ints): entry(handle, x, y, n, nthreads), binary entry(handle, u, v, y, n, nthreads).  Built
        once per cached call by the tensor hot path, which then needs no ffi.from_buffer nor NumPy views."""
        a, b, c, d = const or pack(p)
        block = {"fn": fn, "elsize": elsize, "cost": cost,
                 "p": {"a": a, "b": b, "c": c, "d": d, "da": a, "db": b, "dc": c, "dd": d}}
        return entry, ffi.new("ma_call *", block)

    entry_address = int(ffi.cast("uintptr_t", ffi.addressof(lib, "ma_call_binary" if binary else "ma_call_unary")))

    def native(p: dict) -> tuple[int, int, Any, int, int]:
        """What multiact._hotpath.Native takes for this kernel with the parameters p: the entry's and the
        ma_call block's addresses, the block's owner, the arity and the cost (the C hot path's call)."""
        handle = at(p)[1]
        return entry_address, int(ffi.cast("uintptr_t", handle)), handle, 2 if binary else 1, cost

    def strided(arrays, out, a, b, c, d):
        flat = _flat(*arrays, out)  # Fortran order: flat views in memory order
        if flat is not None:
            run(fn, *(fb(v) for v in flat), out.size, elsize, cost, a, b, c, d, get_num_threads())
            return
        for blocks, ob in _blocks(arrays, out):
            run(fn, *(fb(v) for v in blocks), fb(ob), ob.size, elsize, cost, a, b, c, d, 1)

    if binary:

        def k2(u, v, out, p):
            a, b, c, d = const or pack(p)
            try:
                bu, bv, bo = fb(u), fb(v), fb(out)  # raises unless C-contiguous
            except ValueError:
                return strided((u, v), out, a, b, c, d)
            if out.size:
                run(fn, bu, bv, bo, out.size, elsize, cost, a, b, c, d, get_num_threads())

        k2.at, k2.native = at, native
        return k2

    def k1(x, out, p):
        a, b, c, d = const or pack(p)
        try:
            bx, bo = fb(x), fb(out)  # raises unless C-contiguous
        except ValueError:
            return strided((x,), out, a, b, c, d)
        if out.size:
            run(fn, bx, bo, out.size, elsize, cost, a, b, c, d, get_num_threads())

    k1.at, k1.native = at, native
    return k1


def _ternary(s: dict, row: tuple, dtype: str) -> Callable:
    """A second-derivative kernel closure, kernel(g, dy, x, out, p): as the binary one, C-contiguous arrays in one
    cffi call, others in blocks."""
    from multiact import get_num_threads

    lib, ffi = s["lib"], s["ffi"]
    fb = ffi.from_buffer
    elsize = _ELSIZE[dtype]
    _, sym, _, names, cost = row
    fn, pack = ffi.cast("void *", ffi.addressof(lib, sym)), _packer(names)

    def k3(g, dy, x, out, p):
        a, b, c, d = pack(p)
        try:
            bufs = fb(g), fb(dy), fb(x), fb(out)  # raises unless C-contiguous
        except ValueError:
            flat = _flat(g, dy, x, out)
            if flat is not None:
                lib.ma_run_ternary(fn, *(fb(v) for v in flat), out.size, elsize, cost, a, b, c, d, get_num_threads())
                return
            for blocks, ob in _blocks((g, dy, x), out):
                lib.ma_run_ternary(fn, *(fb(v) for v in blocks), fb(ob), ob.size, elsize, cost, a, b, c, d, 1)
            return
        if out.size:
            lib.ma_run_ternary(fn, *bufs, out.size, elsize, cost, a, b, c, d, get_num_threads())

    return k3


def _channels(x: np.ndarray, weight: np.ndarray, axis: int, order: str) -> tuple[int, int, int]:
    """(outer, channels, inner) of x's memory around the channel axis."""
    if weight.size == 1:
        return 1, 1, x.size
    shape = x.shape if order == "C" else x.shape[::-1]
    ax = axis if order == "C" else x.ndim - 1 - axis
    return int(np.prod(shape[:ax], dtype=np.int64)), shape[ax], int(np.prod(shape[ax + 1:], dtype=np.int64))


def _order(*arrays: np.ndarray, aligned: bool = True) -> str | None:
    """'C' or 'F' when all arrays are contiguous in that order and (by default) aligned, for C code
    that dereferences them; else None."""
    if aligned and not all(a.flags.aligned for a in arrays):
        return None
    if all(a.flags.c_contiguous for a in arrays):
        return "C"
    if all(a.flags.f_contiguous for a in arrays):
        return "F"
    return None


def _c_order(*arrays: np.ndarray) -> tuple[np.ndarray, ...]:
    """Aligned C-contiguous copies of arrays that are strided or misaligned (prelu's C needs a layout)."""
    return tuple(np.require(a, requirements="CA") for a in arrays)


def _defn(key: str) -> Any:
    """The definition of the op whose kernel key `key` is."""
    from multiact.optable import KEYS

    return KEYS[key].defn


def _channel(s: dict, symbol: str, dtype: str, key: str, direction: str) -> Callable:
    """An op whose array parameter (prelu's weight) holds one value per channel along `axis`."""
    from multiact import get_num_threads

    lib, ffi = s["lib"], s["ffi"]
    fn, ct = getattr(lib, symbol), _CTYPE[dtype]
    array = _defn(key).array_param

    def run(dy, x, out, p):
        if out.size == 0:
            return
        arrays = (x, out) if dy is None else (dy, x, out)
        order = _order(*arrays)
        if order is None:  # run on contiguous copies, then write out once
            ins = _c_order(*arrays[:-1])
            tmp = np.empty(out.shape, out.dtype)
            run(None if dy is None else ins[0], ins[-1], tmp, p)
            out[...] = tmp
            return
        w = p[array]
        outer, c, inner = _channels(x, w, p["axis"], order)
        w32 = np.ascontiguousarray(w.reshape(-1), dtype=np.float32)
        flat = [ffi.from_buffer(ct, a.reshape(-1, order=order)) for a in arrays]  # views in memory order
        fn(ffi.NULL if dy is None else flat[0], flat[-2], flat[-1], outer, c, inner, ffi.from_buffer("float[]", w32),
           get_num_threads())

    if direction == "forward":
        return lambda x, out, p: run(None, x, out, p)
    return run


def _channel_param_grad(s: dict, symbol: str, dtype: str, key: str) -> Callable:
    """The gradient of an array parameter: one float64 sum per channel."""
    lib, ffi = s["lib"], s["ffi"]
    fn, ct = getattr(lib, symbol), _CTYPE[dtype]
    array = _defn(key).array_param

    def k(dy, x, p):
        w = p[array]
        order = _order(dy, x)
        if order is None:
            return k(*_c_order(dy, x), p)
        outer, c, inner = _channels(x, w, p["axis"], order)
        acc = np.zeros(c, dtype=np.float64)
        if x.size:
            dyf, xf = (ffi.from_buffer(ct, a.reshape(-1, order=order)) for a in (dy, x))
            fn(dyf, xf, outer, c, inner, ffi.from_buffer("double[]", acc))
        return acc.reshape(w.shape)

    return k


def _scalar_param_grad(s: dict, symbol: str, dtype: str, key: str, cost: int) -> Callable:
    """The gradient of a scalar parameter (swish's beta): one float64 sum."""
    from multiact import get_num_threads

    lib, ffi = s["lib"], s["ffi"]
    fn, ct = getattr(lib, symbol), _CTYPE[dtype]
    name = _defn(key).param_grad

    def k(dy, x, p):
        # a sum: contiguous copies of strided inputs give the same partial sums as contiguous inputs
        flat = _flat(dy, x, aligned=True) or _flat(*_c_order(dy, x))
        dyf, xf = (ffi.from_buffer(ct, a) for a in flat)
        return float(fn(dyf, xf, x.size, float(np.float32(p[name])), cost, get_num_threads()))

    return k


# ---- the gated family (gated:<act>): strided 2-D views straight to C ---------------------------------


def _plane(arrays: tuple[np.ndarray, ...]) -> tuple[int, int, list[int], list[int]] | None:
    """(rows, n, row strides, element strides), strides in elements, that address every array (all of one
    shape) as rows x n, or None where no such form exists.  Size-1 dims are dropped and neighbouring dims
    merged where every array allows it (stride of the outer = stride x size of the inner), so the halves
    along any dim of a C-contiguous array, its interleaved pairs and contiguous arrays all come out 2-D."""
    item = arrays[0].itemsize
    shape = arrays[0].shape
    strides = [a.strides for a in arrays]
    if any(st % item for sts in strides for st in sts):
        return None
    if len(shape) == 2 and shape[1] != 1:  # the common case, quickly
        n = shape[1]
        es = [sts[1] // item for sts in strides]
        rs = [sts[0] // item for sts in strides]
        if shape[0] == 1 or all(r == e * n for r, e in zip(rs, es, strict=True)):
            return 1, shape[0] * n, rs, es
        return shape[0], n, rs, es
    keep = [k for k, size in enumerate(shape) if size != 1]
    if not keep:
        return 1, 1, [0] * len(arrays), [1] * len(arrays)
    sizes = [shape[keep[-1]]]
    blocks = [[sts[keep[-1]] // item] for sts in strides]
    for k in reversed(keep[:-1]):
        if all(sts[k] // item == bl[0] * sizes[0] for sts, bl in zip(strides, blocks, strict=True)):
            sizes[0] *= shape[k]
        else:
            if len(sizes) == 2:
                return None
            sizes.insert(0, shape[k])
            for sts, bl in zip(strides, blocks, strict=True):
                bl.insert(0, sts[k] // item)
    if len(sizes) == 1:
        return 1, sizes[0], [0] * len(arrays), [bl[0] for bl in blocks]
    return sizes[0], sizes[1], [bl[0] for bl in blocks], [bl[1] for bl in blocks]


def _address_reader(ffi) -> Callable[[np.ndarray], int]:
    """A fast array -> data address: NumPy's PyArrayObject starts with PyObject_HEAD then `char *data`
    (the public PyArrayObject_fields layout Cython reads too), read through the object's address; checked
    here against __array_interface__ on a few views, else __array_interface__ itself (~4x slower)."""
    head = ffi.sizeof("void *") * 2  # ob_refcnt, ob_type

    def fast(a: np.ndarray) -> int:
        return int(ffi.cast("uintptr_t *", id(a) + head)[0])

    def slow(a: np.ndarray) -> int:
        return a.__array_interface__["data"][0]

    try:
        base = np.zeros((4, 6), np.float32)
        probes = (base, base[:, 3:], base[1:, 1::2], base[::-1], base.T)
        if all(fast(a) == slow(a) for a in probes) and type(base) is np.ndarray:
            return fast
    except Exception:  # noqa: BLE001 - any doubt: the documented interface
        pass
    return slow


def _param_blocks(ffi: Any, names: tuple[str, ...], own: tuple[str, ...], tail: Callable) -> Callable:
    """p -> its ma_params block for a composite kernel, cached by value (64 at most): the activation's
    parameters (names) in a, b, ..., then the fields after them from the family's own scalars (tail)."""
    cache: dict[tuple, Any] = {}

    def params(p):
        vals = (*(float(p[n]) for n in names), *(float(p[k]) for k in own))
        block = cache.get(vals)
        if block is None:
            ab = [*vals[:len(names)], 0.0, 0.0, 0.0, 0.0][:4]
            block = ffi.new("ma_params *", [*ab, 0, *tail(*vals[len(names):])])
            if len(cache) < 64:
                cache[vals] = block
        return block
    return params


def _gated(s: dict, row: tuple, dtype: str, backward: bool) -> Callable:
    """forward kernel(gate, up, out, p); backward kernel(dy, gate, up, dgate, dup, p).  The views go to C
    as pointers and strides (no copy) whenever one rows x n form addresses all of them (see _plane);
    otherwise (views no 2-D form reaches, e.g. a transposed 3-D input, or misaligned arrays, which the C
    code may not dereference) the inputs are copied to aligned C-contiguous arrays, computed into
    contiguous results and written back; in place stays safe, as every input is read before the
    write-back."""
    from multiact import get_num_threads

    lib, ffi = s["lib"], s["ffi"]
    _, sym, _, names, cost = row
    fn = getattr(lib, sym)
    ct = "float *" if dtype == "float32" else "uint16_t *"
    n_in = 3 if backward else 2
    slots = (0, 1, 2, 3, 4) if backward else (1, 2, 3)
    address = s.get("address") or s.setdefault("address", _address_reader(ffi))
    params = _param_blocks(ffi, names, ("limit", "shift"), lambda limit, shift: (limit, shift))

    def call(arrays, pp):
        plane = _plane(arrays) if all(a.flags.aligned for a in arrays) else None
        if plane is None:
            ins = tuple(np.require(a, requirements="CA") for a in arrays[:n_in])
            outs = tuple(np.empty(a.shape, a.dtype) for a in arrays[n_in:])
            call((*ins, *outs), pp)
            for o, t in zip(arrays[n_in:], outs, strict=True):
                o[...] = t
            return
        rows, n, rs, es = plane
        r5, e5 = [0] * 5, [1] * 5
        for slot, r, e in zip(slots, rs, es, strict=True):
            r5[slot], e5[slot] = r, e
        g = ffi.new("ma_gshape *", [rows, n, r5, e5, cost, get_num_threads()])
        fn(*(ffi.cast(ct, address(a)) for a in arrays), g, pp)

    if backward:
        def kb(dy, gate, up, dgate, dup, p):
            if dy.size:
                call((dy, gate, up, dgate, dup), params(p))
        return kb

    def kf(gate, up, out, p):
        if out.size:
            call((gate, up, out), params(p))
    return kf


# ---- the bias_act family (bias_act:<act>): C-contiguous (outer, C, inner) views straight to C ----------


def _bias_act(s: dict, row: tuple, dtype: str, backward: bool) -> Callable:
    """forward kernel(x3, b, s, out3, p); backward kernel(dy3, x3, b, s, dx3, db_full, ds_full, p) -> the
    per-channel sums (2, C) in float64, or None where neither is asked for (p["sum_db"], p["sum_dscale"]).
    b and s: None, (C,) or x3's shape.  The C code takes aligned C-contiguous arrays: other inputs are
    copied, other outputs computed into contiguous results and written back (in place stays safe: every
    input is read before the write-back)."""
    from multiact import get_num_threads

    lib, ffi = s["lib"], s["ffi"]
    _, sym, _, names, cost = row
    fn = getattr(lib, sym)
    ct = "float *" if dtype == "float32" else "uint16_t *"
    null = ffi.NULL
    address = s.get("address") or s.setdefault("address", _address_reader(ffi))
    params = _param_blocks(ffi, names, ("gain", "clamp"), lambda gain, clamp: (float("inf"), 0.0, gain, clamp))

    def ok(a):
        return a.flags.c_contiguous and a.flags.aligned

    def ptr(a):
        return null if a is None else ffi.cast(ct, address(a))

    def kind(a):
        return 0 if a is None else 1 if a.ndim == 1 else 2

    def shape(x3, b, sc):
        o, c, i = x3.shape
        return ffi.new("ma_bshape *", [o, c, i, kind(b), kind(sc), cost, get_num_threads()])

    def fixed(arrays):
        return [a if a is None or ok(a) else np.require(a, requirements="CA") for a in arrays]

    if not backward:
        def kf(x3, b, sc, out3, p):
            if out3.size == 0:
                return
            x3, b, sc = fixed((x3, b, sc))
            dst = out3 if ok(out3) else np.empty(out3.shape, out3.dtype)
            fn(ptr(x3), ptr(b), ptr(sc), ptr(dst), shape(x3, b, sc), params(p))
            if dst is not out3:
                out3[...] = dst
        return kf

    def kb(dy3, x3, b, sc, dx3, db_full, ds_full, p):
        want = p["sum_db"] or p["sum_dscale"]
        sums = np.zeros((2, x3.shape[1])) if want else None
        if dx3.size == 0:
            return sums
        dy3, x3, b, sc = fixed((dy3, x3, b, sc))
        outs = [a if a is None or ok(a) else np.empty(a.shape, a.dtype) for a in (dx3, db_full, ds_full)]
        rc = fn(ptr(dy3), ptr(x3), ptr(b), ptr(sc), *(ptr(a) for a in outs),
                null if sums is None else ffi.cast("double *", sums.ctypes.data), shape(x3, b, sc), params(p))
        if rc:
            raise MemoryError(f"native bias_act backward ({sym}): no memory for the per-chunk sums of "
                              f"{x3.shape[1]} channels")
        for o, t in zip((dx3, db_full, ds_full), outs, strict=True):
            if o is not None and t is not o:
                o[...] = t
        return sums
    return kb


# ---- quantized outputs in one pass (multiact.core._fused; native/src/ma_quant.inc) ---------------------------

_QFMT = {"float8_e4m3fn": 0, "float8_e5m2": 1, "int8": 2}
_QDTYPE = {"float32": 0, "float16": 1, "bfloat16": 2}  # ma_quant.inc's input codes (its own enum)


def quantized(plan: Any, job: Any, kernel: Any, dtype: str, quant: Any) -> tuple | None:
    """The one pass of a quantized call (multiact.core._fused): per block of rows, groups or MX blocks held in
    cache, the activation or its backward in float32 (this ISA's float32 kernel on the inputs widened exactly),
    the amax, the scale as multiact.quant derives it and the codes (native/src/ma_quant.inc).  The forwards of
    the elementwise ops with one input (all but prelu) and of the gated family, and the elementwise backwards
    (dx from dy and x, or from dy and y); float32, float16 and bfloat16 inputs; every granularity, target dtype
    and option of multiact.Quant ("tensor" without a static scale: two passes over the blocks, the first for the
    amax).  None for the rest (the call core's two passes): other families and signatures (the gated and
    bias_act backwards), float64, empty or 0-d results, and a last axis the group does not divide (whose error
    the two passes raise)."""
    if dtype not in _QDTYPE:
        return None
    return _q_run(plan, job, _QDTYPE[dtype], quant, None)


def dequantized(plan: Any, job: Any, kernel: Any, parts: dict, quant: Any) -> tuple | None:
    """The one pass of a quantized forward on an int32 x (multiact.core._fused_dequant): each block of the input
    dequantized (multiact.dequant's float32 operations, in its order) into the buffer the activation reads, then
    as `quantized`.  `parts`: the family's jobs on the Dequant's parts broadcast to x's shape (their views line
    up with the inputs'); the same cases as `quantized`, else None (the call core's passes)."""
    views = {}
    for name, pj in parts.items():
        if pj is not None:
            got: list = []
            pj.run(lambda *a, got=got: got.append(a[:-1]), [None])
            views[name] = got[0] if len(got) == 1 else None
            if views[name] is None:
                return None
    return _q_run(plan, job, 3, quant, views)


_DQ_PARTS = ("bias_int", "weight_scale", "activation_scale", "bias_float")  # ma_qjob's dq[k][0..3]
_Q_KIND = {"unary": 0, "gated": 1, "binary": 2}  # ma_qjob's kind: the kernel signatures the one pass calls


def _q_run(plan: Any, job: Any, dcode: int, quant: Any, parts: dict | None) -> tuple | None:
    s = _load()
    if not s["ok"]:
        return None
    isa = s["isa"]
    lib, ffi = s["lib"], s["ffi"]
    run = getattr(lib, f"ma_q_run__{isa}", None)
    try:
        _, sym, signature, names, cost = entry(plan.key, plan.direction, "float32", isa)
    except (NotImplementedError, RuntimeError, ValueError):
        return None
    if run is None or signature not in _Q_KIND:
        return None
    got: list = []
    job.run(lambda *a: got.append(a[:-1]), [None])  # the family's views of the inputs (the result: not used)
    ins = got[0] if len(got) == 1 else ()
    k = 1 if signature == "unary" else 2
    if len(ins) != k or any(v is not None and len(v) != k for v in (parts or {}).values()):
        return None
    shape = tuple(ins[0].shape)
    if not shape or ins[0].size == 0:
        return None
    q = quant
    n = shape[-1]
    g = q.block or n
    if n % g:
        return None  # the two passes raise the error that names the group size
    given = [name for name in _DQ_PARTS if parts and parts.get(name) is not None]
    views = _q_rows((*ins, *(v for name in given for v in parts[name])), n)
    if views is None:
        return None
    (arows, an, rs, es), arrs = views
    from multiact import get_num_threads
    from multiact import quant as Q

    codes = np.empty(shape, np.uint8)
    tensor = q.granularity == "tensor"
    sshape = () if tensor else shape[:-1] + (n // g,)
    scales = np.empty(sshape, np.uint8 if q.granularity == "mx" else np.float32)
    zp = np.empty(sshape, np.int32) if not q.symmetric else None
    if signature != "gated":
        a, b, c, d = _packer(names)(job.p)
        pblock = ffi.new("ma_params *", {"a": a, "b": b, "c": c, "d": d, "da": a, "db": b, "dc": c, "dd": d})
    else:
        pblock = _param_blocks(ffi, names, ("limit", "shift"), lambda limit, shift: (limit, shift))(job.p)
    address = s.get("address") or s.setdefault("address", _address_reader(ffi))
    mode = (1 if q.scale is not None else 4) if tensor else (2 if q.rule == "ceil" else 3) if q.granularity == "mx" \
        else 0
    dq, dqrs, dqes = [[ffi.NULL] * 4 for _ in range(2)], [[0] * 4 for _ in range(2)], [[0] * 4 for _ in range(2)]
    for i, name in enumerate(given):  # part `name`'s view of input t is arrs[k + i * k + t]
        slot = _DQ_PARTS.index(name)
        for t in range(k):
            at = k + i * k + t
            dq[t][slot] = ffi.cast("void *", address(arrs[at]))
            dqrs[t][slot], dqes[t][slot] = rs[at], es[at]
    j = ffi.new("ma_qjob *", {
        "kind": _Q_KIND[signature], "fn": ffi.cast("void *", ffi.addressof(lib, sym)), "p": pblock,
        "cost": cost, "dtype": dcode, "x": ffi.cast("void *", address(arrs[0])),
        "up": ffi.cast("void *", address(arrs[k - 1])), "arows": arows, "an": an, "xrs": rs[0], "xes": es[0],
        "urs": rs[k - 1], "ues": es[k - 1], "fmt": 3 if zp is not None else _QFMT[q.dtype], "mode": mode,
        "group": g, "qmax": q.qmax, "ub": q.scale_ub or 0.0, "floor_": q.amax_floor or 0.0,
        "scale": float(np.float32(q.scale)) if q.scale is not None else 0.0, "pow2": int(q.pow2),
        "emax": Q.EMAX.get(q.dtype, 0), "codes": ffi.cast("uint8_t *", codes.ctypes.data),
        "scales": ffi.cast("void *", scales.ctypes.data),
        "zp": ffi.cast("int32_t *", zp.ctypes.data) if zp is not None else ffi.NULL, "nthreads": get_num_threads(),
        "dq": dq, "dqrs": dqrs, "dqes": dqes})
    if run(j):
        raise MemoryError(f"{plan.fn}: native quant: no memory for a block of {g} float32 values")
    res = (codes.view(Q._code_dtype(q.dtype)),)
    if q.granularity == "mx":
        import ml_dtypes

        return (*res, scales.view(ml_dtypes.float8_e8m0fnu))
    return (*res, scales) if zp is None else (*res, scales, zp)


def _q_rows(ins: tuple, n: int) -> tuple | None:
    """((rows, n, row strides, element strides), arrays) addressing the inputs as rows x n elements in the result's
    C order without a copy where their views allow it (contiguous rows addressed as one), else C-contiguous
    copies; None where an element stride is not a whole number of elements."""
    rows = ins[0].size // n
    flat = []
    for a in ins:
        v = a.view()
        try:
            v.shape = (rows, n)  # no copy, or AttributeError
        except AttributeError:
            v = np.ascontiguousarray(a).reshape(rows, n)
        if not v.flags.aligned:
            v = np.require(v, requirements="CA")
        flat.append(v)
    item = flat[0].itemsize
    if any(st % item for v in flat for st in v.strides):
        return None
    rs = [v.strides[0] // item for v in flat]
    es = [v.strides[1] // item for v in flat]
    if rows == 1 or all(r == e * n for r, e in zip(rs, es, strict=True)):
        return (1, rows * n, [0] * len(flat), es), flat
    return (rows, n, rs, es), flat
