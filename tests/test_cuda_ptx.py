"""The cuda backend compiled for a GPU without one (scripts/cuda_ptx_report.py, issue 22).

Every kernel the backend can launch is compiled for sm_90 (and a representative one per formula for
sm_80) and assembled with ptxas: no compile or assembly error, no spill or stack frame, no implicit
float16/float32 -> float64 promotion, and no float64 arithmetic at all in a float16/float32 kernel (the
literal rule of issue 22) but in the kernels the script's `F64_ALLOWED` names, each with its reason (the
parameter-gradient reductions, which accumulate in float64).  Of the composite-family kernels (gated:<act>,
6 per activation key, about 3 s each) CI compiles a sample (`--family sample`: the float16 strided backward
of every third key, at both targets), and of the elementwise kernels two forms of each formula for sm_90
(`90:sample`; all of them with MULTIACT_TEST_FULL=1); `python scripts/cuda_ptx_report.py` with no arguments
compiles everything.  The compiles run in one child process (numba must not be in
simulator mode, and nothing is cached).  Needs the `[cuda]` extra (numba-cuda), not a GPU.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "cuda_ptx_report.py"
pytestmark = pytest.mark.skipif(importlib.util.find_spec("numba_cuda") is None,
                                reason="numba-cuda is not installed (pip install -e '.[cuda]')")


def _report_module():
    spec = importlib.util.spec_from_file_location("cuda_ptx_report", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _child(args: list[str], timeout: int) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, cwd=ROOT, timeout=timeout)


FULL = os.environ.get("MULTIACT_TEST_FULL") == "1"


def _check_report(report: dict) -> list[dict]:
    """The findings-free report of one run; returns its sm_90 rows."""
    rows = report["rows"]
    sm90 = [r for r in rows if r["target"] == "sm_90"]
    sm80 = [r for r in rows if r["target"] == "sm_80"]
    assert len({r["source"] for r in sm80}) == len(sm80) > (50 if FULL else 20)
    assert not [r["kernel"] for r in rows if r.get("error") or r["findings"]]
    R = _report_module()
    narrow = [r for r in rows if r["dtype"] != "float64"]
    assert report["strict_f64"] and not [
        r["kernel"] for r in narrow if r["f64_ops"] and not R.f64_allowance(r["source"])]
    for suffix in R.F64_ALLOWED:  # each allowance is still needed (a stale one would hide a regression)
        assert any(r["f64_ops"] and r["source"].endswith(suffix) for r in narrow), f"F64_ALLOWED {suffix!r} is unused"
    assert len({r["source"] for r in sm90 if r["source"].startswith("gated:")}) >= 8, "the gated sample is missing"
    if not report["assembler"].startswith("none"):
        assert all(r["registers"] for r in rows), "ptxas gave no register count"
    return sm90


def _report(tmp_path, sm90: str, sm80: str) -> dict:
    proc = _child([str(SCRIPT), "--target", sm90, "--target", sm80, "--family", "sample",
                   "--out", str(tmp_path)], 900)
    print(proc.stdout[-8000:])
    assert proc.returncode == 0, proc.stdout[-8000:] + proc.stderr[-4000:]
    return json.loads((tmp_path / "cuda-ptx-report.json").read_text())


def test_a_sample_of_every_formula_and_variant_compiles_for_sm90_and_sm80(tmp_path):
    """CI's set: every formula in two of its forms on sm_90 (`:sample`), every third on sm_80 (`:thin`); every
    layout x dtype compiled for some formula.  MULTIACT_TEST_FULL=1 compiles every kernel for sm_90 (the next test)."""
    report = _report(tmp_path, "90:sample", "80:thin")
    sm90 = _check_report(report)
    second = [r for r in sm90 if any(u.endswith(" backward2") for u in r["uses"])]  # backward2: a sample
    assert {r["source"] for r in second} == set(_report_module().BACKWARD2_SAMPLE) and len(second) == len(
        _report_module().BACKWARD2_SAMPLE)
    elementwise = [r for r in sm90 if not r["source"].startswith(("gated:", "bias_act:", "quant:")) and r not in second]
    quant = {r["kernel"] for r in sm90 if r["source"].startswith("quant:")}
    assert quant == set(_report_module().QUANT_SAMPLE), quant  # issue 46's quantizing kernels: the sample
    sources = {r["source"] for r in elementwise}
    assert len(elementwise) >= 2 * len(sources) - 5 and len(sources) > 50
    variants = {(r["layout"], r["dtype"]) for r in elementwise}
    assert variants == {(lay, dt) for lay in ("strided", "contiguous") for dt in ("float16", "float32", "float64")}


@pytest.mark.skipif(not FULL, reason="compiles all ~340 elementwise kernels (minutes): MULTIACT_TEST_FULL=1")
def test_every_kernel_compiles_for_sm90_and_sm80_without_spills_or_promotions(tmp_path):
    report = _report(tmp_path, "90", "80:representative")
    sm90 = _check_report(report)
    assert len(sm90) == report["builds"] > 300
    assert len({r["source"] for r in sm90 if any(u.endswith(" backward2") for u in r["uses"])}) >= 15  # f''


def test_the_promotion_check_catches_a_bare_literal(tmp_path):
    """float32 * 0.1 is float64 math (numba types 0.1 as float64); float32 * np.float32(0.1) is not."""
    (tmp_path / "kern.py").write_text(
        "import numpy as np\nfrom numba import cuda\n\n"
        "def bad(x, out):\n    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):\n"
        "        out[i] = x[i] * 0.1\n\n"
        "def good(x, out):\n    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):\n"
        "        out[i] = x[i] * np.float32(0.1)\n"
    )
    code = (
        f"import sys, json, types as T; sys.path[:0] = [{str(tmp_path)!r}, {str(SCRIPT.parent)!r}]\n"
        "import kern, cuda_ptx_report as R\nfrom numba import types\n"
        "a = types.Array(types.float32, 1, 'C')\nout = {}\n"
        "for name in ('bad', 'good'):\n"
        "    b = T.SimpleNamespace(pyfunc=getattr(kern, name), argtypes=(a, a))\n"
        "    ptx, promo = R.compile_kernel(b, [(9, 0)])\n"
        "    out[name] = [promo, R.analyse(ptx[(9, 0)], b, [])['f64_ops']]\n"
        "print(json.dumps(out))\n"
    )
    proc = _child(["-c", code], 300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    (bad_promo, bad_f64), (good_promo, good_f64) = got["bad"], got["good"]
    assert len(bad_promo) == 1 and "kern.py:6 mul float32->float64" in bad_promo[0] and bad_f64 > 0
    assert good_promo == [] and good_f64 == 0


def test_ptxas_report_and_findings():
    R = _report_module()
    log = ("ptxas info    : Compiling entry function 'k' for 'sm_90'\n"
           "ptxas info    : Function properties for k\n"
           "    40 bytes stack frame, 44 bytes spill stores, 44 bytes spill loads\n"
           "ptxas info    : Used 255 registers, used 0 barriers\n")
    asm = R.parse_ptxas(log)
    assert asm == {"registers": 255, "stack": 40, "spill_stores": 44, "spill_loads": 44}
    row = {"source": "silu_grad", "dtype": "float32", "f64_ops": 3, "f64_from": {"gate_bwd": 3}, "promotions": [],
           **asm}
    assert R.findings(row, strict=False) == ["spills: 44 B stored, 44 B loaded, 40 B stack frame"]
    clean = {**row, "stack": 0, "spill_stores": 0, "spill_loads": 0}
    assert R.findings(clean, strict=True) == ["3 float64 ops in a float32 kernel (gate_bwd 3)"]
    assert R.findings({**clean, "source": "swish_beta_param_grad"}, strict=True) == []  # F64_ALLOWED
    assert R.findings({**clean, "dtype": "float64"}, strict=True) == []
    assert R.f64_allowance("prelu_param_grad") and R.f64_allowance("silu") is None
    ptx = ".loc 1 7 3\n\t@%p1 fma.rn.f64 \t%fd1, %fd2, %fd3, %fd4;\n\tld.global.v4.f32 {%f1,%f2,%f3,%f4}, [%rd1];\n"
    assert list(R.instructions(ptx)) == [("fma.rn.f64", 7), ("ld.global.v4.f32", 7)]
    assert R.op_key("ld.global.v4.f32") == ("ld", "global", "f32") and R.op_key("setp.lt.f64") == ("setp", "", "f64")
