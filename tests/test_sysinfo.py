"""The CPU identity: stored /proc/cpuinfo samples parse into the right vendor, family, model, stepping,
microarchitecture and SIMD features, and `multiact info` and `multiact bench` carry this machine's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from multiact.cli import bench, sysinfo
from multiact.cli.commands import main

SAMPLES = Path(__file__).resolve().parent / "cpuinfo"


def parse(name: str) -> dict:
    return sysinfo.identity(sysinfo._cpuinfo((SAMPLES / name).read_text()))


def test_amd_family_23_model_1_is_zen_1():
    ident = parse("amd_epyc_f23_m1_zen1.txt")
    assert (ident["vendor"], ident["family"], ident["model"], ident["stepping"]) == ("AuthenticAMD", 23, 1, 2)
    assert ident["model_name"] == "AMD EPYC 7551 32-Core Processor" and ident["microarchitecture"] == "Zen 1"
    simd = ident["simd"]
    assert simd["avx2"] and simd["fma"] and simd["f16c"]
    assert not simd["avx512f"]  # only the first processor counts (the sample's second one lists avx512f)
    line = sysinfo.describe(ident)
    assert "family 23 model 1 stepping 2: Zen 1" in line and line.endswith("avx2 fma f16c, no avx512")


def test_amd_family_25_model_1_is_zen_3():
    ident = parse("amd_epyc_f25_m1_zen3.txt")
    assert (ident["vendor"], ident["family"], ident["model"], ident["stepping"]) == ("AuthenticAMD", 25, 1, 1)
    assert ident["microarchitecture"] == "Zen 3"
    assert sysinfo.describe(ident) == ("AMD EPYC (AuthenticAMD family 25 model 1 stepping 1: Zen 3); "
                                       "avx2 fma f16c, no avx512")


def test_intel_xeon_with_avx512():
    ident = parse("intel_xeon_f6_m143_sapphire_rapids.txt")
    assert (ident["vendor"], ident["family"], ident["model"], ident["stepping"]) == ("GenuineIntel", 6, 143, 8)
    assert ident["microarchitecture"] == "Sapphire Rapids"
    for f in ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512_bf16", "avx512_fp16"):
        assert ident["simd"][f], f
    assert "avx512f avx512bw avx512dq avx512vl avx512_bf16" in sysinfo.describe(ident)


def test_aarch64_with_asimdhp():
    ident = parse("aarch64_neoverse_n1_asimdhp.txt")
    assert ident["vendor"] == "ARM" and ident["implementer"] == "0x41" and ident["part"] == "0xd0c"
    assert (ident["family"], ident["model"], ident["stepping"]) == (8, 0xD0C, "r3p1")
    assert ident["microarchitecture"] == "Neoverse N1" and ident["model_name"] == "Neoverse N1"
    simd = ident["simd"]
    assert simd["asimd"] and simd["asimdhp"] and simd["fphp"] and not simd["sve"]  # first processor only
    assert sysinfo.describe(ident) == ("Neoverse N1 (ARM implementer 0x41 part 0xd0c r3p1: Neoverse N1); "
                                       "asimd asimdhp fphp, no bf16 sve sve2")


def test_microarchitecture_is_never_guessed():
    assert sysinfo.microarchitecture("AuthenticAMD", 23, 0x31) == "Zen 2"
    assert sysinfo.microarchitecture("AuthenticAMD", 25, 0x11) == "Zen 4"
    assert sysinfo.microarchitecture("AuthenticAMD", 26, 0x02) == "Zen 5"
    assert sysinfo.microarchitecture("AuthenticAMD", 25, 0xF0) == "unknown"  # a model no table lists
    assert sysinfo.microarchitecture("AuthenticAMD", 27, 0x00) == "unknown"
    assert sysinfo.microarchitecture("GenuineIntel", 6, 0x55, 7) == "Cascade Lake"
    assert sysinfo.microarchitecture("GenuineIntel", 6, 0x55, 4) == "Skylake-SP"
    assert sysinfo.microarchitecture("GenuineIntel", 6, 0x55, 8) == "unknown"
    assert sysinfo.microarchitecture("GenuineIntel", 6, 158, 10) == "unknown"  # a desktop part: not in the table
    assert sysinfo.microarchitecture("GenuineIntel", None, None) == "unknown"
    ident = sysinfo.identity({}, arch="x86_64")
    assert ident["vendor"] == "unknown" and ident["family"] is None and ident["microarchitecture"] == "unknown"
    assert "family/model unknown: microarchitecture unknown" in sysinfo.describe(ident)


def test_a_saved_run_without_an_identity_says_so():
    old = {"arch": "x86_64", "model": "AMD EPYC", "simd": {"avx2": True, "fma": True, "avx512f": False}}
    assert sysinfo.summary(old) == "AMD EPYC (family/model not recorded); avx2 fma, no avx512"


# ---- this machine, through the commands -------------------------------------------------------

def here() -> dict:
    ident = sysinfo.cpu()["identity"]
    if ident["family"] is None:
        pytest.skip("no CPU family/model readable on this machine")
    return ident


def test_info_shows_family_and_model(capsys):
    ident = here()
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    want = f"family {ident['family']}, model {ident['model']}, stepping {ident['stepping']}"
    if "implementer" in ident:
        want = f"implementer {ident['implementer']}, part {ident['part']}"
    assert f"vendor {ident['vendor']}" in out and want in out
    assert f"microarchitecture {ident['microarchitecture']}" in out
    assert main(["info", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)["cpu"]["identity"]
    assert {k: got[k] for k in ("vendor", "family", "model", "stepping", "microarchitecture")} == {
        k: ident[k] for k in ("vendor", "family", "model", "stepping", "microarchitecture")}
    assert set(got["simd"]) >= set(sysinfo.SIMD_FLAGS.get(sysinfo.cpu()["arch"], ()))


def test_bench_header_and_json_name_the_cpu(capsys, tmp_path):
    ident = here()
    path = tmp_path / "b.json"
    assert main(["bench", "--op", "relu", "--size", "1K", "--direction", "forward", "--samples", "1", "--peers",
                 "none", "--backend", "numpy", "--json", str(path), "--no-progress"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("# CPU: ") and sysinfo.describe(ident) in first
    meta = json.loads(path.read_text())["meta"]
    assert meta["cpu"]["identity"]["family"] == ident["family"] and meta["cpu"]["identity"]["model"] == ident["model"]
    # a saved run names the CPU it was measured on, not the one that shows it
    meta["cpu"]["summary"] = "Some CPU (AuthenticAMD family 23 model 1 stepping 2: Zen 1); avx2 fma f16c, no avx512"
    saved = json.loads(path.read_text())
    saved["meta"] = meta
    path.write_text(json.dumps(saved))
    assert main(["bench", "--load", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("# CPU: Some CPU (AuthenticAMD family 23 model 1") and "on Some CPU" in out


def test_plot_title_names_the_cpu(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    titles = []
    monkeypatch.setattr(bench, "_save_small", lambda fig, path: titles.append(fig._suptitle.get_text()))
    row = bench.Row(op="relu", direction="forward", dtype="float32", size=1024, threads=1, mode="alloc",
                    impl="numpy", kind="backend", median_s=1e-6, q1_s=1e-6, q3_s=1e-6, calls_per_sample=1,
                    bytes=8192)
    bench.plot([row], str(tmp_path / "p.png"), cpu={"usable_cpus": 2, "summary": "Saved CPU (family 25 model 1)"})
    assert "Saved CPU (family 25 model 1)" in titles[0]
