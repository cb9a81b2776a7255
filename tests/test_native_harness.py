"""The C harness of the native kernels, from the test command: host SIMD, NEON under qemu, sanitizers;
and the built extension itself under the sanitizers.

Each runs a script of scripts/ (usable by hand too); a missing tool is a skip that says what to install.
The default run (CI) builds the host SIMD harness only: NEON under qemu, the sanitizers and valgrind each
rebuild every kernel (minutes on 2 cores since the gated kernels doubled the table) and run with
MULTIACT_TEST_FULL=1; their last results are in tests/results/native-harness-full.txt.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
X86 = platform.machine() in ("x86_64", "AMD64")


FULL = os.environ.get("MULTIACT_TEST_FULL") == "1"
long_build = pytest.mark.skipif(not FULL, reason="rebuilds every kernel (minutes): MULTIACT_TEST_FULL=1; "
                                "last results in tests/results/native-harness-full.txt")


def _run(*cmd: str, env: dict | None = None) -> None:
    proc = subprocess.run(
        list(cmd), cwd=ROOT, capture_output=True, text=True, timeout=900,
        env={**os.environ, "PYTHON": sys.executable, **(env or {})},
    )
    tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-30:])
    print(tail)
    assert proc.returncode == 0, tail


def _avx2() -> bool:
    try:
        return "avx2" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


@pytest.fixture(scope="module", autouse=True)
def _compiler():
    if shutil.which("gcc") is None:
        pytest.skip("needs gcc")


@pytest.mark.skipif(not (X86 and _avx2()), reason="the host has no AVX2")
def test_avx2_kernels_against_scalar():
    _run("bash", "scripts/test_native_harness.sh", "avx2", "gcc")


@long_build
@pytest.mark.skipif(
    not (shutil.which("aarch64-linux-gnu-gcc") and shutil.which("qemu-aarch64")),
    reason="needs gcc-aarch64-linux-gnu and qemu-user (apt-get install gcc-aarch64-linux-gnu qemu-user)",
)
def test_neon_kernels_under_qemu_with_and_without_fp16():
    _run("bash", "scripts/test_neon_qemu.sh")


def _require_sanitizers() -> None:
    probe = subprocess.run(["gcc", "-fsanitize=address,undefined", "-x", "c", "-", "-o", "/dev/null"],
                           input="int main(void){return 0;}", capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip("gcc cannot link -fsanitize=address,undefined here (libasan/libubsan missing)")


@long_build
@pytest.mark.skipif(not X86, reason="sanitized harness runs for the host ISA (x86-64 here)")
def test_kernels_under_address_and_undefined_behaviour_sanitizers():
    _require_sanitizers()
    _run("bash", "scripts/test_native_sanitize.sh")


@long_build
def test_extension_under_address_and_undefined_behaviour_sanitizers(pytestconfig, tmp_path):
    """multiact._native itself, built with MULTIACT_NATIVE_DEBUG=1, driven from CPython with libasan preloaded:
    the harness cannot see the cffi glue, the Python-side layouts or the thread pool as Python calls it.
    The build is kept in pytest's cache and reused while sources and flags are unchanged."""
    _require_sanitizers()
    cache = getattr(pytestconfig, "cache", None)  # absent under -p no:cacheprovider
    build_dir = cache.mkdir("native-sanitized") if cache else tmp_path
    _run(sys.executable, "scripts/native_sanitized.py", str(build_dir))


@long_build
@pytest.mark.skipif(not (X86 and _avx2()) or shutil.which("valgrind") is None, reason="needs valgrind and AVX2")
def test_harness_is_clean_under_valgrind_memcheck():
    _run("bash", "scripts/test_native_harness.sh", "avx2", "gcc", "valgrind", "--error-exitcode=1", "--leak-check=full",
         "--errors-for-leak-kinds=definite", "-q")
