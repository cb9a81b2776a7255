"""The `onnxruntime` backend: multiact's ONNX graphs run by ONNX Runtime, on request only.

PRIORITY 0: it is never chosen automatically for NumPy arrays (the C and numba kernels are
faster), but `backend="onnxruntime"` or `ma.use("onnxruntime")` runs any op through it, which
makes ONNX Runtime an independent peer in the consistency suite.  Providers: the CPU provider
always, CUDA first where onnxruntime-gpu is installed and a session really gets it;
MULTIACT_ORT_PROVIDERS (comma-separated provider names) overrides the list.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable

from ._ort_sessions import Runner
from ._ort_sessions import supports as _supports

NAME = "onnxruntime"
PRIORITY = 0
KINDS = ("numpy",)


@functools.lru_cache(maxsize=1)
def providers() -> list[str]:
    """The provider list every session of this backend uses."""
    env = os.environ.get("MULTIACT_ORT_PROVIDERS", "").strip()
    if env:
        return [p.strip() for p in env.split(",") if p.strip()]
    import onnxruntime as ort

    have = ort.get_available_providers()
    chosen = ["CPUExecutionProvider"]
    if "CUDAExecutionProvider" in have and _session_gets("CUDAExecutionProvider"):
        chosen.insert(0, "CUDAExecutionProvider")
    return chosen


def _session_gets(provider: str) -> bool:
    """Whether a real session runs on `provider` (the available list names providers without devices)."""
    import onnxruntime as ort

    from ._ort_sessions import session_options
    from .onnx_graphs import kernel_model

    try:
        model = kernel_model("relu", "forward", "float32", {})
        sess = ort.InferenceSession(model.SerializeToString(), session_options(1),
                                    providers=[provider, "CPUExecutionProvider"])
        return sess.get_providers()[0] == provider
    except Exception:
        return False


_runner = Runner(providers)


@functools.lru_cache(maxsize=1)
def available() -> tuple[bool, str]:
    try:
        import onnx  # noqa: F401
        import onnxruntime as ort
    except ImportError as e:
        return False, f"needs {e.name!r}: pip install 'multiact[onnx]' (onnx and onnxruntime)"
    except Exception as e:  # e.g. onnxruntime-cann built for NumPy 1.x under NumPy 2
        return False, f"onnxruntime failed to import ({type(e).__name__}: {e})"
    try:
        used = providers()
    except Exception as e:
        return False, f"onnxruntime {ort.__version__} could not create a session: {type(e).__name__}: {e}"
    return True, f"onnxruntime {ort.__version__} on {', '.join(used)}"


def info() -> dict:
    import onnxruntime as ort

    from multiact import get_num_threads

    return {
        "onnxruntime": ort.__version__,
        "providers": providers(),
        "devices": [p.replace("ExecutionProvider", "") for p in providers()],
        "threads": get_num_threads(),
        "sessions": _runner.session_count(),
        # issue 44, item 4: not yet made to follow the caller (native's pool does)
        "denormals": "ONNX Runtime's intra-op threads keep their own flush-to-zero / denormals-are-zero mode, not the "
                     "caller's: after torch.set_flush_denormal(True) a subnormal result can depend on the thread that "
                     "computed it (sigmoid of 4M x = -88.5, two threads: 524,288 elements differ)",
    }


def supports(key: str, direction: str, dtype: str) -> bool:
    return _supports(key, direction, dtype)


def kernel(key: str, direction: str, dtype: str) -> Callable:
    return _runner.kernel(key, direction, dtype)
