"""ONNX Runtime kernels shared by the `onnxruntime` and `ascend` backends.

One code path runs the graphs of `multiact.onnx_export` on any execution-provider list, so the
CANN path is exercised on the CPU provider by swapping only the list.  Sessions are cached per
(op, direction, dtype, params, thread count); results go through IOBinding straight into the
caller's buffer when it is contiguous, and through a contiguous temporary plus `np.copyto`
otherwise (ONNX Runtime would silently copy a strided output and drop the result).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from multiact import get_num_threads
from multiact._layout import flat_views
from multiact.optable import KEYS, OPS, value_key

DTYPES = ("float16", "float32")
_MAX_SESSIONS = 256  # learnable params (swish beta) would otherwise grow the cache without bound
_DIRECTION_GRAD = {"forward": False, "backward": True, "backward_y": True}
# NoopElimination drops an Add of a constant 0, but -0.0 + 0.0 is +0.0 (elu's y + alpha at alpha = 0)
_DISABLED_OPTIMIZERS = ["NoopElimination"]


def session_options(threads: int) -> Any:
    """Options for every multiact session: `threads` intra-op threads, no spinning, no inter-op pool."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    so.add_session_config_entry("session.inter_op.allow_spinning", "0")
    so.log_severity_level = 3
    return so


def supports(key: str, direction: str, dtype: str) -> bool:
    spec = KEYS.get(key)
    if spec is None or dtype not in DTYPES:
        return False
    if direction == "backward_y":
        return spec.backward_y is not None
    if direction == "param_grad":
        return spec.param_grad is not None
    return direction in ("forward", "backward")


_FROM_NUMPY: list = []


def _from_numpy() -> Callable:
    """OrtValue.ortvalue_from_numpy, looked up once (an import statement per call costs a microsecond)."""
    if not _FROM_NUMPY:
        from onnxruntime import OrtValue

        _FROM_NUMPY.append(OrtValue.ortvalue_from_numpy)
    return _FROM_NUMPY[0]


class _Entry:
    """A session with the names of its inputs and output and a binding reused by its creating thread."""

    __slots__ = ("sess", "inputs", "output", "binding", "thread")

    def __init__(self, sess: Any, inputs: tuple[str, ...], output: str):
        self.sess, self.inputs, self.output = sess, inputs, output
        self.binding = sess.io_binding()
        self.thread = threading.get_ident()

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


class Runner:
    """multiact kernels on one execution-provider list.

    `providers` is called when a session is made and returns the `providers=` list for
    `InferenceSession` (names or (name, options) pairs).
    """

    def __init__(self, providers: Callable[[], list]):
        self._providers = providers
        self._sessions: OrderedDict[tuple, _Entry] = OrderedDict()
        self._lock = threading.Lock()

    def clear(self) -> None:
        with self._lock:
            self._sessions.clear()

    def session_count(self) -> int:
        return len(self._sessions)

    def entry(self, op: str, direction: str, dtype: str, key: tuple, params: dict | None = None) -> _Entry:
        """The cached session for one (op, direction, dtype, params, thread count).

        `key` holds the scalar params' values in the spec's order; `params` (by name) is only
        needed to build a session on a miss and defaults to pairing the two.
        """
        threads = get_num_threads()
        full = (op, direction, dtype, tuple(map(value_key, key)), threads)  # -0.0 is not 0.0's session
        e = self._sessions.get(full)
        if e is not None:
            return e
        if params is None:
            params = dict(zip((q.name for q in OPS[op].scalar_params), key, strict=True))
        import onnxruntime as ort

        from multiact.onnx_export import to_onnx

        spec = OPS[op]
        grad: bool | str = spec.param_grad[0] if direction == "param_grad" else _DIRECTION_GRAD[direction]
        model = to_onnx(op, dtype=dtype, grad=grad, from_output=direction == "backward_y", **params)
        sess = ort.InferenceSession(model.SerializeToString(), session_options(threads),
                                    providers=self._providers(), disabled_optimizers=_DISABLED_OPTIMIZERS)
        inputs = tuple(i.name for i in model.graph.input)
        e = _Entry(sess, inputs, model.graph.output[0].name)
        with self._lock:
            self._sessions[full] = e
            while len(self._sessions) > _MAX_SESSIONS:
                self._sessions.popitem(last=False)
        return e

    def kernel(self, key: str, direction: str, dtype: str) -> Callable:
        op = KEYS[key].name  # one graph per op: a variant's parameter is one of its parameters
        if op == "prelu":
            return self._prelu_kernel(direction, dtype)
        if direction == "param_grad":
            return self._swish_beta_kernel(dtype)
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

    def _prelu_kernel(self, direction: str, dtype: str) -> Callable:
        entry = self.entry

        def as3d(shape: tuple[int, ...], axis: int) -> tuple[int, int, int]:
            """x as (outer, channels, inner) around the channel axis: the exported graph's layout."""
            if not shape:
                return 1, 1, 1
            outer = int(np.prod(shape[:axis], dtype=np.int64))
            return outer, shape[axis], int(np.prod(shape[axis + 1:], dtype=np.int64))

        if direction == "param_grad":

            def grad(dy: np.ndarray, x: np.ndarray, p: dict) -> np.ndarray:
                w = p["weight"]
                e = entry("prelu", direction, dtype, (), {})
                if x.size == 0:
                    return np.zeros(w.shape)
                s3 = as3d(x.shape, p["axis"])
                ins = [np.ascontiguousarray(a).reshape(s3) for a in (dy, x)]
                per_channel = e.run(ins, None).numpy()
                return np.full(w.shape, per_channel.sum()) if w.size == 1 else per_channel.reshape(w.shape)

            return grad

        def run(*args: Any) -> None:
            *arrays, out, p = args
            w = p["weight"]
            e = entry("prelu", direction, dtype, (), {})
            if out.size == 0:
                return
            s3 = as3d(out.shape, p["axis"])
            w2 = np.ascontiguousarray(w).reshape(-1, 1)
            if all(a.flags.c_contiguous for a in (*arrays, out)):
                e.run([a.reshape(s3) for a in arrays] + [w2], out.reshape(s3))
                return
            ins = [np.ascontiguousarray(a).reshape(s3) for a in arrays]
            tmp = np.empty(s3, dtype=out.dtype)
            e.run(ins + [w2], tmp)
            np.copyto(out, tmp.reshape(out.shape))

        return run

    def _swish_beta_kernel(self, dtype: str) -> Callable:
        entry = self.entry

        def grad(dy: np.ndarray, x: np.ndarray, p: dict) -> float:
            e = entry("swish", "param_grad", dtype, (p["beta"],), {"beta": p["beta"]})
            if x.size == 0:
                return 0.0
            ins = [np.ascontiguousarray(a).reshape(-1) for a in (dy, x)]
            return float(e.run(ins, None).numpy())

        return grad
