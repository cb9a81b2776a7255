"""The `numba` backend: parallel loops compiled by numba around the scalar formulas of `formulas.py`.

Each (op, direction) is one scalar formula, shared with the `cuda` backend and
written once against a math namespace: for float32 the arithmetic-only
functions of `numba_math` (so the loop vectorises), for float64 libm, mirroring
`multiact.reference` operation for operation.  A factory wraps a formula in a `prange` loop, compiled lazily per
(op, direction, dtype) in two variants: serial for small arrays (no thread-pool
wake-up) and parallel.  float16 and non-contiguous arrays go through float32
(or float64) blocks of `_BLOCK` elements with `np.nditer` buffering, so an
in-place call never allocates a result-sized temporary.  bfloat16 (numba has no
such type) goes through float32 blocks made from its bits: compiled loops widen
the uint16 patterns (<< 16) and store with round-to-nearest-even in integer
arithmetic, NaN kept quiet (`multiact.dtypes`' rule, tested bit for bit against it).  The gated family's
kernels (gated:<act>: two inputs, two outputs backward) are at the end of this
file: one loop per key, direction and dtype over any strides, without copies
where the inner stride is 1.

Threads and fork().  The parallel loops run on the threading layer numba picks
(`NUMBA_THREADING_LAYER`, by default the first of tbb, omp, workqueue that
loads); this backend does not override the user's choice but makes each layer
safe for both threads and fork(), without adding a dependency:

- `tbb` is thread-safe and fork-safe; nothing to do.  (pip's `tbb` wheel is not
  found by numba outside conda, as libtbb lands in <prefix>/lib, off the loader
  path, and has no aarch64 build: so it is not a dependency.)
- `omp` is GNU OpenMP on Linux: thread-safe, but a process that started its pool
  cannot use it after fork() (the child is killed).  A fork handler marks such a
  child, which then runs only the serial loops (no pool at all), so a forked
  child or a fork Pool worker computes correctly, one thread per process.
- `workqueue` is fork-safe but not thread-safe (concurrent launches abort the
  process): one call at a time gets the pool, the others run serial loops.

The compiled loops are cached on disk where numba finds a writable place
(`NUMBA_CACHE_DIR` when set, else next to the source, else the user's cache).
Where none is usable the loops are compiled in memory, and `info()` says why;
an unusable `NUMBA_CACHE_DIR` turns caching off rather than letting numba fall
back to writing into the package tree.  Loops around a formula that was added
at run time (`formulas.register`: an op of `multiact.register_op`) are always
compiled in memory, since the cache keys hash formulas.py, not the module that
wrote the formula; when its formulas change (`formulas.on_change`) the loops
built on them are dropped.
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
from collections.abc import Callable
from contextlib import contextmanager
from functools import lru_cache, wraps
from typing import Any

import numpy as np

from multiact import vocab
from multiact._config import get_num_threads
from multiact._layout import coalesce, flat_views
from multiact.dtypes import f32_bits_to_bf16, is_bf16, to_float32
from multiact.optable import BIAS_ACT_KEYS, FAMILY_KEYS, KEYS

from . import formulas as _formulas_module

NAME = "numba"
PRIORITY = 20
KINDS = ("numpy",)

_PAR_MIN = 1 << 16  # below this many elements the serial loop wins (no pool wake-up)
_BLOCK = 1 << 16  # elements per buffered block (float16 / non-contiguous)
_DTYPES = vocab.DTYPE_NAMES


def _once(fn: Callable) -> Callable:
    """functools.cache for one hashable argument, built once even when threads ask at the same time
    (a duplicate loop pair would compile its loops a second time)."""
    memo: dict = {}
    lock = threading.Lock()

    @wraps(fn)
    def get(key):
        try:
            return memo[key]
        except KeyError:
            with lock:
                if key not in memo:
                    memo[key] = fn(key)
                return memo[key]

    def cache_clear() -> None:
        with lock:
            memo.clear()

    def discard(pred: Callable[[Any], bool]) -> None:
        """Forget the entries whose key pred accepts."""
        with lock:
            for k in [k for k in memo if pred(k)]:
                del memo[k]

    get.cache_clear = cache_clear
    get.discard = discard
    return get


# ---- availability -------------------------------------------------------------------------------


@lru_cache(maxsize=1)
def available() -> tuple[bool, str]:
    """(True, version) if numba imports and is recent enough; never raises."""
    try:
        import numba
    except Exception as e:  # noqa: BLE001 - any import failure means "not available"
        return False, f"numba is not importable ({type(e).__name__}: {e}); pip install numba"
    major, minor = (int(v) for v in numba.__version__.split(".")[:2])
    if (major, minor) < (0, 59):
        return False, f"numba {numba.__version__} is too old; pip install 'numba>=0.59'"
    return True, f"numba {numba.__version__}"


def info() -> dict[str, Any]:
    """Version, LLVM's host CPU name, the thread cap, the threading layer with its fork and thread
    behaviour, and whether compiled loops are cached on disk."""
    ok, reason = available()
    if not ok:
        return {"available": False, "reason": reason}
    import numba
    from llvmlite import binding

    cached, where = _cache_status()
    return {
        "numba": numba.__version__,
        "isa": binding.get_host_cpu_name(),
        "threads": _threads(),
        "max_threads": numba.config.NUMBA_NUM_THREADS,
        "threading_layer": _started_layer() or f"not started (NUMBA_THREADING_LAYER={numba.config.THREADING_LAYER})",
        "fork": _fork_behaviour(),
        "cache": f"on: {where}" if cached else f"off: {where}",
        "fp_mode": _fp_mode_text(),
    }


def _fp_mode_text() -> str:
    from ._fpmode import FOLLOWS

    if FOLLOWS:
        return ("worker threads compute in the caller's flush-to-zero, denormals-are-zero and rounding mode "
                "(the elementwise, gated and bias_act loops; a parameter gradient's sum in theirs)")
    return "worker threads compute in their own floating-point mode (no mode register known on this architecture)"


def supports(key: str, direction: str, dtype: str) -> bool:
    """Where formulas.py has the formula (an op registered without one falls through to numpy)."""
    from . import formulas

    if dtype not in _DTYPES:
        return False
    if key in FAMILY_KEYS:
        return direction in _GATED_ARITY and formulas.family_formulas(key) is not None
    if key in BIAS_ACT_KEYS:
        if direction == "backward_y":
            return formulas.family_y_formula(key) is not None
        return direction in _BIAS_ARITY and formulas.family_formulas(key) is not None
    return (key, direction) in formulas.TABLE


def kernel(key: str, direction: str, dtype: str) -> Callable:
    """The kernel for (kernel key, direction, dtype), following the calling conventions of the registry."""
    if not supports(key, direction, dtype):
        raise ValueError(f"numba backend has no kernel for {key} {direction} {dtype}")
    defn = KEYS[key].defn if key in KEYS else None
    if direction == "param_grad":  # an array parameter's gradient per channel, a scalar one's a sum
        return _channel_param_grad(key) if defn.array_param else _scalar_param_grad(key)
    wd = "float64" if dtype == "float64" else "float32"
    if direction == "backward2":  # kernel(g, dy, x, out, p); prelu's f'' takes no weight (0 for every w)
        loop_key = (_shared_key(key, direction), direction, wd)

        def backward2(g, dy, x, out, p):
            _run(loop_key, (g, dy, x), out, _params(key, p, dtype))

        return backward2
    if defn is not None and defn.array_param:  # prelu's weight per channel
        return _channel_forward(key) if direction == "forward" else _channel_backward(key)
    if key in FAMILY_KEYS:
        return _gated_kernel(key, direction, dtype, wd)
    if key in BIAS_ACT_KEYS:
        return _bias_kernel(key, direction, dtype, wd)

    if direction == "forward":

        def forward(x, out, p):
            _run((key, direction, wd), (x,), out, _params(key, p, dtype))

        return forward

    def backward(dy, x, out, p):
        _run((key, direction, wd), (dy, x), out, _params(key, p, dtype))

    return backward


def _shared_key(key: str, direction: str) -> str:
    """The first key (in TABLE's order) whose formula for `direction` is key's: keys that share a formula (the
    nine piecewise-linear ops' zero_grad2) share one compiled loop instead of one each."""
    from . import formulas

    name = formulas.TABLE[(key, direction)]
    return next(k for (k, d), f in formulas.TABLE.items() if d == direction and f == name)


# ---- an array parameter (prelu's weight) and the parameter gradients -------------------------------------

# prelu with one slope is leaky_relu: its loop, contiguous fast path included
_ONE_SLOPE = "leaky_relu"


def _channel_forward(key: str) -> Callable:
    array = KEYS[key].defn.array_param

    def forward(x, out, p):
        w = np.asarray(p[array], dtype=x.dtype)
        wd = "float64" if x.dtype == np.float64 else "float32"
        if w.size == 1:
            _run((_ONE_SLOPE, "forward", wd), (x,), out, (float(w.reshape(-1)[0]), 0.0))
        else:
            _run((key, "forward", wd), (x, np.broadcast_to(w, x.shape)), out, (0.0, 0.0))

    return forward


def _channel_backward(key: str) -> Callable:
    array = KEYS[key].defn.array_param

    def backward(dy, x, out, p):
        w = np.asarray(p[array], dtype=x.dtype)
        wd = "float64" if x.dtype == np.float64 else "float32"
        if w.size == 1:
            _run((_ONE_SLOPE, "backward", wd), (dy, x), out, (float(w.reshape(-1)[0]), 0.0))
        else:
            _run((key, "backward", wd), (dy, x, np.broadcast_to(w, x.shape)), out, (0.0, 0.0))

    return backward


def _reduce(key: str, dy: np.ndarray, x: np.ndarray, a: float) -> float:
    """sum over all elements of a float64 term(dy, x, a), blockwise in float64."""
    if x.size == 0:
        return 0.0
    if is_bf16(x.dtype):  # the exact float32 values of the bits (no bfloat16 cast in np.nditer)
        dy, x = to_float32(dy), to_float32(x)
    pair = _reductions(key)
    total = 0.0
    flats = flat_views(dy, x) if x.dtype == np.float64 else None
    chunks = [flats] if flats is not None else None
    if chunks is None:
        it = np.nditer(
            (dy, x), flags=["external_loop", "buffered", "zerosize_ok", "grow_inner"],
            op_flags=[["readonly", "contig"], ["readonly", "contig"]], op_dtypes=[np.float64, np.float64],
            casting="safe", buffersize=_BLOCK, order="K",
        )
        with it:
            for c in it:
                total += _reduce_call(pair, c, a)
        return total
    return _reduce_call(pair, chunks[0], a)


def _reduce_call(pair, arrays, a) -> float:
    arrays = _inputs(arrays)
    return float(_call(pair, arrays[0].shape[0], (*arrays, a, 0.0)))


def _scalar_param_grad(key: str) -> Callable:
    """d/d(param) of sum(dy * op(x, param)) for a scalar parameter (swish's beta), accumulated in float64."""
    name = KEYS[key].defn.param_grad

    def grad(dy, x, p) -> float:
        return _reduce(key, dy, x, float(p[name]))

    return grad


def _channel_param_grad(key: str) -> Callable:
    """Per-channel sum of the weight's term (prelu: dy * x over x <= 0), in float64, shaped like the weight."""
    array = KEYS[key].defn.array_param

    def grad(dy, x, p) -> np.ndarray:
        w = np.asarray(p[array])
        if w.size == 1:
            return np.full(w.shape, _reduce(key, dy, x, 0.0))
        axis = int(p["axis"])
        xm, dym = np.moveaxis(x, axis, 0), np.moveaxis(dy, axis, 0)
        sums = np.array([_reduce(key, dym[c], xm[c], 0.0) for c in range(xm.shape[0])])
        return sums.reshape(w.shape)

    return grad


@_once
def _reductions(key: str) -> _LoopPair:
    """The float64 loop of an op's parameter-gradient term, tagged <op>_<parameter> (swish_beta, prelu_weight)."""
    from . import formulas

    name = formulas.TABLE[(key, "param_grad")]
    return _LoopPair(getattr(_formulas("float64"), name), 0, f"{key}_{KEYS[key].defn.param_grad}", _cache_for(name))


# ---- parameters -------------------------------------------------------------------------------


def _params(op: str, p: dict, dtype: str) -> tuple[float, float]:
    """(a, b) as float64; rounded to float32 first for float16/float32, as the tests do."""
    from . import formulas

    return formulas.scalar_params(op, p, dtype)


# ---- threads, fork() and layout ----------------------------------------------------------------------

# numba's threading layers: (thread-safe, fork-safe), as numba documents them.  GNU OpenMP (Linux's omp)
# kills a forked child that uses the pool its parent started; other OpenMPs are fork-safe.
_LAYERS = {"tbb": (True, True), "omp": (True, not sys.platform.startswith("linux")), "workqueue": (False, True)}
_serial_why = ""  # set in a forked child whose parent had started a pool that fork() breaks
_pool_lock = threading.Lock()  # the one turn at a pool that is not thread-safe


def _started_layer() -> str | None:
    """The threading layer numba's pool runs on, or None while no pool has been started."""
    numba = sys.modules.get("numba")
    if numba is None:
        return None
    try:
        return numba.threading_layer()
    except ValueError:  # "Threading layer is not initialized."
        return None


def _after_fork_in_child() -> None:
    """Serial loops only in a child of a process whose pool cannot survive fork() (never touch it)."""
    global _serial_why
    layer = _started_layer()
    if layer is not None and not _LAYERS.get(layer, (False, False))[1]:
        _serial_why = f"forked from a process that had started numba's {layer} pool, which is not fork-safe"


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _fork_behaviour() -> str:
    """For info(): what this process and its forked children do with the pool."""
    if _serial_why:
        return f"serial loops only: {_serial_why}"
    layer = _started_layer()
    if layer is None:
        return "decided when the pool starts: serial loops in forked children if it is not fork-safe"
    thread_safe, fork_safe = _LAYERS.get(layer, (False, False))
    kids = "parallel loops" if fork_safe else "serial loops only (the pool is not fork-safe)"
    turns = "" if thread_safe else "; one thread at a time uses the pool (it is not thread-safe)"
    return f"forked children: {kids}{turns}"


def _threads() -> int:
    """multiact's thread budget, capped by the threads numba's pool was started with; 1 in a forked
    child that must not touch its parent's pool."""
    if _serial_why:
        return 1
    import numba

    return max(1, min(get_num_threads(), numba.config.NUMBA_NUM_THREADS))


@contextmanager
def _pool_turn():
    """True when this call may run on numba's pool now: always on a thread-safe layer; on one that is
    not (workqueue), only while no other thread is on it, so that concurrent calls never abort."""
    import numba

    numba.set_num_threads(_threads())  # starts the pool on first use: the layer is known from here on
    if _LAYERS.get(_started_layer(), (False, False))[0]:
        yield True
        return
    got = _pool_lock.acquire(blocking=False)
    try:
        yield got
    finally:
        if got:
            _pool_lock.release()


def _inputs(arrays) -> tuple:
    """Read-only views of the input arrays, so that every call reaches a loop with one signature.

    numba compiles a specialisation per argument type, and an array's type includes whether it is
    writable: a user's array is, an `np.nditer` read buffer is not.  Without this most loops were
    compiled twice (float32 and float16 calls reach the same float32 loop), a second or more each.
    """
    out = []
    for v in arrays:
        if v.flags.writeable:
            v = v.view()
            v.flags.writeable = False
        out.append(v)
    return tuple(out)


def _call(pair, n: int, args: tuple, parallel: bool | None = None) -> Any:
    """The parallel loop for n >= _PAR_MIN elements when threads are allowed (parallel: decided by
    the caller for a whole blocked call), else the serial one."""
    if parallel is None:
        parallel = _threads() > 1
    if parallel and n >= _PAR_MIN:
        with _pool_turn() as turn:
            if turn:
                return pair.call(True, *args)
    return pair.call(False, *args)


def _dispatch(pair, arrays, a, b, parallel: bool | None = None) -> None:
    """Run the serial or the parallel compiled loop on contiguous 1-D arrays (inputs..., out).

    The inputs are passed read-only, as `compile_blocks` compiles them: one signature per loop."""
    arrays = (*_inputs(arrays[:-1]), arrays[-1])
    _call(pair, arrays[0].shape[0], (*arrays, a, b), parallel)


def _run(key, ins: tuple, out: np.ndarray, ab: tuple[float, float], work=None) -> None:
    """Apply the compiled loop for `key` elementwise over ins -> out (any strides, any float dtype).

    Nothing is written to out unless the loops compile: the flat path compiles at its one call;
    the blocked path compiles every loop it will use before the iterator exists (closing an
    iterator flushes its output buffer into out, even after an error).
    """
    if out.size == 0:
        return
    pair = _loops(key)
    a, b = ab
    if out.dtype.kind == "V":  # bfloat16
        parallel = out.size >= _PAR_MIN and _threads() > 1
        pair.compile_blocks(len(ins), np.float32, parallel)
        for chunk in _bf16_chunks(ins, (out,)):
            _dispatch(pair, chunk, a, b, parallel)
        return
    if out.dtype != np.float16:
        flats = flat_views(*ins, out)
        if flats is not None:
            _dispatch(pair, flats, a, b)
            return
    wdt = np.float64 if out.dtype == np.float64 else np.float32
    parallel = out.size >= _PAR_MIN and _threads() > 1
    pair.compile_blocks(len(ins), wdt, parallel)
    it = np.nditer(
        (*ins, out),
        flags=["external_loop", "buffered", "zerosize_ok", "grow_inner"],
        # contiguous blocks, so that every block has the one signature compiled above
        op_flags=[["readonly", "contig"]] * len(ins) + [["writeonly", "contig"]],
        op_dtypes=[wdt] * (len(ins) + 1),
        casting="same_kind",
        buffersize=_BLOCK,
        order="K",
    )
    with it:
        for chunk in it:
            _dispatch(pair, chunk, a, b, parallel)


# ---- bfloat16: float32 blocks from the bits ----------------------------------------------------------


def _bf16_widen_loop(h, bits):
    for i in range(h.shape[0]):
        bits[i] = np.uint32(h[i]) << np.uint32(16)


def _bf16_store_loop(u, out):
    for i in range(u.shape[0]):
        v = u[i]
        r = (v + np.uint32(0x7FFF) + ((v >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
        if (v & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000):  # NaN: quiet, sign and high payload kept
            r = (v >> np.uint32(16)) | np.uint32(0x40)
        out[i] = np.uint16(r)


@lru_cache(maxsize=1)
def bf16_codec() -> tuple[Callable, Callable]:
    """(widen(uint16 bits, uint32 out), store(float32 bits as uint32, uint16 out)), compiled for their one
    signature (inputs read-only, C-contiguous 1-D) before any caller writes anything."""
    from numba import njit, types

    jit = njit(error_model="numpy", cache=_cache_status()[0])
    widen, store = jit(_bf16_widen_loop), jit(_bf16_store_loop)
    u16, u32 = types.Array(types.uint16, 1, "C"), types.Array(types.uint32, 1, "C")
    widen.compile((types.Array(types.uint16, 1, "C", readonly=True), u32))
    store.compile((types.Array(types.uint32, 1, "C", readonly=True), u16))
    return widen, store


def _ro(a: np.ndarray) -> np.ndarray:
    if a.flags.writeable:
        a = a.view()
        a.flags.writeable = False
    return a


def _bf16_chunks(ins: tuple, outs: tuple, block: int = _BLOCK):
    """float32 blocks of bfloat16 operands: yields (input blocks..., output blocks...), contiguous float32
    of one length; once the caller has filled the output blocks they are stored (rounded once) into the
    outputs' bits, before the next inputs are read (in place is safe).  Contiguous operands are sliced,
    others go through np.nditer's uint16 buffers (no casting)."""
    widen, store = bf16_codec()
    bits = tuple(a.view(np.uint16) for a in (*ins, *outs))
    n = outs[0].size
    bufs = [np.empty(min(n, block), np.float32) for _ in bits]
    nin = len(ins)

    def run(chunk):
        m = chunk[0].shape[0]
        f = [b[:m] for b in bufs]
        for c, fb in zip(chunk[:nin], f, strict=False):
            widen(_ro(c), fb.view(np.uint32))
        yield tuple(f)
        for c, fb in zip(chunk[nin:], f[nin:], strict=True):
            store(_ro(fb.view(np.uint32)), c)

    flats = flat_views(*bits)
    if flats is not None:
        for i in range(0, n, block):
            yield from run([a[i:i + block] for a in flats])
        return
    it = np.nditer(
        bits,
        flags=["external_loop", "buffered", "zerosize_ok", "grow_inner"],
        op_flags=[["readonly", "contig"]] * nin + [["writeonly", "contig"]] * len(outs),
        buffersize=block,
        order="K",
    )
    with it:
        for chunk in it:
            yield from run(chunk)


# ---- the formulas -----------------------------------------------------------------------------------


@_once
def _formulas(dtype: str):
    """The formulas of `formulas.py`, compiled for the CPU: float32 against `numba_math` (vectorisable),
    float64 against libm (mirroring the reference)."""
    from . import formulas, numba_math

    jit = numba_math.cpu_jit(contract=dtype == "float32")
    if dtype == "float32":
        return formulas.build(jit, np.float32, numba_math.cpu())
    return formulas.build(jit, np.float64, formulas.libm(jit, np.float64))


# ---- loops ------------------------------------------------------------------------------------------


class _LoopPair:
    """The serial and parallel compiled loops around one scalar formula, each compiled on first use.

    The parallel loop of an elementwise formula is a `prange` over blocks of `_PAR_BLOCK` elements that
    calls the serial loop on each block: it compiles in about a second (a parfor around the inlined
    formula took 2-4x the serial loop's time, 10 s and more for mish), and every element goes through
    the serial loop's machine code whatever the number of threads.

    A loop that fails to build or compile is dropped, not kept: numba remembers a failed typing
    per dispatcher, so a kept one would fail for good, even once the cause is gone.  An elementwise
    pair drops both loops, the parallel one holding the serial one.
    """

    def __init__(self, scalar: Callable, arity: int, tag: str, cache: bool | None = None):
        self.scalar, self.arity, self.tag = scalar, arity, tag
        self.cache = cache  # False: compile in memory (a formula added at run time); None: on disk where possible
        self._loops: list = [None, None]  # serial, parallel
        self._blocks: set = set()  # (parallel, dtype) whose block signature is compiled
        self._lock = threading.RLock()  # threads meeting a cold loop build it once, not once each

    def loop(self, parallel: bool):
        loop = self._loops[parallel]
        if loop is None:
            with self._lock:
                loop = self._loops[parallel]
                if loop is None:
                    inner = self.loop(False) if parallel and self.arity else self.scalar  # reductions: a parfor
                    loop = self._loops[parallel] = _make_loop(inner, self.arity, parallel, self.tag, self.cache)
        return loop

    def _forget(self, parallel: bool, loop) -> None:
        with self._lock:
            if self._loops[parallel] is loop:
                drop = (False, True) if self.arity else (parallel,)
                for k in drop:
                    self._loops[k] = None
                self._blocks = {k for k in self._blocks if k[0] not in drop}

    def call(self, parallel: bool, *args):
        """Run a loop; if it raises (in nopython code only compilation can), drop it."""
        loop = self.loop(parallel)
        try:
            return loop(*args)
        except BaseException:
            self._forget(parallel, loop)
            raise

    def compile_blocks(self, nin: int, wdt, parallel: bool) -> None:
        """Compile the serial loop (and the parallel one) for the blocked path's contiguous blocks."""
        for par in (False, True) if parallel else (False,):
            if (par, wdt) in self._blocks:
                continue
            from numba import float64, from_dtype, types

            t = from_dtype(np.dtype(wdt))
            sig = (types.Array(t, 1, "C", readonly=True),) * nin + (types.Array(t, 1, "C"), float64, float64)
            loop = self.loop(par)
            try:
                loop.compile(sig)
            except BaseException:
                self._forget(par, loop)
                raise
            self._blocks.add((par, wdt))


_LOOP = "def {name}({args}a, b):\n    for i in prange({first}.shape[0]):\n        out[i] = {g}({items}a, b)\n"
_TEMPLATES = {
    0: "def {name}(u, v, a, b):\n    acc = 0.0\n    for i in prange(u.shape[0]):\n"
    "        acc += {g}(u[i], v[i], a, b)\n    return acc\n",
    1: _LOOP.replace("{args}", "x, out, ").replace("{first}", "x").replace("{items}", "x[i], "),
    2: _LOOP.replace("{args}", "u, v, out, ").replace("{first}", "u").replace("{items}", "u[i], v[i], "),
    3: _LOOP.replace("{args}", "u, v, w, out, ").replace("{first}", "u").replace("{items}", "u[i], v[i], w[i], "),
}
_PAR_BLOCK = 1 << 13  # elements per block of a parallel loop (32 KB of float32: in L1/L2, many blocks per thread)
_BLOCKED = (
    "def {name}({args}a, b):\n    n = {first}.shape[0]\n    mode = fp_get()\n"
    "    for k in prange((n + _PAR_BLOCK - 1) // _PAR_BLOCK):\n"
    "        fp_adopt(mode)\n"
    "        lo = k * _PAR_BLOCK\n        hi = min(lo + _PAR_BLOCK, n)\n        {g}({slices}a, b)\n"
)
_PARALLEL = {
    k: _BLOCKED.replace("{args}", args).replace("{first}", args[0])
    .replace("{slices}", "".join(f"{v.strip()}[lo:hi], " for v in args.split(",")[:-1]))
    for k, args in ((1, "x, out, "), (2, "u, v, out, "), (3, "u, v, w, out, "))
}


@lru_cache(maxsize=1)
def _source_tag() -> str:
    """A hash of this file, formulas.py, numba_math.py and its coefficients: on-disk cache entries are
    keyed by it (numba only watches the file that defines a cached function, not the inlined helpers)."""
    import hashlib

    from . import _fpmode, _numba_coeffs, formulas, numba_math

    h = hashlib.sha1()
    for path in (__file__, formulas.__file__, numba_math.__file__, _numba_coeffs.__file__, _fpmode.__file__):
        with open(path, "rb") as fh:
            h.update(fh.read())
    return h.hexdigest()[:10]


def _cache_probe():
    return 0


def _unwritable(path: str) -> str:
    """Why numba could not cache in path ("" if it can): the check numba's cache locators make."""
    try:
        os.makedirs(path, exist_ok=True)
        tempfile.TemporaryFile(dir=path).close()
    except OSError as e:
        return f"{type(e).__name__}: {e}"
    return ""


@lru_cache(maxsize=1)
def _cache_status() -> tuple[bool, str]:
    """(True, where) if the loops can be cached on disk, else (False, why).

    Decided once per process, before any loop is made: an uncachable njit(cache=True) raises at
    creation ("no locator available"), and an unusable NUMBA_CACHE_DIR makes numba cache in the
    package tree instead, which the user who set it did not ask for.
    """
    from numba import config, njit

    if config.CACHE_DIR:
        why = _unwritable(config.CACHE_DIR)
        if why:
            return False, f"NUMBA_CACHE_DIR={config.CACHE_DIR} is not usable ({why}); compiling in memory"
    try:
        probe = njit(cache=True)(_cache_probe)  # runs numba's locators; compiles nothing
    except RuntimeError as e:
        return False, f"no writable cache directory ({e}); compiling in memory"
    return True, str(probe.stats.cache_path)


def _make_loop(g: Callable, arity: int, parallel: bool, tag: str, cache: bool | None = None):
    """The prange loop around g, compiled with cache=True where a cache can be written (see
    `_cache_status`; cache=None asks it).

    g is the scalar formula, except for a parallel elementwise loop (arity >= 1), where it is the
    serial loop, called per block (see `_LoopPair`).
    The loop is generated as a module-level function (not a closure) whose
    scalar is a module global: numba's on-disk cache keys closures by a pickle of
    their cells, which is not stable across processes, so closures never hit.
    A loop compiled in memory (cache False) is made in a copy of the module's
    globals instead, so that it leaves nothing behind in the module.
    """
    from numba import njit, prange

    if cache is None:
        cache = _cache_status()[0]
    name = f"_loop_{tag}_{'par' if parallel else 'ser'}_{_source_tag()}"
    # float32 loops may fuse a * b + c into one FMA (more accurate, fewer instructions); float64
    # loops stay unfused so that they round exactly like the reference formulas.
    fastmath = {"contract"} if tag.endswith("float32") else False
    blocked = parallel and arity != 0
    gname = f"_{'serial' if blocked else 'scalar'}_{tag}"
    ns = globals() if cache else dict(globals())
    ns[gname] = g
    ns.setdefault("prange", prange)
    if parallel:  # the caller's floating-point mode, adopted by every worker (multiact/backend/_fpmode.py)
        from ._fpmode import fp_adopt, fp_get

        ns.setdefault("fp_get", fp_get)
        ns.setdefault("fp_adopt", fp_adopt)
    templates = _GATED_PARALLEL if arity in _GATED_TEMPLATES else _PARALLEL
    template = templates[arity] if blocked else {**_TEMPLATES, **_GATED_TEMPLATES}[arity]
    exec(compile(template.format(name=name, g=gname), __file__, "exec"), ns)
    return njit(parallel=parallel, error_model="numpy", fastmath=fastmath, cache=cache)(ns[name])


@_once
def _loops(key: tuple[str, str, str]) -> _LoopPair:
    from . import formulas

    op, direction, dtype = key
    name = formulas.TABLE[(op, direction)]
    scalar = getattr(_formulas(dtype), name)
    # the direction's arrays, and prelu's weight (its f'' takes none)
    array = op in KEYS and KEYS[op].defn.array_param and direction != "backward2"
    arity = vocab.DIRECTIONS[direction].arity + (1 if array else 0)
    return _LoopPair(scalar, arity, f"{op}_{direction}_{dtype}", _cache_for(name))


def _cache_for(*names: str | None) -> bool | None:
    """None (on disk where possible) for loops around formulas.py's own formulas; False (in memory) where one was
    added at run time: the cache keys hash formulas.py, so they cannot tell one such formula from another."""
    return None if all(_formulas_module.in_source(n) for n in names if n) else False


@_formulas_module.on_change
def _forget(key: str) -> None:
    """Drop every loop built on kernel key `key`'s formulas (added or taken out at run time: formulas.register)."""
    _loops.discard(lambda k: k[0] == key)
    _reductions.discard(lambda k: k == key)
    _gated_loops.discard(lambda k: k[0].split(":", 1)[1] == key)


# ---- the gated family: two inputs (gate, up), one output forward, two backward -------------------------------
#
# One serial loop per (kernel key, direction, compute type), of one signature whatever the layout: every
# operand is passed as a flat writable 1-D base array (C layout, so LLVM vectorises), an offset, a row
# stride and an inner stride, over a (rows, n) grid that every layout reduces to (contiguous arrays are
# one row; the halves of x along any dim are rows of contiguous runs; interleaved halves are rows of
# stride 2).  An operand of inner stride 1 is used in place; any other is gathered into (or scattered
# from) a contiguous block of _GATED_BLOCK elements, so the formula's loop always runs on contiguous
# blocks.  The parallel loop splits the grid into tiles of about _PAR_BLOCK elements and calls the serial
# loop on each.  float16, and layouts that do not reduce to two dims, go through np.nditer's float32
# (float64) buffers.  Each element's inputs are read before its results are written: in place is safe.

_GATED_ARITY = {"forward": "gated_forward", "backward": "gated_backward"}
_GATED_IO = {"gated_forward": (2, 1), "gated_backward": (3, 2)}  # (inputs, outputs)
_GATED_BLOCK = 1 << 11  # elements per gathered block (8 KB of float32 per operand: L1-resident)


def _gated_serial_source(nin: int, nout: int) -> str:
    ops = list(range(nin + nout))
    args = "".join(f"b{k}, o{k}, r{k}, s{k}, " for k in ops)
    lines = [f"def {{name}}({args}rows, n, a, b, lim, sh):", "    m = min(n, _GATED_BLOCK)"]
    lines += [f"    t{k} = np.empty(m if s{k} != 1 else 0, b{k}.dtype)" for k in ops]
    lines += ["    for r in range(rows):", "        for c in range(0, n, _GATED_BLOCK):",
              "            k = min(_GATED_BLOCK, n - c)"]
    for k in ops:
        lines.append(f"            p{k} = o{k} + r * r{k} + c * s{k}")
        lines += [f"            if s{k} == 1:", f"                v{k} = b{k}[p{k}:p{k} + k]", "            else:"]
        if k < nin:
            lines += ["                for j in range(k):", f"                    t{k}[j] = b{k}[p{k} + j * s{k}]"]
        lines.append(f"                v{k} = t{k}[:k]")
    ins = ", ".join(f"v{k}[j]" for k in range(nin))
    lines.append("            for j in range(k):")
    if nout == 1:
        lines.append(f"                v{nin}[j] = {{g}}({ins}, a, b, lim, sh)")
    else:
        res = ", ".join(f"e{k}" for k in range(nout))
        lines.append(f"                {res} = {{g}}({ins}, a, b, lim, sh)")
        lines += [f"                v{nin + k}[j] = e{k}" for k in range(nout)]
    for k in range(nin, nin + nout):
        lines += [f"            if s{k} != 1:", "                for j in range(k):",
                  f"                    b{k}[p{k} + j * s{k}] = t{k}[j]"]
    return "\n".join(lines) + "\n"


def _gated_parallel_source(nin: int, nout: int) -> str:
    ops = list(range(nin + nout))
    args = "".join(f"b{k}, o{k}, r{k}, s{k}, " for k in ops)
    call = "".join(f"b{k}, o{k} + rr * r{k} + cc * s{k}, r{k}, s{k}, " for k in ops)
    return (
        f"def {{name}}({args}rows, n, a, b, lim, sh, tr, tc):\n"
        "    nr = (rows + tr - 1) // tr\n"
        "    nc = (n + tc - 1) // tc\n"
        "    mode = fp_get()\n"
        "    for t in prange(nr * nc):\n"
        "        fp_adopt(mode)\n"
        "        i = t // nc\n"
        "        rr = i * tr\n"
        "        cc = (t - i * nc) * tc\n"
        f"        {{g}}({call}min(tr, rows - rr), min(tc, n - cc), a, b, lim, sh)\n"
    )


_GATED_TEMPLATES = {k: _gated_serial_source(*io) for k, io in _GATED_IO.items()}
_GATED_PARALLEL = {k: _gated_parallel_source(*io) for k, io in _GATED_IO.items()}


def _gated_kernel(key: str, direction: str, dtype: str, wd: str) -> Callable:
    from . import formulas

    def forward(gate, up, out, p):
        _run_gated((key, direction, wd), (gate, up), (out,), formulas.family_params(key, p, dtype))

    def backward(dy, gate, up, dgate, dup, p):
        _run_gated((key, direction, wd), (dy, gate, up), (dgate, dup), formulas.family_params(key, p, dtype))

    run = forward if direction == "forward" else backward
    run.__name__ = f"numba_{key.replace(':', '_')}_{direction}_{dtype}"
    return run


@_once
def _gated_loops(key: tuple[str, str, str]) -> _LoopPair:
    from . import formulas, numba_math

    fam_key, direction, dtype = key
    # the family body fuses as its loop does (bias_act's z = x * s + b must not: see the tag below)
    jit = numba_math.cpu_jit(contract=dtype == "float32" and fam_key not in BIAS_ACT_KEYS)
    fam = formulas.build_family(jit, np.dtype(dtype).type, _formulas(dtype), fam_key)
    tag = f"{fam_key.replace(':', '_')}_{direction}_{dtype}"
    if fam_key in BIAS_ACT_KEYS:
        # no FMA contraction ("_exact" keeps the tag off float32's fastmath): z = x * s + b rounds twice, as
        # the reference's z, whose last bit the suite's slack measures relative to z, not to x * s
        tag += "_exact"
    arity = (_BIAS_ARITY if fam_key in BIAS_ACT_KEYS else _GATED_ARITY)[direction]
    act = (*formulas.family_formulas(fam_key), formulas.family_y_formula(fam_key))
    return _LoopPair(getattr(fam, direction), arity, tag, _cache_for(*act))


def _gated_signature(nops: int, wdt) -> tuple:
    from numba import float64, from_dtype, int64, types

    arr = types.Array(from_dtype(np.dtype(wdt)), 1, "C")
    return (arr, int64, int64, int64) * nops + (int64, int64, float64, float64, float64, float64)


def _gated_compile(pair: _LoopPair, nops: int, wdt, parallel: bool) -> None:
    """Compile the serial loop (and the parallel one) for their one signature before anything is written."""
    from numba import int64

    for par in (False, True) if parallel else (False,):
        if (par, wdt) in pair._blocks:
            continue
        loop = pair.loop(par)
        sig = _gated_signature(nops, wdt) + ((int64, int64) if par else ())
        try:
            loop.compile(sig)
        except BaseException:
            pair._forget(par, loop)
            raise
        pair._blocks.add((par, wdt))


def _base(a: np.ndarray) -> tuple[np.ndarray, int]:
    """(a writable 1-D array over the memory a spans, from its lowest address; a's first element's offset in it).

    The base is built from a's address (the loops never write an input's base), so that every operand has
    the one array type of the compiled loop, whatever a's flags; the caller keeps a alive meanwhile."""
    item = a.itemsize
    lo = hi = 0
    for n, st in zip(a.shape, a.strides, strict=True):
        if st < 0:
            lo += (n - 1) * st
        else:
            hi += (n - 1) * st
    ptr = a.__array_interface__["data"][0]

    class _Span:
        __array_interface__ = {"shape": ((hi - lo) // item + 1,), "typestr": a.dtype.str, "version": 3,
                               "data": (ptr + lo, False), "strides": None}

    return np.asarray(_Span()), -lo // item


def _grid2(arrays: tuple[np.ndarray, ...], lead: int) -> tuple[int, int, list[tuple[int, int]]] | None:
    """(rows, n, [(row stride, inner stride)] in elements per array) when every array's elements lie on one
    (rows, n) grid (dims of size 1 dropped, ordered by array `lead`'s strides, dims merged where every array
    allows); None when more than two dims remain."""
    shape = arrays[0].shape
    item = arrays[0].itemsize
    strides = [[s // item for s in a.strides] for a in arrays]
    shp, sts = coalesce(shape, strides, lead)
    if len(shp) > 2:
        return None
    shp = [1] * (2 - len(shp)) + shp
    sts = [[0] * (2 - len(st)) + st for st in sts]
    return shp[0], shp[1], [(st[0], st[1]) for st in sts]


def _gated_call(pair: _LoopPair, arrays: tuple[np.ndarray, ...], rows: int, n: int, strides, params,
                parallel: bool | None = None) -> None:
    args: list = []
    for a, (rs, s) in zip(arrays, strides, strict=True):
        base, off = _base(a)
        args += [base, off, rs, s]
    args += [rows, n, *params]
    if parallel is None:
        parallel = _threads() > 1
    if parallel and rows * n >= _PAR_MIN:
        with _pool_turn() as turn:
            if turn:
                tc = min(n, _PAR_BLOCK)
                tr = max(1, _PAR_BLOCK // tc)
                pair.call(True, *args, tr, tc)
                return
    pair.call(False, *args)


def _run_gated(key: tuple[str, str, str], ins: tuple, outs: tuple, params: tuple[float, ...]) -> None:
    """The gated loop over ins -> outs (one shape, any strides, any float dtype); nothing is written unless
    the loops compile (both are compiled before the first call, or before np.nditer exists)."""
    out = outs[0]
    if out.size == 0:
        return
    pair = _gated_loops(key)
    nops = len(ins) + len(outs)
    wdt = np.float64 if out.dtype == np.float64 else np.float32
    parallel = out.size >= _PAR_MIN and _threads() > 1
    _gated_compile(pair, nops, wdt, parallel)
    arrays = (*ins, *outs)
    if out.dtype.kind == "V":  # bfloat16: float32 blocks from the bits
        for chunk in _bf16_chunks(ins, outs):
            _gated_call(pair, chunk, 1, chunk[0].shape[0], [(0, 1)] * nops, params, parallel)
        return
    grid = _grid2(arrays, len(ins)) if out.dtype != np.float16 else None
    if grid is not None:
        _gated_call(pair, arrays, *grid, params, parallel)
        return
    it = np.nditer(
        arrays,
        flags=["external_loop", "buffered", "zerosize_ok", "grow_inner"],
        op_flags=[["readonly", "contig"]] * len(ins) + [["writeonly", "contig"]] * len(outs),
        op_dtypes=[wdt] * nops,
        casting="same_kind",
        buffersize=_BLOCK,
        order="K",
    )
    with it:
        for chunk in it:
            m = chunk[0].shape[0]
            _gated_call(pair, chunk, 1, m, [(0, 1)] * nops, params, parallel)


# ---- the bias_act family: x seen as (outer, C, inner), b and scale per channel or of x's shape ---------------
#
# One serial loop per (kernel key, direction, compute type), of one signature whatever the layout: every operand
# is a flat writable 1-D base array (see `_base`), an offset and three element strides (outer, channel, inner);
# a per-channel b or scale has outer and inner strides 0, a missing one is a one-element dummy (flags hb, hs say
# which are given).  The loop runs over a range of (outer, channel) rows, so that the parallel loop can split
# the grid into tiles of about _PAR_BLOCK elements and call the serial loop on each; the backward's per-channel
# sums of dz and dz * x are float64 row sums added into a (2, C) array, one per outer tile in the parallel loop
# (race-free), summed in a fixed order at the end.  float16 goes through float32 pieces of at most _BLOCK
# elements.  Each element's inputs are read before its results are written: in place is safe.

_BIAS_ARITY = {"forward": "bias_act_forward", "backward": "bias_act_backward", "backward_y": "bias_act_backward_y"}
# x, b, s, out | dy, x, b, s, dx, db, ds | dy, y, -, -, dx, db, - (the y form: the backward's operands, b and s unused)
_BIAS_OPS = {"bias_act_forward": 4, "bias_act_backward": 7, "bias_act_backward_y": 7}
_BIAS_MAX_TILES = 64  # outer tiles of a parallel backward with sums: each holds a (2, C) float64 partial


def _bias_args(k: int) -> str:
    return "".join(f"b{i}, f{i}, p{i}, q{i}, r{i}, " for i in range(k))


def _bias_serial_source(fn: str) -> str:
    nops = _BIAS_OPS[fn]
    fwd = fn == "bias_act_forward"
    lines = [f"def {{name}}({_bias_args(nops)}olo, ohi, clo, chi, n, hb, hs, hdb, hds, want, sums, a, b, gain, clamp):",
             "    for o in range(olo, ohi):", "        for c in range(clo, chi):"]
    lines += [f"            k{i} = f{i} + o * p{i} + c * q{i}" for i in range(nops)]
    if fwd:
        lines += ["            for j in range(n):",
                  "                b3[k3 + j * r3] = {g}(b0[k0 + j * r0], b1[k1 + j * r1], b2[k2 + j * r2], "
                  "a, b, hb, hs, gain, clamp)"]
        return "\n".join(lines) + "\n"
    if fn == "bias_act_backward_y":  # dz from y alone; its sum is db's
        lines += [
            "            acc0 = 0.0",
            "            for j in range(n):",
            "                dz = {g}(b0[k0 + j * r0], b1[k1 + j * r1], a, b, gain, clamp)",
            "                b4[k4 + j * r4] = dz",
            "                if hdb:",
            "                    b5[k5 + j * r5] = dz",
            "                acc0 += np.float64(dz)",
            "            if want:",
            "                sums[0, c] += acc0",
        ]
        return "\n".join(lines) + "\n"
    lines += [
        # one loop (each inlined copy of the formula costs compile time): the sums are cheap beside it
        "            acc0 = 0.0",
        "            acc1 = 0.0",
        "            for j in range(n):",
        "                xv = b1[k1 + j * r1]",
        "                dx, dz = {g}(b0[k0 + j * r0], xv, b2[k2 + j * r2], b3[k3 + j * r3], a, b, hb, hs, gain, "
        "clamp)",
        "                b4[k4 + j * r4] = dx",
        "                if hdb:",
        "                    b5[k5 + j * r5] = dz",
        "                if hds:",
        "                    b6[k6 + j * r6] = dz * xv",
        "                acc0 += np.float64(dz)",
        "                acc1 += np.float64(dz) * np.float64(xv)",
        "            if want:",
        "                sums[0, c] += acc0",
        "                sums[1, c] += acc1",
    ]
    return "\n".join(lines) + "\n"


def _bias_parallel_source(fn: str) -> str:
    args = _bias_args(_BIAS_OPS[fn])
    return (
        f"def {{name}}({args}olo, ohi, clo, chi, n, hb, hs, hdb, hds, want, sums, a, b, gain, clamp, to, tc):\n"
        "    no = (ohi - olo + to - 1) // to\n"
        "    nc = (chi - clo + tc - 1) // tc\n"
        "    mode = fp_get()\n"
        "    for t in prange(no * nc):\n"
        "        fp_adopt(mode)\n"
        "        i = t // nc\n"
        "        oo = olo + i * to\n"
        "        cc = clo + (t - i * nc) * tc\n"
        f"        {{g}}({args}oo, min(oo + to, ohi), cc, min(cc + tc, chi), n, hb, hs, hdb, hds, want, "
        "sums[i], a, b, gain, clamp)\n"
    )


_GATED_TEMPLATES.update({fn: _bias_serial_source(fn) for fn in _BIAS_OPS})
_GATED_PARALLEL.update({fn: _bias_parallel_source(fn) for fn in _BIAS_OPS})


def _bias_kernel(key: str, direction: str, dtype: str, wd: str) -> Callable:
    from . import formulas

    def forward(x3, b, s, out3, p):
        _run_bias((key, direction, wd), (x3, b, s, out3), formulas.bias_params(key, p, dtype), False, False)

    def backward(dy3, x3, b, s, dx3, db_full, ds_full, p):
        want = bool(p["sum_db"] or p["sum_dscale"])
        return _run_bias((key, direction, wd), (dy3, x3, b, s, dx3, db_full, ds_full),
                         formulas.bias_params(key, p, dtype), want, True)

    def backward_y(dy3, y3, b, s, dx3, db_full, ds_full, p):
        return _run_bias((key, direction, wd), (dy3, y3, None, None, dx3, db_full, None),
                         formulas.bias_params(key, p, dtype), bool(p["sum_db"]), True)

    run = {"forward": forward, "backward": backward, "backward_y": backward_y}[direction]
    run.__name__ = f"numba_{key.replace(':', '_')}_{direction}_{dtype}"
    return run


def _bias_signature(nops: int, wdt, parallel: bool) -> tuple:
    from numba import float64, from_dtype, int64, types

    arr = types.Array(from_dtype(np.dtype(wdt)), 1, "C")
    sums = types.Array(float64, 3 if parallel else 2, "C")
    return ((arr, int64, int64, int64, int64) * nops + (int64,) * 10 + (sums, float64, float64, float64, float64)
            + ((int64, int64) if parallel else ()))


def _bias_compile(pair: _LoopPair, nops: int, wdt, parallel: bool) -> None:
    for par in (False, True) if parallel else (False,):
        if (par, wdt) in pair._blocks:
            continue
        loop = pair.loop(par)
        try:
            loop.compile(_bias_signature(nops, wdt, par))
        except BaseException:
            pair._forget(par, loop)
            raise
        pair._blocks.add((par, wdt))


def _bias_operand(a: np.ndarray | None, wdt) -> tuple:
    """(base, offset, outer, channel and inner strides in elements) of a (outer, C, inner) array, a (C,) one
    (outer and inner strides 0), or None (a one-element dummy)."""
    if a is None:
        return (np.zeros(1, wdt), 0, 0, 0, 0)
    base, off = _base(a)
    st = [s // a.itemsize for s in a.strides]
    return (base, off, 0, st[0], 0) if a.ndim == 1 else (base, off, *st)


def _widened(a: np.ndarray, wdt) -> np.ndarray:
    """A contiguous compute-dtype copy of a piece (bfloat16 from its bits, exactly)."""
    return to_float32(a) if a.dtype.kind == "V" else np.ascontiguousarray(a, wdt)


def _stored(dst: np.ndarray, src: np.ndarray) -> None:
    """dst[...] = src, rounded once (bfloat16 by `multiact.dtypes`' store, not ml_dtypes' cast)."""
    if dst.dtype.kind == "V":
        f32_bits_to_bf16(src, out=dst.view(np.uint16))
    else:
        dst[...] = src


def _bias_aligned(a: np.ndarray | None) -> bool:
    return a is None or all(s % a.itemsize == 0 for s in a.strides) and a.ctypes.data % a.itemsize == 0


def _bias_tiles(outer: int, c: int, inner: int, sums: bool) -> tuple[int, int]:
    """(outer rows, channels) per tile of about _PAR_BLOCK elements; at most _BIAS_MAX_TILES outer tiles when
    each holds a partial sum."""
    tc = c if c * inner <= _PAR_BLOCK else max(1, _PAR_BLOCK // max(inner, 1))
    to = max(1, _PAR_BLOCK // (tc * max(inner, 1)))
    if sums:
        to = max(to, -(-outer // _BIAS_MAX_TILES))
    return to, tc


def _bias_call(pair: _LoopPair, arrays: tuple, flags: tuple[int, ...], params, want: bool, bwd: bool,
               parallel: bool) -> np.ndarray | None:
    """One call of the loops on arrays of the compute dtype; the (2, C) float64 sums when want."""
    lead = arrays[1] if bwd else arrays[0]
    outer, c, inner = lead.shape
    wdt = lead.dtype.type
    args: list = []
    for a in arrays:
        args += _bias_operand(a, wdt)
    if parallel and outer * c * inner >= _PAR_MIN:
        with _pool_turn() as turn:
            if turn:
                to, tc = _bias_tiles(outer, c, inner, want)
                # one (2, C) partial per outer tile; without sums the loops never index it (width 1)
                part = np.zeros((-(-outer // to), 2, c if want else 1))
                pair.call(True, *args, 0, outer, 0, c, inner, *flags, part, *params, to, tc)
                return part.sum(axis=0) if want else None
    sums = np.zeros((2, c if want else 1))
    pair.call(False, *args, 0, outer, 0, c, inner, *flags, sums, *params)
    return sums if want else None


def _run_bias(key: tuple[str, str, str], arrays: tuple, p4: tuple[float, ...], want: bool,
              bwd: bool) -> np.ndarray | None:
    """The bias_act loop over (outer, C, inner) arrays (b, s: (C,), 3-D or None; db_full, ds_full: 3-D or
    None); nothing is written unless the loops compile."""
    lead = arrays[1] if bwd else arrays[0]
    outer, c, inner = lead.shape
    if lead.size == 0:
        return np.zeros((2, c)) if want else None
    ib, is_ = (2, 3) if bwd else (1, 2)
    flags = [int(arrays[ib] is not None), int(arrays[is_] is not None)]
    flags += [int(arrays[5] is not None), int(arrays[6] is not None), int(want)] if bwd else [0, 0, 0]
    pair = _gated_loops(key)
    wdt = np.float64 if lead.dtype == np.float64 else np.float32
    parallel = lead.size >= _PAR_MIN and _threads() > 1
    _bias_compile(pair, len(arrays), wdt, parallel)
    half = lead.dtype == np.float16 or lead.dtype.kind == "V"
    if not half and all(_bias_aligned(a) for a in arrays):
        return _bias_call(pair, arrays, tuple(flags), p4, want, bwd, parallel)
    # float16, bfloat16 (or misaligned views): float32 (compute-dtype) pieces of at most _BLOCK elements
    total = np.zeros((2, c)) if want else None
    ti = min(inner, _BLOCK)
    tc = min(c, max(1, _BLOCK // ti))
    to = max(1, _BLOCK // (tc * ti))
    nin = 4 if bwd else 3
    for o0 in range(0, outer, to):
        for c0 in range(0, c, tc):
            for i0 in range(0, inner, ti):
                sl = (slice(o0, o0 + to), slice(c0, c0 + tc), slice(i0, i0 + ti))
                piece = []
                for k, a in enumerate(arrays):
                    if a is None:
                        piece.append(None)
                    elif a.ndim == 1:
                        piece.append(_widened(a[sl[1]], wdt))
                    elif k < nin:
                        piece.append(_widened(a[sl], wdt))
                    else:
                        piece.append(np.empty(a[sl].shape, wdt))
                got = _bias_call(pair, tuple(piece), tuple(flags), p4, want, bwd, False)
                for k in range(nin, len(arrays)):
                    if arrays[k] is not None:
                        _stored(arrays[k][sl], piece[k])
                if want:
                    total[:, c0:c0 + tc] += got
    return total


# ---- quantized outputs in one pass (multiact.core._fused; numba_quant) --------------------------------------


def quantized(plan: Any, job: Any, kernel_: Any, dtype: str, quant: Any) -> tuple | None:
    """The one pass of a quantized call (multiact.core._fused): blocks of rows widened to float32, this
    backend's float32 kernel into a block held in cache, amax, scales and codes per group (numba_quant).  The
    forwards of the elementwise ops with one input (all but prelu) and of the gated family, and the elementwise
    backwards (dy and x, or dy and y), on float32, float16 and bfloat16 inputs; None (the two passes) for the
    rest."""
    if vocab.DTYPES[dtype].compute != "float32":  # float64: the two passes
        return None
    key, direction = plan.key, plan.direction
    defn = KEYS[key].defn if key in KEYS else None
    if key in BIAS_ACT_KEYS or (defn is not None and defn.array_param) or not supports(key, direction, "float32"):
        return None
    if direction != "forward" and (key in FAMILY_KEYS or direction not in ("backward", "backward_y")):
        return None  # a gated backward writes two halves; second order and parameter gradients: the two passes
    got: list = []
    job.run(lambda *a: got.append(a[:-1]), [None])  # the family's views of the inputs
    if len(got) != 1 or len(got[0]) != (2 if key in FAMILY_KEYS or direction != "forward" else 1):
        return None
    from . import numba_quant

    return numba_quant.run(kernel(key, direction, "float32"), job.p, got[0], quant)
