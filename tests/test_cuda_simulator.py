"""Runs tests/cuda in its own process under the CUDA simulator (NUMBA_ENABLE_CUDASIM=1).

The simulator must be enabled before numba is first imported, which this process has done
long ago; a child pytest is the clean way to keep one test command for everything.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


@pytest.mark.skipif(os.environ.get("MULTIACT_CUDA_REAL") == "1", reason="run tests/cuda on the GPU instead")
def test_cuda_backend_under_the_simulator():
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", str(HERE / "cuda")],
        capture_output=True, text=True, env=env, cwd=HERE.parent, timeout=1200,
    )
    tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-40:])
    print(tail)
    assert proc.returncode == 0, tail


def test_a_fake_cuda_array_is_taken_on_the_first_call():
    """A user testing under NUMBA_ENABLE_CUDASIM=1: `cuda.to_device` arrays work before anything else has
    loaded the cuda backend, and come back in kind."""
    pytest.importorskip("numba.cuda")
    code = (
        "import numpy as np\n"
        "from numba import cuda\n"
        "import multiact as ma\n"
        "x = np.linspace(-2, 2, 64).astype(np.float32)\n"
        "y = ma.relu(cuda.to_device(x))\n"
        "assert type(y).__name__ == 'FakeCUDAArray', type(y)\n"
        "np.testing.assert_array_equal(y.copy_to_host(), np.maximum(x, 0))\n"
        "print('ok')\n"
    )
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]
