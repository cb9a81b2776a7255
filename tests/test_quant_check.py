"""`multiact check --quant` (issue 45's accuracy tests): a sample here (three ops of the table, every host
backend, bfloat16's 65,536 inputs); the whole run is committed (results/quant-check-*.txt)."""

from __future__ import annotations

import subprocess
import sys

import ml_dtypes
import numpy as np

import multiact as ma
from multiact.cli import quant_check as qc
from multiact.optable import OPS

# two smooth ops and one piecewise linear one, from the table
SAMPLE = [n for n in OPS if not OPS[n].defn.piecewise_linear][:2] + [n for n in OPS if OPS[n].defn.piecewise_linear][:1]


def test_a_sample_passes_on_every_host_backend():
    rep = qc.run(None, SAMPLE, ["bfloat16"])
    assert rep["backends"] and rep["passed"], qc.render(rep, full=True)
    assert {r["op"] for r in rep["rows"]} == set(SAMPLE)
    assert all(r["fused_diff"] == 0 for r in rep["rows"])


def test_the_judge_can_fail():
    """A code moved by two and a scale made finite where the reference's is not are caught."""
    x = qc.inputs("float16")
    spec = OPS[SAMPLE[0]]
    y64 = np.asarray(ma.forward(spec.name, x.astype(np.float64)), np.float64)
    q = qc.QUANTS[0]
    ok = qc.one_case("numpy", spec.name, {}, "float16", q, x, y64)
    assert ok["status"] == "pass"
    worse = y64.copy()
    worse[5, 7] = worse[5, 7] * 1.5 + 1.0  # the reference moved: the kernel's code is now far from it
    assert qc.one_case("numpy", spec.name, {}, "float16", q, x, worse)["bad"] >= 1
    nan = y64.copy()
    nan[9, 3] = np.nan
    assert qc.one_case("numpy", spec.name, {}, "float16", q, x, nan)["status"] == "FAIL"


def test_round_codes_neighbours_differ_by_one():
    for dtype in ("float8_e4m3fn", "float8_e5m2"):
        bits = np.arange(256, dtype=np.uint8)
        vals = bits.view(getattr(ml_dtypes, dtype)).astype(np.float64)
        fin = np.isfinite(vals)
        assert (qc.round_codes(vals[fin], dtype) == qc.ordinals(bits[fin], dtype)).all()


def test_the_command_runs():
    r = subprocess.run([sys.executable, "-m", "multiact", "check", "--quant", "--op", SAMPLE[1], "--dtype", "f16",
                        "--backend", "numpy", "--no-progress"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "quant PASSED" in r.stdout
