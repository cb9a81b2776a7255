"""torch bfloat16 tensors: zero-copy in and out (plain functions, multiact.torch's custom ops and its eager
autograd path), and the results against `F.<op>(t.float()).bfloat16()`, which computes in float32 and rounds
once as multiact does.

Where the two differ it is torch's float32 that is off (its tails flush to 0 or overflow: gelu below -6,
silu and sigmoid below -88, hardswish above 5.7e37, tanhshrink near 0) and multiact's result is the float64
reference rounded once; the test says so element by element.  torch's own bfloat16 kernels (`F.<op>` on a
bfloat16 tensor) equal its float32-then-round path except softsign (1,142 of the 65,536 inputs one ulp
off: it rounds 1 + |x| to bfloat16) and tanhshrink (2,978, up to 14,717 ulp near 0: it rounds tanh(x)
to bfloat16 before subtracting) - measured with torch 2.13 on Zen 3.
"""

from __future__ import annotations

import numpy as np
import pytest

import multiact as ma
from multiact import consistency as C
from multiact import dtypes as D
from multiact.optable import OPS

torch = pytest.importorskip("torch")
mt = pytest.importorskip("multiact.torch")
F = torch.nn.functional

ALL = torch.from_numpy(C.bf16_all().view(np.int16)).view(torch.bfloat16)


def _torch_fn(op: str, p: dict):
    d = OPS[op].defn
    mod = torch if d.torch.namespace == "torch" else F
    fn = getattr(mod, d.torch.fn)
    return lambda t: fn(t, *(p[a] for a in d.torch.args), **{k: p[k] for k in d.torch.kwargs})


def _params(op: str) -> dict:
    spec = OPS[op]
    return spec.validate(C.param_cases(spec)[0])


TORCH_OPS = [op for op, s in OPS.items() if s.defn.torch is not None and op != "prelu"]


@pytest.mark.parametrize("op", TORCH_OPS)
def test_forward_matches_torch_float32_rounded_once(op):
    """Every bfloat16 input: multiact equals F.<op>(x.float()).bfloat16(), or (where torch's float32 is
    off) is the float64 reference rounded once (within the one ulp the exhaustive check allows)."""
    p = _params(op)
    ours = getattr(mt, op)(ALL, **p)
    assert ours.dtype == torch.bfloat16 and ours.shape == ALL.shape
    theirs = _torch_fn(op, p)(ALL.float()).bfloat16()
    ob, tb = ours.view(torch.int16).numpy().view(np.uint16), theirs.view(torch.int16).numpy().view(np.uint16)
    nan_o, nan_t = (ob & 0x7FFF) > 0x7F80, (tb & 0x7FFF) > 0x7F80
    zeros = ((ob & 0x7FFF) == 0) & ((tb & 0x7FFF) == 0)  # the contract fixes a zero's sign only at x = +-0
    differ = (ob != tb) & ~(nan_o & nan_t) & ~(zeros & (C.bf16_all().view(np.uint16) & 0x7FFF != 0))
    if not differ.any():
        return
    x32 = D.to_float32(C.bf16_all())
    with np.errstate(all="ignore"):
        ref = np.asarray(C.reference(OPS[op], "forward", p, np.float32, x32), dtype=np.float64)
    want = D.f64_to_bf16_bits(ref)
    off = np.abs(C._ordered(ob) - C._ordered(want))  # in ulps (the exhaustive check allows one, counted)
    wrong = differ & (off > 1)
    assert not wrong.any(), f"{op}: differs from torch where it is not the reference: {np.flatnonzero(wrong)[:8]}"


def test_plain_functions_are_zero_copy_on_tensors():
    x = torch.linspace(-3, 3, 97, dtype=torch.bfloat16)
    out = torch.empty_like(x)
    ptr = out.data_ptr()
    for _ in range(2):  # checked path, then the tensor hot path
        assert ma.gelu(x, out=out) is out and out.data_ptr() == ptr
        want = ma.gelu(x.view(torch.int16).numpy().view(D.bfloat16))
        assert np.array_equal(out.view(torch.int16).numpy(), want.view(np.int16))
        g = ma.gelu_grad(x, x)
        assert g.dtype == torch.bfloat16
    v = out._version
    ma.relu(x, out=out)
    assert out._version > v
    inplace = x.clone()
    ptr = inplace.data_ptr()
    assert ma.silu(inplace, out=inplace) is inplace and inplace.data_ptr() == ptr
    assert torch.equal(inplace, ma.silu(x))
    strided = x[::3]
    assert torch.equal(ma.silu(strided), ma.silu(x)[::3])


def test_custom_ops_and_autograd_in_bfloat16():
    """multiact.torch's forward and backward on bfloat16 tensors (cold: the custom op; warm: the eager path)
    are the plain functions' results, bit for bit; the gradient of a parameter comes back in bfloat16."""
    x0 = torch.linspace(-4, 4, 301, dtype=torch.bfloat16)
    for _ in range(3):
        x = x0.clone().requires_grad_()
        y = mt.silu(x)
        (dx,) = torch.autograd.grad(y, x, torch.ones_like(y))
        assert y.dtype == dx.dtype == torch.bfloat16
        assert torch.equal(y.detach(), ma.silu(x0)) and torch.equal(dx, ma.silu_grad(torch.ones_like(x0), x0))
    m = mt.Swish().to(torch.bfloat16)
    m(x0.clone().requires_grad_()).sum().backward()
    (beta,) = m.parameters()
    assert beta.grad.dtype == torch.bfloat16
    assert torch.equal(beta.grad, torch.tensor(float(ma.swish_beta_grad(torch.ones_like(x0), x0, 1.0)),
                                               dtype=torch.bfloat16))
