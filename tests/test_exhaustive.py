"""The exhaustive float32 engine (`multiact check --exhaustive`, multiact/cli/exhaustive.py).

Its figures stand for all 2^32 inputs only if its two substitutions hold: the compiled float64 reference
(the numba backend's float64 kernels) must agree with reference.py, and the compiled judge must count as
accuracy.judge does.  Both are checked here on strides of the bit patterns, with a resumed journal.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from multiact.cli import accuracy as A

pytest.importorskip("numba")
native = pytest.importorskip("multiact.backend.native_backend")
if not native.available()[0]:
    pytest.skip(native.available()[1], allow_module_level=True)

from multiact.cli import exhaustive as E  # noqa: E402

STRIDE = 1 << 16
# one op per rule of the judge: a forward floor (hardsigmoid's fwd_atol), the backward floor, y-forms
# (elu adds alpha to y), prelu's kernel signature, NaN/inf outputs (logsigmoid), subnormal outputs (gelu)
OPS = ("hardsigmoid", "gelu", "elu", "prelu", "logsigmoid", "sigmoid")


def _key(s: A.Stats) -> tuple[str, str, str]:
    return s.op, s.case, s.direction


def test_compiled_reference_agrees_with_reference_py():
    far = E.crosscheck(stride=STRIDE)
    assert {op for op, *_ in far} == {op for op, _ in A.cases()}
    worst = max(far, key=lambda t: t[3])
    assert worst[3] <= E.REF_AGREE, worst


def test_compiled_judge_counts_as_accuracy_judge():
    isa = native.info()["isa"]
    offset = A.SUBSET_OFFSET % STRIDE
    fast = {_key(s): s for s in E.measure(OPS, [isa], 0, 1 << 32, STRIDE, offset)}
    slow = {_key(s): s for s in A.run(OPS, "native", stride=STRIDE, workers=1)}
    assert fast.keys() == slow.keys()
    for k, want in slow.items():
        got = fast[k]
        assert got.backend == f"native/{isa}"
        assert (got.points, got.over_bound, got.special_miss, got.region_over) == (
            want.points, want.over_bound, want.special_miss, want.region_over), k
        # the two references differ by up to REF_AGREE float32 ulp (measured: 2e-6), so the errors may too
        assert got.max_ulp == pytest.approx(want.max_ulp, abs=E.REF_AGREE), k
        assert got.subnormal_max == pytest.approx(want.subnormal_max, abs=E.REF_AGREE), k
        for r in A.REGIONS:
            assert got.region_max[r] == pytest.approx(want.region_max[r], abs=E.REF_AGREE), (k, r)


def test_every_isa_judged_and_a_bad_kernel_is_counted(monkeypatch):
    """Each ISA gets its own rows; a kernel one ulp off everywhere is seen as such (the judge can fail)."""
    isas = native.info()["isas"]
    rows = E.measure(("tanh",), isas, 0, 1 << 32, STRIDE, 7)
    assert sorted({s.backend for s in rows}) == sorted(f"native/{i}" for i in isas)
    assert all(s.passed for s in rows)
    real = native.kernel

    def off(key, direction, dtype, isa=None):  # every result 5 ulp up
        k = real(key, direction, dtype, isa=isa)

        def bad(*a):
            k(*a)
            a[-2].view("uint32")[:] += 5

        return bad

    monkeypatch.setattr(native, "kernel", off)
    rows = E.measure(("tanh",), isas[:1], 0, 1 << 32, STRIDE, 7)
    assert all(s.over_bound > 0 and s.max_ulp >= 4.5 for s in rows if s.direction == "forward")


def test_journal_resumes_and_refuses_another_run(tmp_path, monkeypatch):
    monkeypatch.setattr(E, "CHUNK", 256)
    monkeypatch.setattr(E, "JOB", 1 << 28)  # 16 jobs
    path = tmp_path / "j.jsonl"
    whole = E.run(("softsign",), stride=STRIDE, workers=1, journal=str(path))
    lines = path.read_text().splitlines()
    assert len(lines) == 1 + 16
    path.write_text("\n".join(lines[:6]) + "\n")  # stopped after five jobs
    resumed = E.run(("softsign",), stride=STRIDE, workers=1, journal=str(path))
    assert [A.as_json([s]) for s in resumed] == [A.as_json([s]) for s in whole]
    assert len(path.read_text().splitlines()) == 1 + 16
    with pytest.raises(SystemExit, match="another run"):
        E.run(("tanh",), stride=STRIDE, workers=1, journal=str(path))
    head = json.loads(lines[0])["head"]
    assert head["ops"] == ["softsign"] and head["stride"] == STRIDE


def test_kernel_of_an_isa_this_machine_does_not_run():
    with pytest.raises(ValueError, match="ISA 'nonesuch' does not run here"):
        native.kernel("tanh", "forward", "float32", isa="nonesuch")


@pytest.mark.parametrize("argv, message", [
    (["--isa", "nonesuch"], "ISA nonesuch does not run here"),
    (["--backend", "numpy"], "the native backend only"),
    (["--op", "nonesuch"], "unknown op"),
])
def test_cli_refuses_clearly(argv, message):
    from multiact.cli import commands as cli

    with pytest.raises(SystemExit, match=message):
        cli.main(["check", "--exhaustive", "--stride", str(1 << 20), "--no-progress", *argv])


def test_cli_runs_every_isa(capsys):
    """The whole command on a sparse stride: the reference's distance, one table per ISA."""
    from multiact.cli import commands as cli

    assert cli.main(["check", "--exhaustive", "--stride", str(1 << 22), "--op", "relu,silu", "--workers", "1",
                     "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert "reference: numba float64 kernels, within" in text
    for isa in native.info()["isas"]:
        assert f"## ISA {isa}" in text
    assert "| silu | " in text.split("## Largest error over every ISA")[1]


def test_the_float16_table_judges_every_input_and_catches_an_ulp():
    from multiact.backend import native_backend
    from multiact.cli import half_table

    isas = native_backend.info()["isas"]
    rows = half_table.rows(["gelu", "relu6"], isas)
    assert {r["isa"] for r in rows} == set(isas) and all(r["points"] >= 63488 for r in rows)
    assert all(r["special_miss"] == 0 and r["max_ulp"] <= 0.51 for r in rows), rows
    x = np.array([0.3, 1.5, 70000.0, np.inf], np.float64)
    ref = x * 2  # 0.6, 3.0, overflow, inf
    got = ref.astype(np.float16)
    got[1] = np.nextafter(np.nextafter(got[1], np.float16(9)), np.float16(9))  # two ulps up
    j = half_table._judge(x.astype(np.float16), got, ref, np.zeros(4))
    assert j["max_ulp"] == 2.0 and j["worst_x"] == 1.5 and j["over_1"] == 1 and j["special_miss"] == 0
    got[2] = np.float16(65504)  # an overflow must stay inf
    assert half_table._judge(x.astype(np.float16), got, ref, np.zeros(4))["special_miss"] == 1
    assert "| gelu | 0.5 |" in half_table.render(rows)
