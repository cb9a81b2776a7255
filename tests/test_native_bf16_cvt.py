"""avx512's bfloat16 stores by AVX512_BF16's vcvtneps2bf16: the same bits as the integer sequence on every float32
pattern, used exactly where the CPU has it, refused on request.  (test_native_bf16.py runs every bfloat16 kernel
with each way of storing this machine has.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import native_bf16_cvt

native = pytest.importorskip("multiact._native", reason="the native extension is not built")
lib, ffi = native.lib, native.ffi
CANNOT = int(ffi.cast("size_t", -1))  # ma_bf16_cvt_check where vcvtneps2bf16 cannot run
HAS_CVT, CVT_WHY = native_bf16_cvt(lib, ffi)


def test_vcvtneps2bf16_narrowing_gives_the_integer_sequences_bits_on_every_float32_pattern():
    """The kernels' two vcvtneps2bf16 paths (single vectors with their subnormal lanes patched; main-loop steps by
    vcvtne2ps2bf16 + vpermw) against the integer sequence on all 2^32 float32 patterns (about half a second), where
    the CPU has AVX512_BF16; elsewhere the check says it cannot run."""
    first = ffi.new("uint32_t *")
    bad = lib.ma_bf16_cvt_check(0, 0xFFFFFFFF, first)
    if not HAS_CVT:
        assert bad == CANNOT
        pytest.skip(f"no vcvtneps2bf16 here: {CVT_WHY}")
    assert bad == 0, f"{bad} patterns differ, the first 0x{first[0]:08x}"


def test_the_choice_follows_the_cpu_and_the_environment():
    """Used by default exactly where avx512 runs and CPUID shows AVX512_BF16 (and the build has it);
    MULTIACT_NATIVE_BF16_CVT=0 refuses it, with the reason, and the backend says which store it runs."""
    code = ("from multiact._native import lib, ffi; from multiact import registry; "
            "print(lib.ma_get_bf16_cvt(), ffi.string(lib.ma_bf16_cvt_why()).decode(), "
            "registry.module('native').info()['bf16_store'], sep='|')")
    for env, want_on in (({}, HAS_CVT), ({"MULTIACT_NATIVE_BF16_CVT": "0"}, False)):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                             env={**os.environ, "MULTIACT_NATIVE_BF16_CVT": "1", **env}).stdout.strip()
        on, why, store = out.split("|")
        assert on == str(int(want_on)), out
        assert (why == "") == want_on, out
        if env and HAS_CVT:
            assert "MULTIACT_NATIVE_BF16_CVT=0" in why, out
        if want_on:
            assert store.startswith("vcvtneps2bf16"), out
    flags = Path("/proc/cpuinfo").read_text().split() if Path("/proc/cpuinfo").exists() else []
    avx512 = bool(lib.ma_isa_supported(b"avx512"))
    if HAS_CVT:
        assert "avx512_bf16" in flags and avx512
    elif avx512 and "avx512_bf16" in flags:
        assert "no vcvtneps2bf16" in CVT_WHY, CVT_WHY  # only a build without it (SIMDe, another compiler)
