"""The `multiact` command: info, check, bench and demo, their text and JSON outputs and failure paths."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys

import numpy as np
import pytest

import multiact as ma
from multiact import registry
from multiact.cli import bench, peers, selfcheck
from multiact.cli.commands import main


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
    bf16 = {"bfloat16"} if importlib.util.find_spec("ml_dtypes") else set()  # named only where it can exist
    assert set(info["default_backend"]) == {"float16", "float32", "float64"} | bf16


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
        cases = [("forward", (x,)), ("backward", (dy, x)), ("forward_backward", (dy, x))]
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
                got = b.alloc()
            if direction == "forward_backward":  # (y, dx) from the two formulas, or autograd's dx
                got = got[-1] if isinstance(got, tuple) else got
            got = np.asarray(got)
            np.testing.assert_allclose(got, want, rtol=2e-3, atol=2e-3, err_msg=f"{peer} {opname} {direction}")
            if b.into is not None:
                b.into()
                np.testing.assert_allclose(out, want, rtol=2e-3, atol=2e-3, err_msg=f"{peer} {opname} {direction} out")


def test_a_peer_that_ignores_a_parameter_is_not_timed(monkeypatch):
    """At non-default parameters a peer's forward is checked first: one that ignores the parameter (as torch's
    F.selu has no alpha) says so instead of timing another function."""
    monkeypatch.setattr(peers, "_reproduces", {})
    op = bench.parse_op("leaky_relu:negative_slope=0.2")
    x = np.linspace(-3, 3, 64, dtype=np.float32)
    assert not isinstance(bench.bind("peer:numpy", op, "forward", (x,), np.empty_like(x), 1), str)
    monkeypatch.setattr(peers, "_reproduces", {})
    monkeypatch.setitem(peers._NUMPY_FWD, "leaky_relu", lambda x, p, out=None: np.where(x > 0, x, 0.01 * x))
    why = bench.bind("peer:numpy", op, "forward", (x,), np.empty_like(x), 1)
    assert why == "no peer: numpy's leaky_relu does not take negative_slope=0.2"
    assert peers.reproduces("numpy", "leaky_relu", {"negative_slope": 0.01}) is None  # the defaults: as tested above


def test_bench_plot_writes_png(tmp_path):
    pytest.importorskip("matplotlib")
    res = bench.run([bench.parse_op("relu"), bench.parse_op("silu")], sizes=[512, 2048], peers=["numpy"],
                    backends=["numpy"], samples=3, budget_s=0.2, resample=0)
    path = tmp_path / "p.png"
    rows = res["rows"]
    rows[1].flags["noisy"] = "test: drawn hollow"
    bench.plot(rows, str(path))  # time per call, the default
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000
    bench.plot([r for r in rows if (r.op, r.direction) == ("relu", "forward")], str(tmp_path / "g.png"),
               metric="gbps")  # one panel: enough to draw the other axis
    assert (tmp_path / "g.png").read_bytes() != path.read_bytes()
    with pytest.raises(ValueError, match="metric must be 'time' or 'gbps'"):
        bench.plot(rows, str(path), metric="flops")


def test_without_optional_extras(capsys, monkeypatch):
    """No tqdm: a plain progress line; no matplotlib: --plot refused before timing anything."""
    import importlib.util as iu

    from multiact.cli import _report

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


# ---- bench under load: warnings, noisy rows, ratios with ranges, below-copy figures ---------------------------

def _fake_load(monkeypatch, over: float) -> int:
    """The 1-minute load average set to (usable CPUs + over); returns the CPU count."""
    import os

    from multiact.cli import sysinfo

    ncpu = sysinfo.cpu()["usable_cpus"]
    monkeypatch.setattr(os, "getloadavg", lambda: (ncpu + over, 1.0, 1.0))
    return ncpu


def test_bench_warns_when_the_load_reaches_the_cores(capsys, tmp_path, monkeypatch):
    ncpu = _fake_load(monkeypatch, 0.0)  # at the core count: warned
    path = tmp_path / "b.json"
    rc, out, err = run(capsys, "bench", "--op", "relu", "--size", "1K", "--direction", "forward", "--peers", "none",
                       "--backend", "numpy", "--samples", "3", "--json", str(path), "--no-progress")
    assert rc == 0
    assert f"WARNING: load average {ncpu:.2f} >= {ncpu} usable CPU" in err
    head = out.splitlines()
    assert head[0].startswith("# CPU: ") and head[1].startswith(f"# WARNING: load average {ncpu:.2f}")
    meta = json.loads(path.read_text())["meta"]
    assert meta["warnings"] == [head[1][2:]] and f"{ncpu:.2f} before the run, {ncpu:.2f} after," in head[1]
    rc, again, _ = run(capsys, "bench", "--load", str(path))  # a saved run keeps its warnings
    assert again.splitlines()[1] == head[1]
    _fake_load(monkeypatch, -0.5)  # below: nothing said
    rc, out, err = run(capsys, "bench", "--op", "relu", "--size", "1K", "--direction", "forward", "--peers", "none",
                       "--backend", "numpy", "--samples", "3", "--no-progress")
    assert rc == 0 and "WARNING" not in out + err
    assert bench.load_warning({"load_average": [3.0], "usable_cpus": 4}) is None
    assert "4.00 >= 4 usable CPUs" in bench.load_warning({"load_average": [4.0], "usable_cpus": 4})
    assert "4.50 before the run, 3.00 after, >= 4" in bench.load_warning({"load_average": [3.0], "usable_cpus": 4},
                                                                         [4.5])
    saved = json.loads(path.read_text())  # a file saved before warnings were recorded: its load says it
    del saved["meta"]["warnings"]
    path.write_text(json.dumps(saved))
    rc, again, _ = run(capsys, "bench", "--load", str(path))
    assert again.splitlines()[1] == head[1]


def _scripted_timing(monkeypatch, script):
    """bench.time_interleaved replaced: call k returns script(k, i) seconds per call for function i's samples."""
    calls = []

    def fake(fns, samples=7, sample_s=2e-3, budget_s=3.0):
        calls.append(len(fns))
        return [(list(script(len(calls), i)), 10) for i in range(len(fns))]

    monkeypatch.setattr(bench, "time_interleaved", fake)
    return calls


def _labels(n_backends=1):
    return [("copy", "baseline", "out", "")] + [(f"b{i}", "backend", "alloc", "") for i in range(n_backends)] + [
        ("torch", "peer", "alloc", "")]


_META = dict(op="relu", direction="forward", dtype="float32", size=1 << 24, threads=1, bytes=8 << 24)
_STEADY = (1.0, 1.0, 1.0, 1.0, 1.0)
_NOISY = (1.0, 1.0, 2.0, 5.0, 9.0)  # IQR 4 over a median of 2


def test_bench_noisy_rows_are_resampled_then_flagged(monkeypatch):
    # noisy every time: timed 1 + 2 times, then flagged, with the try count
    calls = _scripted_timing(monkeypatch, lambda k, i: _NOISY if i == 1 else _STEADY)
    rows = bench.timed_rows([None] * 3, _labels(), _META, resample=2, max_spread=0.25)
    assert len(calls) == 3
    copy, ours, peer = rows
    assert ours.flags.keys() == {"noisy"} and "IQR 200%" in ours.flags["noisy"] and "after 3 timings" in ours.flags[
        "noisy"]
    assert not copy.flags and not peer.flags and {r.attempts for r in rows} == {3}
    # the ratio comes with the range the quartiles allow, and it holds the ratio
    lo, hi = ours.speedup_range
    assert lo <= ours.speedup <= hi and (lo, hi) == (1.0 / 5.0, 1.0 / 1.0)
    # quiet on the second try: that try is kept, nothing flagged
    calls = _scripted_timing(monkeypatch, lambda k, i: _NOISY if (k, i) == (1, 1) else _STEADY)
    rows = bench.timed_rows([None] * 3, _labels(), _META, resample=2, max_spread=0.25)
    assert len(calls) == 2 and not any(r.flags for r in rows) and rows[1].attempts == 2
    # --resample 0: one try
    calls = _scripted_timing(monkeypatch, lambda k, i: _NOISY if i == 1 else _STEADY)
    bench.timed_rows([None] * 3, _labels(), _META, resample=0, max_spread=0.25)
    assert len(calls) == 1


def test_bench_flags_figures_below_the_copy_with_the_reason(monkeypatch):
    fast = lambda k, i: tuple(v * (0.5 if i == 1 else 1.0) for v in _STEADY)  # noqa: E731
    _scripted_timing(monkeypatch, fast)
    monkeypatch.setattr(bench, "cache_sizes", lambda: {1: 32 << 10, 2: 512 << 10, 3: 32 << 20})
    rows = bench.timed_rows([None] * 3, _labels(), _META)  # 128 MiB: beyond the cache
    why = rows[1].flags[bench.BELOW_COPY]
    assert bench.BELOW_COPY == "below copy (streaming stores / cache)"
    assert why.startswith("streaming stores") and "read-for-ownership" in why and "noise" not in why
    assert not rows[2].flags and rows[1].vs_copy == 0.5
    small = {**_META, "size": 1024, "bytes": 8 << 10}
    why = bench.timed_rows([None] * 3, _labels(), small)[1].flags[bench.BELOW_COPY]
    assert why.startswith("cache: its 8 KiB read + written fit in the 512 KiB L2 cache")
    middle = {**_META, "size": 1 << 20, "bytes": 8 << 20}
    why = bench.timed_rows([None] * 3, _labels(), middle)[1].flags[bench.BELOW_COPY]
    assert why.startswith("cache or streaming stores: its 8 MiB read + written may fit in the 32 MiB last-level")
    # a noisy copy: the reason says noise may be it
    _scripted_timing(monkeypatch, lambda k, i: _NOISY if i == 0 else tuple(0.5 * v for v in _STEADY))
    why = bench.timed_rows([None] * 3, _labels(), _META, resample=0)[1].flags[bench.BELOW_COPY]
    assert "or noise (IQR 0%, the copy's 200%)" in why


def test_bench_table_shows_flags_and_ranges(capsys, monkeypatch):
    _fake_load(monkeypatch, -0.5)
    monkeypatch.setattr(bench, "cache_sizes", lambda: {2: 512 << 10, 3: 32 << 20})
    _scripted_timing(monkeypatch, lambda k, i: _NOISY if i == 1 else tuple(0.5 * v for v in _STEADY) if i == 2
                     else _STEADY)
    rc, out, err = run(capsys, "bench", "--op", "relu", "--size", "1K", "--direction", "forward", "--peers", "numpy",
                       "--backend", "numpy", "--resample", "1", "--max-spread", "30", "--no-progress")
    assert rc == 0, err
    ours = next(line for line in out.splitlines() if "ma:numpy" in line)
    peer = next(line for line in out.splitlines() if "np formula" in line)
    assert ours.rstrip().endswith("noisy") and "200%" in ours and "0.25x [0.1, 0.5]" in ours
    assert peer.rstrip().endswith(bench.BELOW_COPY) and "0.5 [0.5, 0.5]" in peer
    assert "noisy: 1 row(s) with an IQR over 30% of the median, after timing the configuration again up to 1 times" \
        in out
    assert f"{bench.BELOW_COPY}: faster than the copy of the same bytes" in out
    assert "relu fwd float32 1K np formula: cache: " in out
    rc, out, err = run(capsys, "bench", "--op", "relu", "--resample", "-1")
    assert rc == 2 and "--resample must be 0 or more" in err


def test_bench_load_of_an_older_file_gets_ranges_and_flags(monkeypatch):
    """A --json saved before ranges and flags were recorded: --load derives them from the file's own rows."""
    _scripted_timing(monkeypatch, lambda k, i: _NOISY if i == 1 else _STEADY)
    rows = bench.timed_rows([None] * 3, _labels(), _META, resample=0)
    old = []
    for r in rows:
        d = r.as_dict()
        for k in ("copy_q", "best_peer_q", "flags", "attempts", "vs_copy_range", "speedup_range"):
            d.pop(k)
        old.append(bench.Row.from_dict(d))
    assert old[1].speedup_range is None and not old[1].flags
    bench.relink(old)
    assert old[1].speedup_range == rows[1].speedup_range and old[1].flags.keys() == {"noisy"}
    assert old[1].vs_copy_range == rows[1].vs_copy_range


def test_bench_under_a_real_busy_loop(capsys, tmp_path):
    """`multiact bench` beside a busy loop pinned to the one CPU it may use: it completes, flags rows exactly
    where their IQR is over the limit, and warns exactly when the load average reaches that one CPU.  (The load
    average follows a busy loop only over tens of seconds, so whether it warns here depends on the machine;
    the warning's own test fakes the load.)"""
    import os

    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("no sched_setaffinity on this platform")
    mine = os.sched_getaffinity(0)
    cpu = min(mine)
    path = tmp_path / "b.json"
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        os.sched_setaffinity(busy.pid, {cpu})
        os.sched_setaffinity(0, {cpu})
        rc, out, err = run(capsys, "bench", "--op", "relu", "--size", "1K,64K", "--direction", "forward", "--peers",
                           "numpy", "--backend", "numpy", "--threads", "1", "--samples", "5", "--resample", "1",
                           "--json", str(path), "--no-progress")
    finally:
        os.sched_setaffinity(0, mine)
        busy.kill()
        busy.wait()
    assert rc == 0, err
    rep = json.loads(path.read_text())
    rows = rep["rows"]
    assert len(rows) == 6 and rep["meta"]["cpu"]["usable_cpus"] == 1
    for r in rows:
        assert ("noisy" in r["flags"]) == (r["spread"] > bench.MAX_SPREAD), r
    lines = [line for line in out.splitlines() if " ma:numpy " in line or " copy " in line or " np formula" in line]
    assert sum("noisy" in line for line in lines) == sum("noisy" in r["flags"] for r in rows)
    said = rep["meta"]["warnings"]
    assert bool(said) == any(load >= 1 for load in (rep["meta"]["load_before"][0], rep["meta"]["load_after"][0]))
    assert all(f"# {w}" in out and w in err for w in said)


# ---- demo -------------------------------------------------------------------------

def test_demo(capsys):
    rc, out, _ = run(capsys, "demo", "--size", "4K")
    assert rc == 0
    assert "gelu" in out and "backward" in out and "within tolerance" in out
    chosen = registry.select("gelu", "forward", "float32", "numpy")[0].NAME
    assert f"gelu     forward    {chosen}" in out


def test_a_printed_range_holds_its_printed_ratio():
    """The range is rounded outward, so 2 significant digits never put the printed ratio outside it."""
    from multiact.cli.commands import _ratio

    assert _ratio(0.101, (0.1005, 0.1014), "x") == "0.101x [0.1, 0.11]"
    assert _ratio(0.3, (0.3, 0.3), "x") == "0.3x [0.3, 0.3]"
    assert _ratio(7.12, (6.5, 7.9), "x") == "7.12x [6.5, 7.9]"
