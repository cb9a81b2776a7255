"""ONNX Runtime kernels shared by the `onnxruntime` and `ascend` backends.

One code path runs the graphs of `onnx_graphs` (this package's) on any execution-provider list, so the
CANN path is exercised on the CPU provider by swapping only the list.  Sessions are cached per
(op, direction, dtype, params, thread count); results go through IOBinding straight into the
caller's buffer when it is contiguous, and through a contiguous temporary plus `np.copyto`
otherwise (ONNX Runtime would silently copy a strided output and drop the result).

The gated family's kernels (`gated:<act key>`, two inputs, and two outputs in the backward) are
`onnx_graphs.gated_kernel_onnx` graphs, run the same way; views (the halves of x) that cannot be
flattened are copied to contiguous inputs, and a backward whose outputs share memory with its inputs
(in place) writes through temporaries, since its two outputs are not written last together.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from multiact import get_num_threads
from multiact._layout import flat_views
from multiact._opdefs import GATED
from multiact.optable import BIAS_ACT_KEYS, FAMILY_KEYS, KEYS, OPS, value_key

from . import onnx_graphs

DTYPES = ("float16", "float32")
_MAX_SESSIONS = 256  # learnable params (swish beta) would otherwise grow the cache without bound
# NoopElimination drops an Add of a constant 0, but -0.0 + 0.0 is +0.0 (elu's y + alpha at alpha = 0)
_DISABLED_OPTIMIZERS = ["NoopElimination"]


def caller_mode() -> tuple[bool, bool]:
    """(flush-to-zero, denormals-are-zero) of the calling thread, as two float32 operations see them (NumPy's
    scalar arithmetic runs here, in this thread's mode: x86 MXCSR, aarch64 FPCR; FZ there does both)."""
    with np.errstate(all="ignore"):
        ftz = np.float32(1.1754944e-38) * np.float32(0.5) == 0  # a subnormal result, flushed
        daz = np.float32(1.4e-45) * np.float32(2.0) == 0  # a subnormal input, read as zero
    return bool(ftz), bool(daz)


def session_options(threads: int, mode: tuple[bool, bool] = (False, False)) -> Any:
    """Options for every multiact session: `threads` intra-op threads, no spinning, no inter-op pool, and
    the intra-op threads in the caller's denormal `mode` (caller_mode): ONNX Runtime's
    session.set_denormal_as_zero for flush-to-zero with denormals-are-zero (torch.set_flush_denormal(True));
    a mode with only one of them, which ONNX Runtime's threads cannot take, runs on the calling thread alone."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    if mode[0] != mode[1]:
        threads = 1
    elif mode[0]:
        so.add_session_config_entry("session.set_denormal_as_zero", "1")
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    so.add_session_config_entry("session.inter_op.allow_spinning", "0")
    so.log_severity_level = 3
    return so


def supports(key: str, direction: str, dtype: str) -> bool:
    """Where onnx_graphs has the graphs (an op registered without them falls through)."""
    hit = FAMILY_KEYS.get(key) or BIAS_ACT_KEYS.get(key)
    if hit is not None:  # gated:<act>, bias_act:<act>: the activation's forward and backward graphs
        fam, _, act = hit
        return (fam is GATED or key in BIAS_ACT_KEYS) and dtype in DTYPES and direction in ("forward", "backward") \
            and all((act, d) in onnx_graphs.GRAPHS for d in ("forward", "backward"))
    return dtype in DTYPES and onnx_graphs.has(key, direction)


def is_gated(key: str) -> bool:
    """Whether `key` is a kernel key of the gated family (gated:<act key>)."""
    hit = FAMILY_KEYS.get(key)
    return hit is not None and hit[0] is GATED


_FROM_NUMPY: list = []


def _from_numpy() -> Callable:
    """OrtValue.ortvalue_from_numpy, looked up once (an import statement per call costs a microsecond)."""
    if not _FROM_NUMPY:
        from onnxruntime import OrtValue

        _FROM_NUMPY.append(OrtValue.ortvalue_from_numpy)
    return _FROM_NUMPY[0]


class _Entry:
    """A session with the names of its inputs and outputs and a binding reused by its creating thread."""

    __slots__ = ("sess", "inputs", "outputs", "binding", "thread")

    def __init__(self, sess: Any, inputs: tuple[str, ...], outputs: tuple[str, ...]):
        self.sess, self.inputs, self.outputs = sess, inputs, outputs
        self.binding = sess.io_binding()
        self.thread = threading.get_ident()

    @property
    def output(self) -> str:
        return self.outputs[0]

    def run(self, arrays: Sequence[np.ndarray], out: np.ndarray | None) -> Any:
        """Bind C-contiguous arrays (no copies) and run; with out=None return the output OrtValue."""
        from_numpy = _from_numpy()
        b = self.binding if threading.get_ident() == self.thread else self.sess.io_binding()
        for name, a in zip(self.inputs, arrays, strict=True):
            b.bind_ortvalue_input(name, from_numpy(a))
        if out is None:
            b.bind_output(self.output)
        else:
            b.bind_ortvalue_output(self.output, from_numpy(out))
        self.sess.run_with_iobinding(b)
        return b.get_outputs()[0] if out is None else None

    def run_into(self, arrays: Sequence[np.ndarray], outs: Sequence[np.ndarray]) -> None:
        """Bind C-contiguous arrays and one C-contiguous destination per output, and run."""
        from_numpy = _from_numpy()
        b = self.binding if threading.get_ident() == self.thread else self.sess.io_binding()
        for name, a in zip(self.inputs, arrays, strict=True):
            b.bind_ortvalue_input(name, from_numpy(a))
        for name, o in zip(self.outputs, outs, strict=True):
            b.bind_ortvalue_output(name, from_numpy(o))
        self.sess.run_with_iobinding(b)


class Runner:
    """multiact kernels on one execution-provider list.

    `providers` is called when a session is made and returns the `providers=` list for
    `InferenceSession` (names or (name, options) pairs).
    """

    def __init__(self, providers: Callable[[], list]):
        self._providers = providers
        self._sessions: OrderedDict[tuple, _Entry] = OrderedDict()
        self._lock = threading.Lock()
        onnx_graphs.on_change(self.forget)

    def clear(self) -> None:
        with self._lock:
            self._sessions.clear()

    def forget(self, name: str) -> None:
        """Drop the sessions of op or kernel key `name` and of the composite kernels on it (its graphs changed)."""
        with self._lock:
            for k in [k for k in self._sessions if name in (k[0], k[0].split(":", 1)[-1])]:
                del self._sessions[k]

    def session_count(self) -> int:
        return len(self._sessions)

    def entry(self, op: str, direction: str, dtype: str, key: tuple, params: dict | None = None) -> _Entry:
        """The cached session for one (op, direction, dtype, params, thread count).

        `key` holds the scalar params' values in the spec's order; `params` (by name) is only
        needed to build a session on a miss and defaults to pairing the two.  A gated kernel key
        (`gated:<act key>`) as `op` names the family's graph; its `params` are then required.
        """
        threads, mode = get_num_threads(), caller_mode()
        full = (op, direction, dtype, tuple(map(value_key, key)), threads, mode)  # -0.0 is not 0.0's session
        e = self._sessions.get(full)
        if e is not None:
            return e
        if params is None:
            params = dict(zip((q.name for q in OPS[op].scalar_params), key, strict=True))
        from .onnx_graphs import bias_act_kernel_onnx, gated_kernel_onnx, kernel_model

        if is_gated(op):
            model = gated_kernel_onnx(op, direction, dtype, params)
        elif op in BIAS_ACT_KEYS:
            params = dict(params)
            model = bias_act_kernel_onnx(op, direction, dtype, params, params.pop("forms"))
        else:
            model = kernel_model(op, direction, dtype, params)
        return self._store(full, model, threads, mode)

    def _store(self, full: tuple, model: Any, threads: int, mode: tuple[bool, bool]) -> _Entry:
        import onnxruntime as ort

        sess = ort.InferenceSession(model.SerializeToString(), session_options(threads, mode),
                                    providers=self._providers(), disabled_optimizers=_DISABLED_OPTIMIZERS)
        e = _Entry(sess, tuple(i.name for i in model.graph.input), tuple(o.name for o in model.graph.output))
        with self._lock:
            self._sessions[full] = e
            while len(self._sessions) > _MAX_SESSIONS:
                self._sessions.popitem(last=False)
        return e

    def kernel(self, key: str, direction: str, dtype: str) -> Callable:
        if is_gated(key):
            return self._gated_kernel(key, direction, dtype)
        if key in BIAS_ACT_KEYS:
            return self._bias_kernel(key, direction, dtype)
        op = KEYS[key].name  # one graph per op: a variant's parameter is one of its parameters
        if OPS[op].defn.array_param:  # a weight per channel: (outer, C, inner) arrays
            return self._channel_kernel(op, direction, dtype)
        if direction == "param_grad":
            return self._param_grad_kernel(op, dtype)
        names = tuple(q.name for q in OPS[op].scalar_params)
        entry = self.entry

        def run(*args: Any) -> None:
            *arrays, out, p = args
            e = entry(op, direction, dtype, tuple([p[n] for n in names]) if names else ())
            if out.ndim == 1 and out.flags.c_contiguous and all(a.flags.c_contiguous for a in arrays):
                e.run(arrays, out)  # the common case, checked first: no views to make
                return
            if out.size == 0:
                return
            views = flat_views(*arrays, out)
            if views is not None:
                *ins, o = views
                e.run(ins, o)
                return
            # strided: contiguous temporaries, then copy into the caller's out
            tmp = np.empty(out.size, dtype=out.dtype)
            e.run([np.ascontiguousarray(a).reshape(-1) for a in arrays], tmp)
            np.copyto(out, tmp.reshape(out.shape))

        return run

    def _gated_kernel(self, key: str, direction: str, dtype: str) -> Callable:
        """gated:<act>: forward (gate, up, out, p), backward (dy, gate, up, dgate, dup, p)."""
        family, act, _ = FAMILY_KEYS[key]
        names = tuple(q.name for q in act.scalar_params) + family.scalars
        entry = self.entry
        n_in = 3 if direction == "backward" else 2

        def run(*args: Any) -> None:
            *arrays, p = args
            ins, outs = arrays[:n_in], arrays[n_in:]
            if outs[0].size == 0:
                return
            e = entry(key, direction, dtype, tuple([p[n] for n in names]), {n: p[n] for n in names})
            views = flat_views(*ins, *outs)
            # one output is written last, after every read of the inputs, so in place is safe; two are not
            if views is not None and (len(outs) == 1 or not _aliased(ins, outs)):
                e.run_into(views[:n_in], views[n_in:])
                return
            flat_in = [np.ascontiguousarray(a).reshape(-1) for a in ins]
            tmps = [np.empty(o.size, dtype=o.dtype) for o in outs]
            e.run_into(flat_in, tmps)
            for o, t in zip(outs, tmps, strict=True):
                np.copyto(o, t.reshape(o.shape))

        return run

    def _bias_kernel(self, key: str, direction: str, dtype: str) -> Callable:
        """bias_act:<act>: forward (x3, b, s, out3, p), backward (dy3, x3, b, s, dx3, db_full, ds_full, p) ->
        None or the (2, C) float64 sums; one session per form of b and scale (per channel, full, absent)."""
        _, act, _ = BIAS_ACT_KEYS[key]
        names = tuple(q.name for q in act.scalar_params) + ("gain", "clamp")
        entry = self.entry

        def form(a: np.ndarray | None) -> str | None:
            return None if a is None else ("c" if a.ndim == 1 else "f")

        def side(a: np.ndarray) -> np.ndarray:
            return np.ascontiguousarray(a).reshape(-1, 1) if a.ndim == 1 else np.ascontiguousarray(a)

        def session(p: dict, forms: tuple) -> _Entry:
            vals = tuple([p[n] for n in names])
            return entry(key, direction, dtype, (*vals, *forms), {**dict(zip(names, vals, strict=True)),
                                                                  "forms": forms})

        if direction == "forward":

            def forward(x3, b, s, out3, p) -> None:
                if out3.size == 0:
                    return
                e = session(p, (form(b), form(s), False, False))
                ins = [np.ascontiguousarray(x3)] + [side(a) for a in (b, s) if a is not None]
                if out3.flags.c_contiguous:  # one output, written last: in place is safe
                    e.run_into(ins, [out3])
                    return
                tmp = np.empty(out3.shape, out3.dtype)
                e.run_into(ins, [tmp])
                np.copyto(out3, tmp)

            return forward

        def backward(dy3, x3, b, s, dx3, db_full, ds_full, p):
            c = x3.shape[1]
            want = (bool(p["sum_db"]), bool(p["sum_dscale"]))
            if x3.size == 0:
                return np.zeros((2, c)) if any(want) else None
            e = session(p, (form(b), form(s), *want))
            ins = [np.ascontiguousarray(a) for a in (dy3, x3)] + [side(a) for a in (b, s) if a is not None]
            outs = [o for o in (dx3, db_full, ds_full) if o is not None]
            direct = all(o.flags.c_contiguous for o in outs) and not _aliased(ins, outs)
            bound = outs if direct else [np.empty(o.shape, o.dtype) for o in outs]
            sums = np.zeros((2, c))
            e.run_into(ins, bound + [sums[k] for k in (0, 1) if want[k]])
            if not direct:
                for o, t in zip(outs, bound, strict=True):
                    np.copyto(o, t)
            return sums if any(want) else None

        return backward

    def _channel_kernel(self, op: str, direction: str, dtype: str) -> Callable:
        """An op whose array parameter (prelu's weight) runs along the channel axis `axis`."""
        entry = self.entry
        array = OPS[op].defn.array_param

        as3d = _as3d

        if direction == "param_grad":

            def grad(dy: np.ndarray, x: np.ndarray, p: dict) -> np.ndarray:
                w = p[array]
                e = entry(op, direction, dtype, (), {})
                if x.size == 0:
                    return np.zeros(w.shape)
                s3 = as3d(x.shape, p["axis"])
                ins = [np.ascontiguousarray(a).reshape(s3) for a in (dy, x)]
                per_channel = e.run(ins, None).numpy()
                return np.full(w.shape, per_channel.sum()) if w.size == 1 else per_channel.reshape(w.shape)

            return grad

        def run(*args: Any) -> None:
            *arrays, out, p = args
            w = p[array]
            e = entry(op, direction, dtype, (), {})
            if out.size == 0:
                return
            s3 = as3d(out.shape, p["axis"])
            w1 = np.ascontiguousarray(w).reshape(-1)  # the graph broadcasts it along axis 1
            if all(a.flags.c_contiguous for a in (*arrays, out)):
                e.run([a.reshape(s3) for a in arrays] + [w1], out.reshape(s3))
                return
            ins = [np.ascontiguousarray(a).reshape(s3) for a in arrays]
            tmp = np.empty(s3, dtype=out.dtype)
            e.run(ins + [w1], tmp)
            np.copyto(out, tmp.reshape(out.shape))

        return run

    def _param_grad_kernel(self, op: str, dtype: str) -> Callable:
        """The gradient of a scalar parameter (swish's beta): a float64 sum over every element."""
        entry = self.entry
        name = OPS[op].defn.param_grad

        def grad(dy: np.ndarray, x: np.ndarray, p: dict) -> float:
            e = entry(op, "param_grad", dtype, (p[name],), {name: p[name]})
            if x.size == 0:
                return 0.0
            ins = [np.ascontiguousarray(a).reshape(-1) for a in (dy, x)]
            return float(e.run(ins, None).numpy())

        return grad


    # ---- quant=: the kernel's float32 graph and QuantizeLinear in one session (onnx_quant) ----------------

    def quantized(self, plan: Any, job: Any, dtype: str, q: Any) -> tuple[np.ndarray, ...] | None:
        """(codes, scales[, zero points]) of a forward's float32 result in one session, or None where none is built
        (prelu on float16 (its weight comes cast to float16), an input dtype without graphs, a zero-size
        result, a last axis that does not split into q's groups: the call core's two passes then run, or raise)."""
        from . import onnx_quant

        if dtype not in DTYPES or plan.direction != "forward" or not onnx_quant.supported(q):
            return None
        shape = tuple(job.results[0].shape)
        size = int(np.prod(shape, dtype=np.int64))
        if size == 0 or (q.granularity != "tensor" and (not shape or (q.block and shape[-1] % q.block))):
            return None
        key = plan.key
        gated, bias = is_gated(key), key in BIAS_ACT_KEYS
        array = None if gated or bias else OPS[KEYS[key].name].defn.array_param
        if array and dtype != "float32":  # the weight, cast to x's dtype, is not the contract's float32 weight
            return None
        got: list = []
        job.run(lambda *a: got.append(a), [None if r is None else np.empty(r.shape, np.float32)
                                           for r in job.results])
        args = got[0][:-1]  # the inputs' views (the result's array is the last)
        p = job.p
        if gated:
            family, act, _ = FAMILY_KEYS[key]
            names = tuple(x.name for x in act.scalar_params) + family.scalars
            ins = [np.ascontiguousarray(a).reshape(-1) for a in args]
            extra: tuple = ()
        elif bias:
            _, act, _ = BIAS_ACT_KEYS[key]
            names = tuple(x.name for x in act.scalar_params) + ("gain", "clamp")
            x3, b, sc = args
            forms = tuple(None if a is None else ("c" if a.ndim == 1 else "f") for a in (b, sc))
            ins = [np.ascontiguousarray(x3)] + [np.ascontiguousarray(a).reshape(-1, 1) if a.ndim == 1
                                                else np.ascontiguousarray(a) for a in (b, sc) if a is not None]
            extra = (*forms, False, False)
        elif array:  # prelu: x as (outer, C, inner) around its axis, the weight along C (the kernel's layout)
            names = ()
            ins = [np.ascontiguousarray(args[0]).reshape(_as3d(args[0].shape, p["axis"])),
                   np.ascontiguousarray(p[array]).reshape(-1)]
            extra = ()
        else:
            names = tuple(x.name for x in OPS[KEYS[key].name].scalar_params)
            ins = [np.ascontiguousarray(args[0]).reshape(-1)]
            extra = ()
        vals = tuple([p[n] for n in names])
        e = self._quant_entry(key, dtype, vals, {n: p[n] for n in names}, extra, q)
        if q.granularity == "tensor":
            code_shape, scale_shape = ins[0].shape, ()
        else:
            n = shape[-1]
            rows = size // n
            ins.append(np.array([rows, n], np.int64))
            code_shape = (rows, n)
            scale_shape = (rows,) if q.granularity == "token" else (rows, n // q.block)
        codes = np.empty(code_shape, np.int8 if q.dtype == "int8" else np.uint8)
        scales = np.empty(scale_shape, np.uint8 if q.granularity == "mx" else np.float32)
        outs = [codes, scales] + ([] if q.symmetric else [np.empty(scale_shape, np.int32)])  # azp: zero points
        from_numpy = _from_numpy()
        b = e.sess.io_binding()
        for name, a in zip(e.inputs, ins, strict=True):
            b.bind_ortvalue_input(name, from_numpy(a))
        for name, a in zip(e.outputs, outs, strict=True):
            b.bind_ortvalue_output(name, _typed(a, q.dtype if a is codes else None))
        e.sess.run_with_iobinding(b)
        if q.dtype == "float8_e5m2":  # ORT's NaN is 0x7F / 0xFF, the contract's (ml_dtypes') 0x7E / 0xFE
            u = codes.view(np.uint8)
            np.subtract(u, 1, out=u, where=(u & 0x7F) == 0x7F)
        if q.dtype != "int8":
            codes = codes.view(_ml(q.dtype))
        if q.granularity == "mx":
            scales = scales.view(_ml("float8_e8m0fnu"))
        outs[:2] = [codes, scales]
        if q.granularity == "tensor":
            return (codes.reshape(shape), *outs[1:])
        return (codes.reshape(shape), *(a.reshape(shape[:-1] + (-1,)) for a in outs[1:]))

    def _quant_entry(self, key: str, dtype: str, vals: tuple, params: dict, extra: tuple, q: Any) -> _Entry:
        """The cached session of one kernel's quantized forward (inputs in dtype, the graph in float32)."""
        threads, mode = get_num_threads(), caller_mode()
        full = ("quant", key, dtype, tuple(map(value_key, vals)), extra, q, threads, mode)
        e = self._sessions.get(full)
        if e is not None:
            return e
        from .onnx_graphs import bias_act_kernel_onnx, gated_kernel_onnx, kernel_model
        from .onnx_quant import quantized_model

        if is_gated(key):
            base = gated_kernel_onnx(key, "forward", "float32", params)
        elif key in BIAS_ACT_KEYS:
            base = bias_act_kernel_onnx(key, "forward", "float32", params, extra)
        else:
            base = kernel_model(KEYS[key].name, "forward", "float32", params)
        return self._store(full, quantized_model(base, q, dtype, fixed_rows=True), threads, mode)


def _as3d(shape: tuple[int, ...], axis: int) -> tuple[int, int, int]:
    """x as (outer, channels, inner) around the channel axis: the exported graph's layout."""
    if not shape:
        return 1, 1, 1
    outer = int(np.prod(shape[:axis], dtype=np.int64))
    return outer, shape[axis], int(np.prod(shape[axis + 1:], dtype=np.int64))


def _ml(name: str) -> np.dtype:
    import ml_dtypes

    return np.dtype(getattr(ml_dtypes, name))


def _typed(a: np.ndarray, code: str | None) -> Any:
    """An OrtValue over a's memory: float8 codes as ONNX's float8 types (NumPy has none), else a's own type."""
    from onnxruntime import OrtValue

    if code is None or code == "int8":
        return _from_numpy()(a)
    from onnx import TensorProto

    t = {"float8_e4m3fn": TensorProto.FLOAT8E4M3FN, "float8_e5m2": TensorProto.FLOAT8E5M2}[code]
    return OrtValue.ortvalue_from_numpy_with_onnx_type(a, t)


def _aliased(ins: Sequence[np.ndarray], outs: Sequence[np.ndarray]) -> bool:
    """Whether an output may share memory with an input (bounds only: cheap, never misses one)."""
    return any(np.may_share_memory(o, a) for o in outs for a in ins)
