"""The C harness of the native kernels, from the test command: host SIMD, NEON under qemu, sanitizers;
and the built extension itself under the sanitizers.

Each runs a script of scripts/ (usable by hand too); a missing tool is a skip that says what to install.
The default run (CI) builds the host SIMD harness and the avx512 harness on a sample of the kernel table
(native/kernels.py's sample(): every loop and vector-layer macro, prelu and the parameter gradients): on
AVX-512 hardware the real kernels, elsewhere built against SIMDe's AVX-512 emulation (pip install
cmeel-simde), whose whole-table build takes many minutes.  NEON under qemu, the sanitizers, valgrind and
the whole avx512 table each rebuild every kernel (minutes on 2 cores since the gated kernels doubled the
table) and run with MULTIACT_TEST_FULL=1; their last results are in results/native-harness-full.txt.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import native_kernels

ROOT = Path(__file__).resolve().parent.parent
X86 = platform.machine() in ("x86_64", "AMD64")


FULL = os.environ.get("MULTIACT_TEST_FULL") == "1"
long_build = pytest.mark.skipif(not FULL, reason="rebuilds every kernel (minutes): MULTIACT_TEST_FULL=1; "
                                "last results in results/native-harness-full.txt")


def _run(*cmd: str, env: dict | None = None) -> None:
    proc = subprocess.run(
        list(cmd), cwd=ROOT, capture_output=True, text=True, timeout=900,
        env={**os.environ, "PYTHON": sys.executable, **(env or {})},
    )
    tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-30:])
    print(tail)
    assert proc.returncode == 0, tail


def _avx2() -> bool:
    return "avx2" in native_kernels().host_isas()


def _avx512() -> bool:
    """The CPU runs the avx512 kernels (Linux lists these flags only where the OS enabled the ZMM state)."""
    return "avx512" in native_kernels().host_isas()


def _simde_include() -> str | None:
    """SIMDe's headers (0.8: PyPI's cmeel-simde), or SIMDE_INCLUDE; as scripts/test_native_harness.sh finds them."""
    import site

    dirs = [os.environ["SIMDE_INCLUDE"]] if os.environ.get("SIMDE_INCLUDE") else [
        os.path.join(d, "cmeel.prefix", "include") for d in [*site.getsitepackages(), site.getusersitepackages(),
                                                            *sys.path]]
    return next((d for d in dirs if os.path.exists(os.path.join(d, "simde", "x86", "avx512.h"))), None)


def _avx512_harness(sample: bool) -> None:
    """The avx512 kernels against scalar: the real ones where the CPU has AVX-512, else under SIMDe."""
    if not X86 or not _avx2():
        pytest.skip("the avx512 harness needs an x86-64 host with AVX2 (SIMDe emulates AVX-512 on it)")
    if _avx512():
        isa = "avx512"
    elif _simde_include():
        isa = "avx512-simde"
    else:
        pytest.skip("no AVX-512 here and no SIMDe headers: pip install cmeel-simde (the test extra has it)")
    # the whole table also against the avx2 kernels, bit for bit (HARNESS_TWIN: the avx2 build on top)
    _run("bash", "scripts/test_native_harness.sh", isa, "gcc",
         env={"HARNESS_SAMPLE": "1" if sample else "0", "HARNESS_TWIN": "" if sample else "avx2"})


@pytest.fixture(scope="module", autouse=True)
def _compiler():
    if shutil.which("gcc") is None:
        pytest.skip("needs gcc")


@pytest.mark.skipif(not (X86 and _avx2()), reason="the host has no AVX2")
def test_avx2_kernels_against_scalar():
    _run("bash", "scripts/test_native_harness.sh", "avx2", "gcc")



def test_the_sample_runs_every_signature_and_both_kinds_of_loop():
    """The sample stands for the table: each signature of the lists, in every direction, with a fast-path
    (split) and a plain body where the table has both; a composite's forward and backward together."""
    K = native_kernels()
    sample, split = K.sample(), K.split_kernels()
    bodies = {f: af for f, _, af, _ in K.family_bodies() + K.bias_bodies()}
    bodies.update({b: af for _, b, af, _ in K.family_bodies() + K.bias_bodies()})
    rows = {(k.signature, k.direction, k.cname) for k in K.table("x86_64") if k.isa == "scalar"}
    lists = set(K.UNARY) | set(K.BINARY) | set(K.TERNARY) | set(K.GATED) | set(K.BIAS)
    listed = [(sig, d, n) for sig, d, n in rows if n in lists]
    for group in {(sig, d, bodies.get(n, n) in split) for sig, d, n in listed}:
        assert any((sig, d, bodies.get(n, n) in split) == group for sig, d, n in listed if n in sample), group
    for f, b, _, _ in K.family_bodies() + K.bias_bodies():
        assert (f in sample) == (b in sample), f
    assert len(sample) < len(listed) / 4
    header = K.x_macro_header(only=sample)  # the harness's kernel list: the sample and nothing else
    elementwise = [n for n in sample if n in K.UNARY or n in K.BINARY or n in K.TERNARY]
    assert all(f"({n}, " in header for n in elementwise) and any(n in K.TERNARY for n in sample)
    assert header.count("MA_UNARY(") + header.count("MA_BINARY(") + header.count("MA_TERNARY(") == len(elementwise)


def test_avx512_kernels_against_scalar_on_a_sample():
    """The default run: the sample (under SIMDe on Zen 3: 33 s of CPU to build and run, 41 s wall at load 3-4)."""
    _avx512_harness(sample=True)


@pytest.mark.skipif(not X86, reason="the avx512 units are x86-64 code")
def test_the_avx512_units_compile_with_the_real_intrinsics(tmp_path):
    """Every avx512 translation unit as the extension compiles it (GCC's own AVX-512 intrinsics, not SIMDe's):
    CI builds the extension without them on a CPU that cannot run them (MULTIACT_NATIVE_ISAS=host, a third of
    the build), so this checks they still compile: -fsyntax-only here (about 1 s a part), code generation
    too with MULTIACT_TEST_FULL=1 (immediate operands are checked only there)."""
    if shutil.which("gcc") is None:
        pytest.skip("needs gcc")
    K = native_kernels()
    (tmp_path / "ma_kernel_list.h").write_text(K.x_macro_header())
    (tmp_path / "ma_kernel_decls.h").write_text(K.declarations("x86_64"))
    mode = ["-O0", "-c", "-o", os.devnull] if FULL else ["-fsyntax-only"]
    for part in range(K.PARTS):
        src = tmp_path / f"isa_avx512_p{part}.c"
        src.write_text(f'#define MA_PART {part}\n#include "isa_avx512.c"\n')
        _run("gcc", *mode, "-std=gnu11", "-ffp-contract=off", "-fno-math-errno", "-Wall", "-Werror",
             "-Wno-unknown-pragmas", f"-I{tmp_path}", "-Inative/src", str(src))


@long_build
def test_avx512_kernels_against_scalar():
    """Every avx512 kernel, and each bit for bit against its avx2 twin (under SIMDe: many minutes of compile)."""
    _avx512_harness(sample=False)


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
