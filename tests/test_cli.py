"""The `multiact` command: info, check, bench and demo, their text and JSON outputs and failure paths."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
import pytest

import multiact as ma
from multiact import registry
from multiact.tools import bench, peers, selfcheck
from multiact.tools.cli import main


def run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


# ---- info -------------------------------------------------------------------------

def test_info_json(capsys):
    rc, out, _ = run(capsys, "info", "--json")
    assert rc == 0
    info = json.loads(out)
    assert [b["name"] for b in info["backends"]] == list(registry.BACKEND_NAMES)
    numpy_b = next(b for b in info["backends"] if b["name"] == "numpy")
    assert numpy_b["available"] is True and numpy_b["reason"]
    for b in info["backends"]:
        assert isinstance(b["available"], bool) and isinstance(b["reason"], str) and b["reason"]
    assert info["libraries"]["numpy"] == np.__version__
    assert info["threads"]["num_threads"] == ma.get_num_threads()
    assert set(info["threads"]["env"]) >= {"MULTIACT_NUM_THREADS", "MULTIACT_BACKEND"}
    assert info["cpu"]["arch"] and info["cpu"]["usable_cpus"] >= 1
    assert set(info["default_backend"]) == {"float16", "float32", "float64"}


def test_info_text_names_every_backend_and_reason(capsys):
    rc, out, _ = run(capsys, "info")
    assert rc == 0
    flat = " ".join(out.split())  # long reasons are wrapped under the table
    for b in ma.backends():
        assert b.name in out and " ".join(b.reason.split()) in flat
    assert "Threads:" in out and "numpy " + np.__version__ in out


def test_python_dash_m_runs_the_same_command():
    res = subprocess.run([sys.executable, "-m", "multiact", "info"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "backend" in res.stdout and "numpy" in res.stdout


def test_no_command_prints_help(capsys):
    rc, out, _ = run(capsys)
    assert rc == 2 and "info" in out and "bench" in out


# ---- check ------------------------------------------------------------------------

def test_check_passes_and_writes_json(capsys, tmp_path):
    path = tmp_path / "check.json"
    rc, out, _ = run(capsys, "check", "--backend", "numpy", "--op", "relu,sigmoid", "--dtype", "float32",
                     "--json", str(path), "--no-progress")
    assert rc == 0, out
    assert "PASSED" in out and "sigmoid[defaults]" in out
    rep = json.loads(path.read_text())
    assert rep["passed"] is True and rep["backends"] == ["numpy"] and rep["failures"] == []
    # relu: forward, backward, backward_y; sigmoid the same: 6 rows in float32
    assert len(rep["rows"]) == 6 and rep["counts"]["pass"] == 6
    row = rep["rows"][0]
    fields = {"backend", "op", "case", "direction", "dtype", "status", "max_ulp", "max_abs", "bad_kinds", "vs"}
    assert fields <= set(row)
    assert {r["direction"] for r in rep["rows"]} == {"forward", "backward", "backward_y"}


def test_check_json_to_stdout_keeps_stdout_parseable(capsys):
    rc, out, err = run(capsys, "check", "--backend", "numpy", "--op", "relu", "--dtype", "float16", "--json", "-",
                       "--no-progress")
    assert rc == 0
    assert json.loads(out)["passed"] is True
    assert "PASSED" in err  # the table went to stderr


def _broken_sigmoid(monkeypatch):
    """The numpy backend's sigmoid forward replaced by one that is slightly off and loses NaN."""
    mod = registry.module("numpy")
    real = mod.kernel

    def kernel(op, direction, dtype):
        k = real(op, direction, dtype)
        if (op, direction) != ("sigmoid", "forward"):
            return k

        def wrong(x, out, p):
            k(x, out, p)
            out *= out.dtype.type(1.001)
            np.nan_to_num(out, copy=False, nan=0.0)

        return wrong

    monkeypatch.setattr(mod, "kernel", kernel)
    registry.clear_cache()


def test_check_fails_clearly_on_a_wrong_kernel(capsys, tmp_path, monkeypatch):
    path = tmp_path / "check.json"
    try:
        with monkeypatch.context() as m:
            _broken_sigmoid(m)
            rc, out, _ = run(capsys, "check", "--backend", "numpy", "--op", "sigmoid,tanh", "--dtype", "float32",
                             "--json", str(path), "--no-progress")
    finally:
        registry.clear_cache()
    assert rc == 1
    assert "FAILED" in out and "FAIL (1)" in out
    assert "numpy sigmoid[defaults] forward float32" in out
    rep = json.loads(path.read_text())
    assert rep["passed"] is False
    (fail,) = rep["failures"]
    assert (fail["op"], fail["direction"], fail["status"]) == ("sigmoid", "forward", "FAIL")
    assert "NaN" in fail["bad_kinds"] and "ordinary" in fail["bad_kinds"]
    assert fail["n_bad"] > 100 and fail["bad"]
    # tanh and sigmoid's backward were not touched
    assert all(r["status"] == "pass" for r in rep["rows"] if r is not None and (r["op"], r["direction"]) !=
               ("sigmoid", "forward"))


def test_check_reports_an_unavailable_backend(capsys, monkeypatch):
    monkeypatch.setitem(registry._avail, "cuda", (False, "test: no NVIDIA driver"))
    rc, out, _ = run(capsys, "check", "--backend", "numpy,cuda", "--op", "relu", "--dtype", "float32",
                     "--no-progress")
    assert rc == 0
    assert "cuda: skipped (not available: test: no NVIDIA driver)" in out
    rc, out, _ = run(capsys, "check", "--backend", "cuda", "--op", "relu", "--no-progress")
    assert rc == 1 and "no backend to check" in out


def test_check_cross_compares_backends(monkeypatch):
    """Two backends on the same inputs (here the numpy backend under a second name): compared both ways."""
    monkeypatch.setitem(registry._modules, "ascend", registry.module("numpy"))
    monkeypatch.setitem(registry._avail, "ascend", (True, "test: numpy under another name"))
    try:
        rep = selfcheck.run(backends=["numpy", "ascend"], ops=["tanh"], dtypes=["float32"])
    finally:
        registry.clear_cache()
    assert rep["passed"] and {r.backend for r in rep["rows"]} == {"numpy", "ascend"}
    for r in rep["rows"]:
        other = "ascend" if r.backend == "numpy" else "numpy"
        assert r.vs == {other: 0.0} and r.vs_ulp == {other: 0.0}


def test_check_rejects_unknown_names(capsys):
    rc, _, err = run(capsys, "check", "--op", "nosuchop")
    assert rc == 2 and "unknown op 'nosuchop'" in err
    rc, _, err = run(capsys, "check", "--backend", "nosuch")
    assert rc == 2 and "unknown backend" in err


def test_ulp_between():
    a = np.array([1.0, np.nan, np.inf, 0.0, 1e-40], dtype=np.float32)
    assert selfcheck.ulp_between(a, a.copy()) == 0.0
    b = a.copy()
    b[0] = np.nextafter(b[0], np.float32(2))
    assert selfcheck.ulp_between(a, b) == 1.0
    b = a.copy()
    b[4] = 0.0  # flushed subnormal: tolerated
    assert selfcheck.ulp_between(a, b) == 0.0
    b[1] = 1.0
    assert selfcheck.ulp_between(a, b) == float("inf")


# ---- bench ------------------------------------------------------------------------

def test_bench_tiny_json_and_table(capsys, tmp_path):
    path = tmp_path / "bench.json"
    rc, out, _ = run(capsys, "bench", "--op", "relu,gelu:approximate=tanh", "--size", "1K,3000", "--peers", "numpy",
                     "--backend", "numpy", "--out", "--samples", "3", "--json", str(path), "--no-progress")
    assert rc == 0
    assert "ma:numpy" in out and "np formula" in out and "gelu(approximate=tanh)" in out
    rep = json.loads(path.read_text())
    rows = rep["rows"]
    assert {r["impl"] for r in rows} == {"copy", "numpy"}
    assert {(r["kind"], r["mode"]) for r in rows} == {("baseline", "out"), ("backend", "alloc"), ("backend", "out"),
                                                       ("peer", "alloc"), ("peer", "out")}
    assert {r["size"] for r in rows} == {1024, 3000}
    for r in rows:
        streams = 2 if r["direction"] == "forward" else 3
        assert r["bytes"] == streams * r["size"] * 4
        assert r["q1_s"] <= r["median_s"] <= r["q3_s"] and len(r["samples"]) >= 3
        assert r["gb_per_s"] > 0 and r["vs_copy"] > 0
        if r["kind"] == "backend":
            assert r["speedup_vs_best_peer"] > 0
    assert rep["meta"]["cpu"]["arch"] and rep["missing_peers"] == {}
    rc, again, _ = run(capsys, "bench", "--load", str(path))  # a saved run shows the same table
    table_part = again.split("\n\n")[0]
    assert rc == 0 and "ma:numpy" in table_part and out.startswith(table_part)


def test_bench_backward_y_starts_from_the_output(capsys, tmp_path):
    """backward_y rows exist only where the op has a y-form; they time our y= call against torch's y-form."""
    path = tmp_path / "b.json"
    rc, out, _ = run(capsys, "bench", "--op", "sigmoid,gelu", "--size", "1K", "--peers", "torch", "--direction",
                     "backward_y", "--backend", "numpy", "--samples", "3", "--json", str(path), "--no-progress")
    assert rc == 0 and "bwd_y" in out
    rows = json.loads(path.read_text())["rows"]
    assert rows and {r["op"] for r in rows} == {"sigmoid"} and {r["direction"] for r in rows} == {"backward_y"}
    if peers.available("torch")[0]:
        assert any(r["impl"] == "torch" and not r.get("note") for r in rows)
    rc, _, err = run(capsys, "bench", "--op", "relu", "--direction", "sideways", "--no-progress")
    assert rc != 0 and "backward_y" in err


def test_bench_wide_table_says_which_peer_rows_start_from_y(capsys):
    if not peers.available("torch")[0]:
        pytest.skip("torch is not installed")
    rc, out, _ = run(capsys, "bench", "--op", "sigmoid,relu", "--size", "1K", "--direction", "backward", "--peers",
                     "torch", "--backend", "numpy", "--samples", "3", "--wide", "--no-progress")
    assert rc == 0 and "torch backward from y: sigmoid\n" in out


def test_bench_wide_table(capsys):
    rc, out, _ = run(capsys, "bench", "--op", "relu", "--size", "1K", "--peers", "numpy", "--backend", "numpy",
                     "--samples", "3", "--wide", "--no-progress")
    assert rc == 0
    cpu_line, *lines = out.splitlines()  # the first line names the CPU (tests/test_sysinfo.py)
    assert cpu_line.startswith("# CPU: ")
    header, rule, *rows = [line for line in lines if not line.startswith("# WARNING")]  # a loaded machine says so
    assert header.split()[:6] == ["op", "dir", "dtype", "size", "thr", "mode"] and "ma:numpy" in header
    assert rows[0].split()[:4] == ["relu", "fwd", "float32", "1K"]
    ratio = re.search(r"([0-9.e+-]+)x \[([0-9.e+-]+), ([0-9.e+-]+)\]", rows[0])  # never a ratio without its range
    assert ratio and float(ratio[2]) <= float(ratio[1]) <= float(ratio[3]), rows[0]


def test_bench_reports_missing_peers(capsys, tmp_path, monkeypatch):
    real = peers._find_spec
    monkeypatch.setattr(peers, "_find_spec", lambda name: None if name == "torch" else real(name))
    path = tmp_path / "b.json"
    rc, out, _ = run(capsys, "bench", "--op", "relu", "--size", "1K", "--peers", "torch,numpy", "--direction",
                     "forward", "--samples", "3", "--json", str(path), "--no-progress")
    assert rc == 0
    assert "peer torch: missing, not installed (torch missing" in out
    rep = json.loads(path.read_text())
    assert "torch" in rep["missing_peers"] and all(r["impl"] != "torch" for r in rep["rows"])


def test_bench_says_when_a_peer_lacks_an_op(capsys):
    rc, out, _ = run(capsys, "bench", "--op", "fast_gelu", "--size", "1K", "--peers", "numpy,onnxruntime",
                     "--backend", "numpy", "--samples", "3", "--no-progress")
    assert rc == 0
    if peers.available("onnxruntime")[0]:
        assert "onnxruntime: no peer: onnxruntime has no fast_gelu forward" in out


@pytest.mark.parametrize("peer", peers.PEERS)
def test_every_peer_computes_the_same_function(peer):
    """A wrong peer formula would make the comparison meaningless (exact kinks avoided: conventions differ there;
    e.g. PyTorch 2.13's hardswish backward is 0 at -3 and dy at +3)."""
    if not peers.available(peer)[0]:
        pytest.skip(f"{peer}: {peers.available(peer)[1]}")
    x = np.linspace(-6, 6, 301, dtype=np.float32) + np.float32(0.013)
    dy = np.cos(x).astype(np.float32)
    for opname in ma.ops():
        op = bench.parse_op(opname)
        params = op.call_params(x.dtype)
        cases = [("forward", (x,)), ("backward", (dy, x))]
        if ma.ops()[opname].backward_y is not None:
            cases.append(("backward_y", (dy, ma.forward(opname, x, **params))))
        for direction, arrays in cases:
            out = np.zeros_like(x)
            b = bench.bind(f"peer:{peer}", op, direction, arrays, out, 1)
            if isinstance(b, str):
                assert "no peer" in b
                continue
            want = ma.forward(opname, x, **params) if direction == "forward" else ma.backward(opname, dy, x, **params)
            with np.errstate(all="ignore"):
                got = np.asarray(b.alloc())
            np.testing.assert_allclose(got, want, rtol=2e-3, atol=2e-3, err_msg=f"{peer} {opname} {direction}")
            if b.into is not None:
                b.into()
                np.testing.assert_allclose(out, want, rtol=2e-3, atol=2e-3, err_msg=f"{peer} {opname} {direction} out")


def test_bench_plot_writes_png(tmp_path):
    pytest.importorskip("matplotlib")
    res = bench.run([bench.parse_op("relu"), bench.parse_op("silu")], sizes=[512, 2048], peers=["numpy"],
                    backends=["numpy"], samples=3, budget_s=0.2)
    path = tmp_path / "p.png"
    bench.plot(res["rows"], str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000


def test_without_optional_extras(capsys, monkeypatch):
    """No tqdm: a plain progress line; no matplotlib: --plot refused before timing anything."""
    import importlib.util as iu

    from multiact.tools import _report

    monkeypatch.setitem(sys.modules, "tqdm", None)  # import tqdm -> ImportError
    seen = list(_report.progress(range(3), 3, "work", stream=sys.stdout))
    assert seen == [0, 1, 2] and "work: 3/3" in capsys.readouterr().out
    real = iu.find_spec
    monkeypatch.setattr(iu, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    rc, out, err = run(capsys, "bench", "--op", "relu", "--size", "1K", "--plot", "x.png")
    assert rc == 2 and "--plot needs matplotlib" in err and out == ""


def test_bench_parsing():
    assert bench.parse_size("1K") == 1024 and bench.parse_size("16M") == 1 << 24 and bench.parse_size("3000") == 3000
    assert bench.size_label(1 << 24) == "16M" and bench.size_label(3000) == "3000"
    with pytest.raises(ValueError, match="bad size"):
        bench.parse_size("lots")
    op = bench.parse_op("softplus:beta=2:threshold=5")
    assert dict(op.params) == {"beta": 2.0, "threshold": 5.0} and op.label == "softplus(beta=2.0,threshold=5.0)"
    assert bench.parse_op("gelu").label == "gelu"
    with pytest.raises(ValueError, match="must be"):
        bench.parse_op("softplus:beta=-1")


def test_bench_rejects_bad_arguments(capsys):
    rc, _, err = run(capsys, "bench", "--peers", "tensorflow")
    assert rc == 2 and "unknown peer 'tensorflow'" in err
    rc, _, err = run(capsys, "bench", "--size", "0")
    assert rc == 2 and "bad size" in err


def test_bench_first_call_compilation_is_not_timed(monkeypatch):
    """A backend whose first call is slow (a JIT compiling) is warmed up on a small array first."""
    import time

    mod = registry.module("numpy")
    real, first = mod.kernel, []

    def kernel(op, direction, dtype):
        k = real(op, direction, dtype)

        def slow_once(*args):
            if not first:
                first.append(1)
                time.sleep(0.6)
            return k(*args)

        return slow_once

    monkeypatch.setattr(mod, "kernel", kernel)
    registry.clear_cache()
    try:
        res = bench.run([bench.parse_op("relu")], sizes=[1024], directions=["forward"], peers=[],
                        backends=["numpy"], samples=3, budget_s=0.2)
    finally:
        registry.clear_cache()
    (row,) = [r for r in res["rows"] if r.kind == "backend"]
    assert first and max(row.samples) < 0.3


def test_bench_restores_thread_setting():
    before = ma.get_num_threads()
    bench.run([bench.parse_op("relu")], sizes=[256], threads=[1], directions=["forward"], peers=[],
              backends=["numpy"], samples=3, budget_s=0.1)
    assert ma.get_num_threads() == before


# ---- demo -------------------------------------------------------------------------

def test_demo(capsys):
    rc, out, _ = run(capsys, "demo", "--size", "4K")
    assert rc == 0
    assert "gelu" in out and "backward" in out and "within tolerance" in out
    chosen = registry.select("gelu", "forward", "float32", "numpy")[0].NAME
    assert f"gelu     forward    {chosen}" in out
