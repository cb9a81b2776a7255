"""float64 (the numba backend's parallel loops, native's pthread pool) after fork(), and from threads, on each
threading layer.

Each case runs in a fresh interpreter with a timeout: a child killed by GNU OpenMP or a fork Pool that
never returns fails the test instead of hanging the suite.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

TIMEOUT = 240  # s; a cold numba cache compiles the loops in the parent first

# The parent starts numba's pool with float64 calls (elementwise, blocked non-contiguous, and a
# reduction), then the same calls must give the same bits in a forked child and in a fork Pool.
FORK = """
import multiprocessing as mp
import os

import numba
import numpy as np

import multiact as ma
from multiact import registry

X = np.linspace(-3, 3, 2**21)  # past the parallel threshold, also as the strided half
W = np.array([0.25])


def work(i):
    # elementwise results as bytes (serial and parallel loops give the same bits); a sum, whose order
    # of addition differs between them, rounded
    x = X[: 2**20] + i
    # (prelu's forward and swish's beta grad: numba's float64 loops; the others native's kernels on its
    # pthread pool)
    return (ma.gelu(x).tobytes(), ma.gelu_grad(np.ones_like(x), x).tobytes(), ma.tanh(X[::2] - i).tobytes(),
            float(f"{ma.swish_beta_grad(np.ones_like(x), x, 1.5):.9g}"), ma.leaky_relu(x, 0.1).tobytes(),
            ma.hardswish_grad(np.ones_like(x), X[::2] + i).tobytes(), ma.prelu(x, W, axis=0).tobytes())


want = [work(i) for i in range(4)]
layer = numba.threading_layer()  # raises if the parent never started the pool: the test would be void
print("layer", layer, flush=True)
pid = os.fork()
if pid == 0:
    ok = work(1) == want[1] and registry.module("numba").info()["threads"] >= 1
    os._exit(0 if ok else 3)
_, status = os.waitpid(pid, 0)
assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"forked child: status {status}"
with mp.get_context("fork").Pool(2) as pool:
    got = pool.map(work, range(4))
assert got == want, "fork Pool results differ"
print("fork ok", flush=True)
"""

# Four threads calling float64 ops past the parallel threshold at once: gelu on native's pool, prelu on
# numba's.
THREADS = """
import threading

import numba
import numpy as np

import multiact as ma

x = np.linspace(-3, 3, 2**17)
w = np.array([0.25])


def both():
    return np.concatenate([ma.gelu(x), ma.prelu(x, w, axis=0)])


want = both()
print("layer", numba.threading_layer(), flush=True)
bad = []


def body():
    for _ in range(30):
        if not np.array_equal(both(), want):
            bad.append(1)


ts = [threading.Thread(target=body) for _ in range(4)]
for t in ts:
    t.start()
for t in ts:
    t.join()
assert not bad
print("threads ok", flush=True)
"""


def _layer_available(layer: str) -> bool:
    if layer == "tbb":
        try:
            import numba.np.ufunc.tbbpool  # noqa: F401
        except ImportError:
            return False
    return True


LAYERS = [pytest.param(layer, marks=pytest.mark.skipif(not _layer_available(layer), reason=f"no {layer} here"))
          for layer in ("default", "omp", "workqueue", "tbb")]


def run_script(script: str, **env: str) -> subprocess.CompletedProcess:
    """Run script in a fresh interpreter with two numba threads; kill its whole process group on timeout."""
    full_env = {**os.environ, "NUMBA_NUM_THREADS": "2", "MULTIACT_NUM_THREADS": "2", **env}
    p = subprocess.Popen([sys.executable, "-c", textwrap.dedent(script)], env=full_env, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        out, _ = p.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        pytest.fail(f"timed out after {TIMEOUT} s (a fork Pool that never returns?):\n{out}")
    return subprocess.CompletedProcess(p.args, p.returncode, out)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork() on this platform")
@pytest.mark.parametrize("layer", LAYERS)
def test_float64_after_fork(layer):
    r = run_script(FORK, NUMBA_THREADING_LAYER=layer)
    assert r.returncode == 0 and "fork ok" in r.stdout, r.stdout


@pytest.mark.parametrize("layer", LAYERS)
def test_float64_from_threads(layer):
    """workqueue is not thread-safe: concurrent calls must take turns at the pool, not abort."""
    r = run_script(THREADS, NUMBA_THREADING_LAYER=layer)
    assert r.returncode == 0 and "threads ok" in r.stdout, r.stdout


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="omp is GNU OpenMP (not fork-safe) on Linux")
def test_info_reports_layer_and_fork():
    """backends() says which layer runs and what a forked child does; the child says it runs serial."""
    r = run_script("""
        import os
        import numpy as np
        import multiact as ma
        from multiact import registry

        ma.prelu(np.linspace(-3, 3, 2**20), np.array([0.25]), axis=0)  # numba's float64 loop starts its pool
        info = registry.module("numba").info()
        print(info["threading_layer"], "|", info["fork"], flush=True)
        if os.fork() == 0:
            print("child |", registry.module("numba").info()["fork"], flush=True)
            os._exit(0)
        os.wait()
    """, NUMBA_THREADING_LAYER="omp")
    assert r.returncode == 0, r.stdout
    assert "omp | forked children: serial loops only" in r.stdout, r.stdout
    assert "child | serial loops only: forked from a process that had started numba's omp pool" in r.stdout
