"""The cuda backend in bfloat16 (float32 staging on the device: uint16 bits widened into float32 buffers, the
float32 kernel, an integer round-to-nearest-even store; see multiact/backend/cuda_backend.py) under the simulator:
the exhaustive check's judge on a sample of the bfloat16 patterns (every special value among them), a few
cases by default, every elementwise case with MULTIACT_TEST_FULL=1; strided and in-place views; what the
backend does not claim in bfloat16 is refused by dispatch, not run some other way."""

from __future__ import annotations

import os

import numpy as np
import pytest

import multiact as ma
from multiact import consistency as C
from multiact import registry

cuda = pytest.importorskip("numba.cuda")
ml_dtypes = pytest.importorskip("ml_dtypes")
BF = np.dtype(ml_dtypes.bfloat16)
FULL = os.environ.get("MULTIACT_TEST_FULL") == "1"


def _sample(n: int) -> np.ndarray:
    special = [0x0000, 0x8000, 0x7F80, 0xFF80, 0x7FC0, 0xFFC1, 0x7F7F, 0xFF7F, 0x0001, 0x807F, 0x0080]
    idx = np.union1d(np.linspace(0, 0xFFFF, n).astype(int), special)
    return C.bf16_all()[idx[: idx.size - idx.size % 4]]


def _cases():
    mod = registry.module("cuda")
    cases = [c for c in C.bf16_cases() if mod.supports(C.bf16_key(c[0], c[1]), c[2], "bfloat16")]
    return cases if FULL else cases[::17]


@pytest.mark.parametrize("op,params,direction", _cases(), ids=lambda v: v if isinstance(v, str) else C.case_id(v))
def test_bf16_cases_on_the_device(op, params, direction):
    v = C.run_bf16_case("cuda", op, params, direction, x=_sample(600 if FULL else 56),
                        to_kind=cuda.to_device, from_kind=lambda a: a.copy_to_host())
    assert v.passed, v.describe()


def test_bf16_strided_in_place_and_refusals():
    host = np.linspace(-3, 3, 64).astype(BF).reshape(8, 8)
    want = ma.silu(host, backend="numpy").view(np.uint16)
    d = cuda.to_device(host)
    assert np.array_equal(ma.silu(d[:, ::2]).copy_to_host().view(np.uint16), want[:, ::2])
    assert ma.silu(d, out=d) is d
    assert np.array_equal(d.copy_to_host().view(np.uint16), want)
    assert not registry.module("cuda").supports("gated:silu", "forward", "bfloat16")
    with pytest.raises(ma.BackendError, match="no gated:silu forward kernel for bfloat16"):
        ma.swiglu(cuda.to_device(host))
