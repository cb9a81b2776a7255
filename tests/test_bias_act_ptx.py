"""The cuda backend's bias_act kernels (issue 16) as `builds()` lists them for compiling without a GPU: one per
(key, direction, dtype, layout: "strided" and "rows") the backend supports, derived from the table; and, under
MULTIACT_TEST_FULL=1, all 363 compiled for sm_90 by scripts/cuda_ptx_report.py (about 35 min on 2 loaded cores;
CI's tests/test_cuda_ptx.py compiles the sample `BIAS_ACT_SAMPLE`).  Results: results/cuda-ptx-bias_act.md."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import FULL

from multiact.optable import BIAS_ACT_KEYS

ROOT = Path(__file__).resolve().parents[1]
needs_numba_cuda = pytest.mark.skipif(importlib.util.find_spec("numba_cuda") is None,
                                      reason="numba-cuda is not installed (pip install -e '.[cuda]')")


def _child(code_or_args: list[str], timeout: int) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    return subprocess.run([sys.executable, *code_or_args], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=timeout)


@needs_numba_cuda
def test_builds_lists_every_bias_act_kernel():
    code = (
        "import json\nfrom multiact import registry\ncb = registry.module('cuda')\n"
        "names = [b.name for b in cb.builds() if b.family == 'bias_act' or b.source == 'bias_act_db_sums']\n"
        "want = [f'{k}.{d}.{t}.{lay}' for k in cb._BIAS_ACT_KEYS for d in ('backward', 'backward_y', 'forward')\n"
        "        for t in ('float16', 'float32', 'float64') if cb.supports(k, d, t) for lay in ('strided', 'rows')]\n"
        "same = all(cb._bias_py('bias_act:relu', 'backward', 'float32', lay) is next(\n"
        "    b.pyfunc for b in cb.builds() if b.name == f'bias_act:relu.backward.float32.{lay}')\n"
        "    for lay in ('strided', 'rows'))\n"
        "print(json.dumps([names, want, same]))\n"
    )
    proc = _child(["-c", code], 300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    names, want, same = json.loads(proc.stdout.strip().splitlines()[-1])
    assert sorted(n for n in names if not n.startswith("bias_act_db_sums")) == sorted(want)
    assert len(want) == 2 * 2 * 3 * len(BIAS_ACT_KEYS) + 2 * 3 * sum(
        spec.backward_y is not None or spec.name == "linear" for _, spec, _ in BIAS_ACT_KEYS.values())
    assert {n for n in names if n.startswith("bias_act_db_sums")} == {
        f"bias_act_db_sums.{t}.contiguous" for t in ("float16", "float32", "float64")}
    assert same  # the kernel launched is the one compiled without a GPU


@needs_numba_cuda
@pytest.mark.skipif(not FULL, reason="compiles 363 kernels (~35 min here): MULTIACT_TEST_FULL=1")
def test_every_bias_act_kernel_compiles_for_sm90_without_spills(tmp_path):
    proc = _child([str(ROOT / "scripts" / "cuda_ptx_report.py"), "--target", "90", "--family", "all", "--only",
                   "bias_act", "--out", str(tmp_path)], 3600)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    rows = json.loads((tmp_path / "cuda-ptx-report.json").read_text())["rows"]
    assert len(rows) >= 363 and not [r["kernel"] for r in rows if r.get("error") or r["findings"]]
