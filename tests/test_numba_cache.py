"""The numba backend without a usable on-disk cache: it compiles in memory and says so in backends().

Tests run as root, for whom chmod makes nothing unwritable: an unusable NUMBA_CACHE_DIR is a path
that cannot be created (under /dev/null), and "nothing writable" (read-only package tree and home)
is numba's cache-directory check made to fail, each in a fresh interpreter.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from multiact import registry

pytest.importorskip("numba")

# float64 ops go to the numba backend; report what its info() says and where numba put each loop.
CALLS = """
import numpy as np
import multiact as ma
from multiact import registry

nb = registry.module("numba")
x = np.linspace(-3, 3, 1000)
assert np.allclose(ma.gelu(x, backend="numba"), ma.gelu(x, backend="numpy"))
ma.gelu_grad(np.ones_like(x), x, backend="numba")
print("cache |", nb.info()["cache"])
print("paths |", {nb._loops(("gelu", d, "float64")).loop(False).stats.cache_path for d in ("forward", "backward")})
"""

# what a read-only package tree and home look like to numba: every cache directory fails its check
NOTHING_WRITABLE = """
import numba.core.caching as caching

def refuse(self):
    raise PermissionError(13, "Permission denied", self.get_cache_path())

caching._CacheLocator.ensure_cache_path = refuse
"""


def run(script: str, cache_dir: str | None) -> str:
    """script's output in a fresh interpreter with NUMBA_CACHE_DIR set to cache_dir (None: unset)."""
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    if cache_dir is not None:
        env["NUMBA_CACHE_DIR"] = cache_dir
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], env=env, capture_output=True, text=True,
                       timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def test_unusable_cache_dir_compiles_in_memory():
    """Not into the package tree instead: the user who set NUMBA_CACHE_DIR asked for no other place."""
    out = run(CALLS, "/dev/null/numba-cache")
    assert "cache | off: NUMBA_CACHE_DIR=/dev/null/numba-cache is not usable" in out, out
    assert "paths | {None}" in out, out


def test_nothing_writable_compiles_in_memory():
    out = run(NOTHING_WRITABLE + textwrap.dedent(CALLS), None)
    assert "cache | off: no writable cache directory (cannot cache function" in out, out
    assert "paths | {None}" in out, out


def test_cache_on_where_writable(tmp_path):
    out = run(CALLS, str(tmp_path))
    assert f"cache | on: {tmp_path}" in out, out
    assert str(tmp_path) in out.split("paths |")[1], out


def test_info_reports_cache():
    cache = registry.module("numba").info()["cache"]
    assert cache.startswith(("on: ", "off: ")), cache
