"""Served kernels (multiact/cli/served.py): the C harness of an ISA answers kernel requests over a pipe, so
the accuracy sweeps judge ISAs this machine cannot run (NEON under qemu; its results in
results/accuracy-f32-{subset,dense}-neon.txt).  Checked here on the host's AVX2 harness, whose
answers must be the extension's own AVX2 kernels bit for bit (the CI build of test_native_harness.py, -O0)."""

from __future__ import annotations

import platform
import shutil
from types import SimpleNamespace

import numpy as np
import pytest
from conftest import native_kernels

from multiact.cli import accuracy as A
from multiact.cli import served
from multiact.optable import OPS

pytestmark = pytest.mark.skipif(
    platform.machine() not in ("x86_64", "AMD64") or shutil.which("gcc") is None
    or "avx2" not in native_kernels().host_isas(),
    reason="the AVX2 harness needs an x86-64 host with AVX2 and gcc",
)
AVX2 = served.ServedISA("avx2", "scripts/test_native_harness.sh avx2 gcc")


@pytest.fixture(autouse=True)
def _o0(monkeypatch):
    monkeypatch.setenv("HARNESS_OPT", "-O0")  # the build test_native_harness.py makes (same flags, same key)


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    """Bit for bit, NaN matching any NaN (payloads are not part of the contract)."""
    both_nan = np.isnan(a) & np.isnan(b)
    return bool(np.all((a.view(np.uint32) == b.view(np.uint32)) | both_nan))


def test_served_kernels_are_the_extensions_bit_for_bit():
    from multiact.backend import native_backend

    x = A.bit_points(0, 1 << 32, (1 << 20) + 7, 3)
    dy = np.full_like(x, np.float32(A.DY2))
    checked = 0
    for op, params in A.cases():
        if op in A.UNSERVED:
            continue
        spec = OPS[op]
        p = spec.validate(params)
        key = spec.kernel_key(p)
        for direction in A.directions(spec):
            ins = (x,) if direction == "forward" else (dy, x)
            got = AVX2.run(key, direction, p, *ins)
            want = np.empty_like(x)
            native_backend.kernel(key, direction, "float32", isa="avx2")(*ins, want, p)
            assert _same(got, want), (op, params, direction)
            checked += 1
    assert checked >= 50


def test_served_backward2_kernels_take_g_dy_and_x():
    from multiact.backend import native_backend

    x = A.bit_points(0, 1 << 32, (1 << 16) + 3, 5)
    dy = np.full_like(x, np.float32(A.DY2))
    g = np.linspace(-2, 2, x.size, dtype=np.float32)
    for op in ("gelu", "silu", "leaky_relu"):
        p = OPS[op].validate({})
        key = OPS[op].kernel_key(p)
        want = np.empty_like(x)
        native_backend.kernel(key, "backward2", "float32", isa="avx2")(g, dy, x, want, p)
        assert _same(AVX2.run(key, "backward2", p, g, dy, x), want), op


def test_a_sweep_through_the_server_judges_as_the_native_one():
    from multiact.backend import native_backend

    if native_backend.info()["isa"] != "avx2":
        pytest.skip(f"native runs {native_backend.info()['isa']} here (MULTIACT_NATIVE_ISA)")
    served_rows = A.run(["gelu", "softplus"], AVX2, stride=1 << 20, workers=1)
    native_rows = {(s.op, s.case, s.direction): s for s in A.run(["gelu", "softplus"], "native", stride=1 << 20,
                                                                workers=1)}
    assert served_rows and all(s.backend == "native/avx2 (served)" for s in served_rows)
    for s in served_rows:
        n = native_rows[(s.op, s.case, s.direction)]
        assert (s.points, s.max_ulp, s.over_bound) == (n.points, n.max_ulp, n.over_bound)


def test_prelu_is_left_out_and_a_missing_kernel_stops_with_the_reason():
    assert not [s for s in A.run(["prelu", "relu"], AVX2, stride=1 << 22, workers=1) if s.op == "prelu"]
    broken = served.ServedISA("avx2", "sh -c 'head -c 1 > /dev/null; exit 3'")
    with pytest.raises(RuntimeError, match="stopped .exit status 3. on relu"):
        broken.run("relu", "forward", {}, np.ones(4, np.float32))


def test_the_cli_wants_an_isa_and_a_known_one():
    args = SimpleNamespace(backend=None, serve=True, isa=None, op=None, dense=False, stride=None, workers=1,
                           json=None)
    with pytest.raises(SystemExit, match="needs --isa"):
        A.command(args)
    with pytest.raises(SystemExit, match="no harness command for ISA 'sparc'"):
        served.served("sparc")
    from multiact.cli import commands as cli

    with pytest.raises(SystemExit, match="--serve goes with --subset or --dense"):
        cli.main(["check", "--exhaustive", "--serve", "--isa", "neon"])
