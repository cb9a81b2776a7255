"""The cuda backend's tests run in their own pytest process under the CUDA simulator.

NUMBA_ENABLE_CUDASIM must be set before numba is first imported, so this
directory is run separately: `pytest tests --ignore=tests/cuda` and
`pytest tests/cuda`.  On a machine with a GPU, MULTIACT_CUDA_REAL=1 leaves the
variable alone and the same tests run on the device (with Numba arrays).
"""

from __future__ import annotations

import os
import sys

if os.environ.get("MULTIACT_CUDA_REAL") != "1":
    if "numba" in sys.modules and os.environ.get("NUMBA_ENABLE_CUDASIM") != "1":
        raise RuntimeError("tests/cuda must run in its own pytest process: numba was imported before the simulator "
                           "could be enabled (run `pytest tests/cuda` separately)")
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"

from multiact import registry  # noqa: E402 - after the simulator switch

registry.module("cuda")  # imports the backend (and numba) under the simulator
