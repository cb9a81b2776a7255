"""The `ascend` backend: Huawei Ascend NPUs, by two real paths.

- torch_npu tensors (`tensor.device.type == "npu"`): torch's own functional ops, which torch_npu
  runs as CANN kernels on the NPU (fast_gelu as `torch_npu.npu_fast_gelu`), backward through
  autograd (CANN's ...Grad kernels); the result stays on the NPU.  torch is never imported here
  unless the caller already imported it.
- NumPy arrays, on request (`backend="ascend"`): multiact's ONNX graphs on ONNX Runtime's
  CANNExecutionProvider (package onnxruntime-cann), through the same session code as the
  `onnxruntime` backend with only the provider list changed.
- The gated family's kernels (gated:<act>, two inputs; the backward writes two outputs) run on both
  paths: the ONNX Runtime backends' graphs for NumPy arrays; for tensors, the activation's torch
  function on the clipped gate times the clipped up, backward through autograd.
- The bias_act family's kernels (bias_act:<act>, forward and backward; no y= form) run on both paths:
  the ONNX Runtime graphs for host arrays (NumPy, CPU tensors, as (outer, C, inner) views); for NPU
  tensors (fused_bias_act's device route: the tensors as they are, with dim) the composition
  x * scale + b, the activation's torch function (CANN's kernels; npu_fast_gelu for fast_gelu), gain
  and clamp, backward through the activation's autograd.  On an NPU that is several CANN kernels, not
  one pass: torch_npu has no fused bias + activation op for these activations (its npu_swiglu is the
  gated family's).

Detection does not trust `get_available_providers()` (onnxruntime-cann lists CANN with no NPU):
it looks for the CANN runtime (libascendcl.so) and the driver tool (npu-smi), then creates a
session and checks that CANN really runs it.
"""

from __future__ import annotations

import ctypes.util
import functools
import glob
import os
import shutil
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from multiact.optable import BIAS_ACT_KEYS, FAMILY_KEYS, KEYS, OPS

from ._ort_sessions import Runner, is_gated
from ._ort_sessions import supports as _ort_supports

NAME = "ascend"
PRIORITY = 1  # the only backend for NPU tensors; below every CPU backend for NumPy arrays
KINDS = ("npu", "numpy")
CANN = "CANNExecutionProvider"
_ASCEND_ROOTS = ("/usr/local/Ascend", os.path.expanduser("~/Ascend"))


def provider_list() -> list:
    """Sessions' providers: CANN on ASCEND_DEVICE_ID (default 0), keeping float32 as float32."""
    device = int(os.environ.get("ASCEND_DEVICE_ID", "0") or 0)
    return [(CANN, {"device_id": device, "precision_mode": "must_keep_origin_dtype"}), "CPUExecutionProvider"]


_runner = Runner(lambda: provider_list())


# ---- detection ------------------------------------------------------------------------------


def find_ascendcl() -> str | None:
    """Path of the CANN runtime library, or None."""
    dirs = [os.environ.get(v, "") for v in ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME", "ASCEND_AICPU_PATH")]
    dirs = [os.path.join(d, sub) for d in dirs if d for sub in ("lib64", "lib", "")]
    dirs += os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep)
    for root in _ASCEND_ROOTS:
        dirs += glob.glob(os.path.join(root, "*", "latest", "lib64")) + glob.glob(os.path.join(root, "*", "lib64"))
    for d in dirs:
        if d and os.path.isfile(os.path.join(d, "libascendcl.so")):
            return os.path.join(d, "libascendcl.so")
    return ctypes.util.find_library("ascendcl")


def find_npu_smi() -> str | None:
    found = shutil.which("npu-smi")
    if found:
        return found
    for root in _ASCEND_ROOTS:
        path = os.path.join(root, "driver", "tools", "npu-smi")
        if os.path.isfile(path):
            return path
    return None


def _torch_npu_state() -> tuple[bool, str]:
    """(usable, why) for torch_npu tensors, importing nothing the caller did not import."""
    if "torch_npu" not in sys.modules:
        import importlib.util

        if "torch" in sys.modules and importlib.util.find_spec("torch_npu") is not None:
            return False, "torch_npu is installed but not imported (import torch_npu to use NPU tensors)"
        return False, "torch_npu is not installed (pip install torch-npu matching your torch and CANN)"
    try:
        torch = sys.modules["torch"]
        if not torch.npu.is_available():
            return False, "torch_npu is imported but torch.npu.is_available() is False (no NPU or driver)"
        return True, f"torch_npu on {torch.npu.device_count()} NPU(s)"
    except Exception as e:
        return False, f"torch_npu check failed: {type(e).__name__}: {e}"


def _cann_state(providers: Callable[[], list] = provider_list) -> tuple[bool, str]:
    """(usable, why) for ONNX Runtime's CANN execution provider; a real session decides."""
    try:
        import onnxruntime as ort
    except ImportError:
        return False, "onnxruntime-cann is not installed (pip install 'multiact[ascend]')"
    except Exception as e:  # onnxruntime-cann is built for NumPy 1.x
        return False, f"onnxruntime failed to import ({type(e).__name__}: {e}); onnxruntime-cann needs numpy<2"
    if CANN not in ort.get_available_providers():
        return False, (f"onnxruntime {ort.__version__} has no {CANN} (pip install 'multiact[ascend]': "
                       "onnxruntime-cann replaces onnxruntime and needs numpy<2)")
    missing = []
    if find_ascendcl() is None:
        missing.append("the CANN runtime libascendcl.so was not found (install the CANN toolkit and "
                       "source /usr/local/Ascend/ascend-toolkit/set_env.sh)")
    if find_npu_smi() is None:
        missing.append("npu-smi was not found (no Ascend NPU driver on this machine)")
    if missing:
        return False, "; ".join(missing)
    return _session_runs_on_cann(providers)


def _session_runs_on_cann(providers: Callable[[], list]) -> tuple[bool, str]:
    try:
        import onnxruntime as ort

        from ._ort_sessions import session_options
        from .onnx_graphs import kernel_model

        model = kernel_model("relu", "forward", "float32", {})
        sess = ort.InferenceSession(model.SerializeToString(), session_options(1), providers=providers())
        got = sess.get_providers()
    except Exception as e:
        return False, f"a session on {CANN} failed: {type(e).__name__}: {e}"
    if got[0] != CANN:
        return False, f"{CANN} is listed but a session fell back to {got[0]} (check the NPU with npu-smi info)"
    return True, f"onnxruntime {ort.__version__} with {CANN}"


@functools.lru_cache(maxsize=1)
def _state() -> tuple[tuple[bool, str], tuple[bool, str]]:
    return _torch_npu_state(), _cann_state()


def available() -> tuple[bool, str]:
    (t_ok, t_why), (c_ok, c_why) = _state()
    if t_ok or c_ok:
        return True, "; ".join(why for ok, why in ((t_ok, t_why), (c_ok, c_why)) if ok)
    return False, f"no Ascend NPU usable here: {c_why}; {t_why}"


def info() -> dict:
    (t_ok, t_why), (c_ok, c_why) = _state()
    return {"torch_npu": t_why, "cann_ep": c_why, "devices": [f"npu:{os.environ.get('ASCEND_DEVICE_ID', '0')}"]}


def supports(key: str, direction: str, dtype: str) -> bool:
    return _ort_supports(key, direction, dtype)


def empty_like(a: Any) -> Any:
    """The result buffer for an NPU tensor, on its device."""
    return sys.modules["torch"].empty_like(a)


def _is_torch(a: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(a, torch.Tensor)


def kernel(key: str, direction: str, dtype: str) -> Callable:
    ort_kernel = _runner.kernel(key, direction, dtype)
    if key in BIAS_ACT_KEYS:  # host arrays come as (outer, C, inner) NumPy views, NPU tensors as they are
        torch_kernel = _torch_bias_kernel(key, direction)
    elif is_gated(key):
        torch_kernel = _torch_gated_kernel(key, direction)
    else:
        torch_kernel = _torch_kernel(KEYS[key].name, direction)

    def run(*args: Any) -> Any:
        return torch_kernel(*args) if _is_torch(args[0]) else ort_kernel(*args)

    return run


def quantized(plan: Any, job: Any, kernel: Any, dtype: str, quant: Any) -> Any:
    """quant= on host arrays: the onnxruntime backend's one-session graph (the kernel's float32 graph, then
    QuantizeLinear: multiact.backend.onnx_quant) on this backend's providers, CANN first and ONNX Runtime's CPU
    provider for the nodes CANN does not take; None (the call core's two passes) where that graph is not built."""
    return _runner.quantized(plan, job, dtype, quant)


# ---- torch_npu path -----------------------------------------------------------------------------


# The torch path's own rules, registered per (op, direction): a forward where torch's function (the definition's
# `torch`) does not compute the op at these parameters, the backward from y of the ops whose y-form is their own,
# and the parameter gradients.  Every other kernel is torch's function, differentiated by torch.func.vjp.
_TORCH_RULES: dict[tuple[str, str], Callable] = {}


def _torch_rule(*keys: tuple[str, str]) -> Callable[[Callable], Callable]:
    def deco(f: Callable) -> Callable:
        for k in keys:
            _TORCH_RULES[k] = f
        return f

    return deco


def _x_sigmoid(torch: Any, x: Any, k: float) -> Any:
    return x * torch.sigmoid(x * k)


@_torch_rule(("swish", "forward"))
def _swish_forward(torch: Any, p: dict) -> Callable:
    return lambda x: _x_sigmoid(torch, x, p["beta"])


@_torch_rule(("fast_gelu", "forward"))
def _fast_gelu_forward(torch: Any, p: dict) -> Callable:
    def fast_gelu(x):
        npu = sys.modules.get("torch_npu")
        if npu is not None and x.device.type == "npu" and hasattr(npu, "npu_fast_gelu"):
            return npu.npu_fast_gelu(x)
        return _x_sigmoid(torch, x, 1.702)

    return fast_gelu


@_torch_rule(("prelu", "forward"))
def _prelu_forward(torch: Any, p: dict) -> Callable:
    def prelu(x):  # a weight per channel along any axis (torch's prelu takes dim 1 only)
        w = torch.as_tensor(np.asarray(p["weight"]), device=x.device, dtype=x.dtype)
        return torch.where(x > 0, x, x * w)

    return prelu


@_torch_rule(("selu", "forward"))
def _selu_forward(torch: Any, p: dict) -> Callable:  # F.selu has PyTorch's constants only
    return lambda x: p["scale"] * torch.where(x > 0, x, p["alpha"] * torch.expm1(x))


@_torch_rule(("hardsigmoid", "forward"))
def _hardsigmoid_forward(torch: Any, p: dict) -> Callable:  # F.hardsigmoid is alpha = 1/6, beta = 0.5 only
    return lambda x: torch.clamp(x * p["alpha"] + p["beta"], 0.0, 1.0)


@_torch_rule(("sigmoid", "backward_y"))
def _sigmoid_backward_y(torch: Any, dy: Any, y: Any, p: dict) -> Any:
    return torch.ops.aten.sigmoid_backward(dy, y)


@_torch_rule(("tanh", "backward_y"))
def _tanh_backward_y(torch: Any, dy: Any, y: Any, p: dict) -> Any:
    return torch.ops.aten.tanh_backward(dy, y)


@_torch_rule(("elu", "backward_y"))
def _elu_backward_y(torch: Any, dy: Any, y: Any, p: dict) -> Any:
    return torch.where(y > 0, dy, dy * (y + p["alpha"]))


@_torch_rule(("selu", "backward_y"))
def _selu_backward_y(torch: Any, dy: Any, y: Any, p: dict) -> Any:
    return torch.where(y > 0, dy * p["scale"], dy * (y + p["scale"] * p["alpha"]))


@_torch_rule(("celu", "backward_y"))
def _celu_backward_y(torch: Any, dy: Any, y: Any, p: dict) -> Any:
    return torch.where(y > 0, dy, dy * (y / p["alpha"] + 1))


@_torch_rule(("swish", "param_grad"))
def _swish_beta_grad(torch: Any, dy: Any, x: Any, p: dict) -> float:
    b = p["beta"]
    s = torch.sigmoid(x.float() * b)
    return float((dy.float() * x.float() * x.float() * s * (1 - s)).sum().item())


@_torch_rule(("prelu", "param_grad"))
def _prelu_weight_grad(torch: Any, dy: Any, x: Any, p: dict) -> Any:
    w = p["weight"]
    contrib = torch.where(x > 0, torch.zeros_like(x), x * dy).float()
    if w.size == 1:
        return np.full(w.shape, float(contrib.sum().item()))
    others = tuple(i for i in range(x.ndim) if i != p["axis"])
    return contrib.sum(dim=others).double().cpu().numpy().reshape(w.shape)


def _torch_forward(op: str, p: dict) -> Callable:
    """x -> y with torch ops (kernels of the tensor's device; on an NPU, CANN's): the op's torch
    function from its definition, or the op's own rule where that does not compute it."""
    torch = sys.modules["torch"]
    d = OPS[op].defn
    if not d.torch_computes(p):
        return _TORCH_RULES[(op, "forward")](torch, p)
    t = d.torch
    fn = getattr(torch.nn.functional if t.namespace == "torch.nn.functional" else torch, t.fn)
    args, kwargs = [p[n] for n in t.args], {n: p[n] for n in t.kwargs}
    return lambda x: fn(x, *args, **kwargs)


def _torch_kernel(op: str, direction: str) -> Callable:
    """Kernels for torch tensors of any device; on an NPU every op runs as a CANN kernel there."""
    def forward(x, out, p):
        torch = sys.modules["torch"]
        with torch.no_grad():
            out.copy_(_torch_forward(op, p)(x))

    def backward(dy, x, out, p):
        # torch.func.vjp, not autograd.grad: multiact.torch runs kernels below autograd (custom ops), where
        # autograd records nothing even under enable_grad
        torch = sys.modules["torch"]
        _, vjp = torch.func.vjp(_torch_forward(op, p), x.detach())
        with torch.no_grad():
            out.copy_(vjp(dy)[0])

    def backward_y(dy, y, out, p):
        if OPS[op].defn.y_form == "same":
            backward(dy, y, out, p)  # y is inside the linear pieces exactly where x is
            return
        out.copy_(_TORCH_RULES[(op, "backward_y")](sys.modules["torch"], dy, y, p))

    def param_grad(dy, x, p):
        return _TORCH_RULES[(op, "param_grad")](sys.modules["torch"], dy, x, p)

    return {"forward": forward, "backward": backward, "backward_y": backward_y, "param_grad": param_grad}[direction]


def _torch_gated_kernel(key: str, direction: str) -> Callable:
    """gated:<act> for torch tensors: act(min(gate, limit)) * (clamp(up, -limit, limit) + shift) with the
    activation's torch function (on an NPU, CANN's kernels); the backward is autograd of the same, which
    gives 0 where the clip is hit (torch.where passes no gradient to the branch it did not take)."""
    act = FAMILY_KEYS[key][1].name

    def gated(gate, up, p):
        torch = sys.modules["torch"]
        limit = p["limit"]
        if limit != float("inf"):
            gate = torch.where(gate > limit, torch.full_like(gate, limit), gate)
            up = torch.where(up > limit, torch.full_like(up, limit),
                             torch.where(up < -limit, torch.full_like(up, -limit), up))
            if p["shift"]:
                up = up + p["shift"]
        return _torch_forward(act, p)(gate) * up

    def forward(gate, up, out, p):
        torch = sys.modules["torch"]
        with torch.no_grad():
            out.copy_(gated(gate, up, p))

    def backward(dy, gate, up, dgate, dup, p):
        torch = sys.modules["torch"]
        _, vjp = torch.func.vjp(lambda g, u: gated(g, u, p), gate.detach(), up.detach())  # as backward above
        dg, du = vjp(dy)
        with torch.no_grad():
            dgate.copy_(dg)
            dup.copy_(du)

    return {"forward": forward, "backward": backward}[direction]


def _torch_bias_kernel(key: str, direction: str) -> Callable:
    """bias_act:<act> for torch tensors as fused_bias_act's device route passes them: x (dy) as it is, b and
    scale None, (C,) along p["dim"] or x's shape; db / dscale the destinations ((C,): summed over every axis
    but dim; x's shape: elementwise) or None.  Computed in float32 (the kernels' precision for float16 data)
    and rounded once on store: z = x * scale + b, y = clip(act(z) * gain, -clamp, clamp); dz = act'(z) * dy
    * gain by the activation's vector-Jacobian product at z (torch.func.vjp: CANN's ...Grad kernels on an
    NPU), 0 where |act(z) * gain| > clamp (the reference's rule, NaN kept), dx = dz * scale.  The sums are
    float32 (torch's tree reduction): an NPU's vector units have no float64; the other backends sum in
    float64."""
    act = BIAS_ACT_KEYS[key][1].name

    def side(a, x, dim):
        if a is None:
            return None
        a = a.float()
        if a.ndim == 1 and (x.ndim == 1 or tuple(a.shape) != tuple(x.shape)):  # one value per channel
            shape = [1] * x.ndim
            shape[dim] = a.shape[0]
            return a.reshape(shape)
        return a

    def pre(x, b, s, p):
        z = x.float()
        sv = side(s, x, p.get("dim"))
        if sv is not None:
            z = z * sv
        bv = side(b, x, p.get("dim"))
        return z if bv is None else z + bv, sv

    def activation(p):
        return (lambda z: z) if act == "linear" else _torch_forward(act, p)

    def forward(x, b, s, out, p):
        torch = sys.modules["torch"]
        with torch.no_grad():
            y = activation(p)(pre(x, b, s, p)[0])
            if p["gain"] != 1.0:
                y = y * p["gain"]
            if p["clamp"] != float("inf"):
                y = torch.clamp(y, -p["clamp"], p["clamp"])
            out.copy_(y)

    def backward(dy, x, b, s, dx, db, ds, p):
        torch = sys.modules["torch"]
        with torch.no_grad():
            z, sv = pre(x, b, s, p)
            e = dy.float() * p["gain"]
        # torch.func.vjp, not autograd.grad: multiact.torch runs this below autograd (a custom op's kernel),
        # where autograd records nothing even under enable_grad; z is detached (x.float() is x for float32)
        a, vjp = (z, None) if act == "linear" else torch.func.vjp(activation(p), z.detach())
        with torch.no_grad():
            if p["clamp"] != float("inf"):
                e = torch.where((a * p["gain"]).abs() > p["clamp"], torch.zeros_like(e), e)
        dz = e if vjp is None else vjp(e)[0]
        with torch.no_grad():
            dx.copy_(dz if sv is None else dz * sv)
            others = [i for i in range(x.ndim) if i != p.get("dim")]
            for dst, term in ((db, lambda: dz), (ds, lambda: dz * x.float())):
                if dst is not None:
                    t = term()
                    dst.copy_(t if tuple(dst.shape) == tuple(x.shape) else t.sum(dim=others))

    return {"forward": forward, "backward": backward}[direction]
