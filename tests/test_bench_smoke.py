"""The pytest-benchmark suite runs: one of its functions, called once with a stand-in for the fixture."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

import multiact as ma
from multiact.cli import bench, peers
from multiact.cli.commands import main

BENCH_DIR = Path(__file__).resolve().parent.parent / "benchmarks"


class OnceNoTiming:
    """Stands in for pytest-benchmark's `benchmark` fixture: calls the function once."""

    def __init__(self):
        self.extra_info: dict = {}
        self.calls = 0

    def __call__(self, fn, *args, **kwargs):
        self.calls += 1
        return fn(*args, **kwargs)


def _load(name: str):
    sys.path.insert(0, str(BENCH_DIR))
    try:
        spec = importlib.util.spec_from_file_location(f"_bench_{name}", BENCH_DIR / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    finally:
        sys.path.remove(str(BENCH_DIR))


def test_benchmark_function_runs_once():
    ops = _load("test_ops")
    arrays = {}

    def get(dtype, size):
        x = np.linspace(-4, 4, size, dtype=dtype)
        return arrays.setdefault((dtype, size), (x, np.ones_like(x), np.empty_like(x)))

    for mode in ("alloc", "out"):
        b = OnceNoTiming()
        ops.test_activation(b, get, "gelu", "backward", "backend:numpy", mode, "float32", 256)
        assert b.calls == 1 and b.extra_info["bytes"] == 3 * 256 * 4
    x, dy, out = get("float32", 256)
    import multiact as ma

    np.testing.assert_array_equal(out, ma.gelu_grad(dy, x, backend="numpy"))


def test_benchmark_parameters_cover_backends_and_peers():
    cfg = _load("bench_config")
    assert "backend:numpy" in cfg.IMPLS and cfg.OPS and cfg.SIZES


# ---- multiact bench's modes: the fused bias_act against torch's unfused code, and --framework torch ----------

needs_torch = pytest.mark.skipif(not peers.available("torch")[0], reason="torch is not installed")


def _bench_json(capsys, tmp_path, *argv: str) -> tuple[str, dict]:
    path = tmp_path / "b.json"
    with ma.use("numpy"):  # numba's first call of each fused kernel would compile for seconds
        rc = main(["bench", *argv, "--threads", "1", "--samples", "3", "--resample", "0", "--json", str(path),
                   "--no-progress"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    return out, json.loads(path.read_text())


@needs_torch
def test_bench_bias_act_against_unfused_torch(capsys, tmp_path):
    out, rep = _bench_json(capsys, tmp_path, "--op", "bias_act:act=gelu:approximate=tanh", "--size",
                           "4K", "--direction", "forward,backward,forward_backward", "--backend", "numpy",
                           "--peers", "torch")
    rows = rep["rows"]
    # both layouts: dim=1 of an NCHW array and dim=-1
    assert {r["op"] for r in rows} == {f"bias_act(gelu(approximate=tanh),dim={d})" for d in (1, -1)}
    assert {tuple(r["shape"]) for r in rows} == {(1, 64, 8, 8), (1, 4096)}
    assert {r["direction"] for r in rows} == {"forward", "backward", "forward_backward"}
    ours = [r for r in rows if r["kind"] == "backend"]
    assert len(ours) == 6 and all(r["speedup_vs_best_peer"] > 0 for r in ours)
    for r in ours:
        lo, hi = r["speedup_range"]
        assert lo <= r["speedup_vs_best_peer"] <= hi
    notes = {r["direction"]: r["note"] for r in rows if r["impl"] == "torch"}
    assert notes == {"forward": "unfused", "backward": "unfused, from saved z", "forward_backward": "unfused, autograd"}
    assert "bias_act(gelu(approximate=tanh),dim=-1)" in out


def test_bench_bias_act_options_are_checked_through_its_definition(capsys):
    for spec, msg in (("bias_act:act=nosuch", "valid: linear,"), ("bias_act:act=relu:dim=2", "dim=1 (NCHW) or dim=-1"),
                      ("bias_act:act=relu:beta=2", "unexpected keyword argument 'beta'"),
                      ("bias_act:act=relu:clamp=-1", "'clamp'")):
        rc = main(["bench", "--op", spec, "--size", "4K", "--no-progress"])
        _, err = capsys.readouterr()
        assert rc == 2 and msg in err, (spec, err)
    rc = main(["bench", "--op", "bias_act:act=relu", "--size", "3000", "--no-progress"])
    assert rc == 2 and "power of two" in capsys.readouterr().err
    assert [c.label for c in bench.parse_ops("bias_act:act=leaky_relu:negative_slope=0.2:gain=1.5")] == [
        f"bias_act(leaky_relu(negative_slope=0.2),gain=1.5,dim={d})" for d in (1, -1)]
    assert bench.bias_act_shape(1 << 24, 1) == (64, 64, 64, 64) and bench.bias_act_shape(1 << 24, -1) == (4096, 4096)


@needs_torch
@pytest.mark.parametrize("spec", ["bias_act:act=relu:dim=1", "bias_act:act=sigmoid:dim=-1", "bias_act:dim=-1",
                                  "bias_act:act=leaky_relu:negative_slope=0.2:gain=1.4:clamp=1:dim=1"])
def test_bias_act_peer_computes_the_same(spec):
    """torch's unfused peer and ma.bias_act agree (a wrong peer would make the ratios meaningless); sigmoid's
    torch backward starts from y."""
    (case,) = bench.parse_ops(spec)
    p = dict(case.params)
    rng = np.random.default_rng(1)
    shape = bench.bias_act_shape(4096, p["dim"])
    x = rng.standard_normal(shape).astype(np.float32)
    dy = rng.standard_normal(shape).astype(np.float32)
    b = np.linspace(-0.5, 0.5, shape[p["dim"]]).astype(np.float32)
    kw = {"dim": p["dim"], "gain": p["gain"], "clamp": p["clamp"], "backend": "numpy", **case.act_params()}
    want_y = ma.bias_act(x, b, p["act"], **kw)
    want_dx, want_db = ma.bias_act_grad(dy, x, b, p["act"], **kw)
    fwd = bench.bind("peer:torch", case, "forward", (x, b), None, 1)
    np.testing.assert_allclose(fwd.alloc().numpy(), want_y, rtol=1e-5, atol=1e-6)
    for direction in ("backward", "forward_backward"):
        bound = bench.bind("peer:torch", case, direction, (dy, x, b), None, 1)
        dx, db = bound.alloc()
        np.testing.assert_allclose(dx.numpy(), want_dx, rtol=1e-4, atol=1e-5, err_msg=direction)
        np.testing.assert_allclose(db.numpy(), want_db, rtol=1e-4, atol=1e-3, err_msg=direction)


@needs_torch
def test_bench_framework_torch(capsys, tmp_path):
    out, rep = _bench_json(capsys, tmp_path, "--framework", "torch", "--peers", "torch", "--op",
                           "leaky_relu,bias_act:act=relu:dim=-1", "--size", "1K", "--dtype", "float32,bfloat16")
    rows = rep["rows"]
    assert rep["meta"]["framework"] == "torch"
    assert {r["impl"] for r in rows} == {"copy", "ma.f(t)", "mt.f(t)", "torch"}
    assert {r["direction"] for r in rows} == {"forward", "forward_backward"}
    assert {r["dtype"] for r in rows} == {"float32", "bfloat16"}
    ours = [r for r in rows if r["kind"] == "backend"]
    assert len(ours) == 2 * 2 * 2 * 2 and all(r["speedup_range"][0] <= r["speedup_vs_best_peer"] for r in ours)
    assert "ma.f(t)" in out and "mt.f(t)" in out
    for argv, msg in ((["--direction", "backward_y"], "--framework torch times --direction"),
                      (["--peers", "numpy"], "compares with torch only"), (["--out"], "allocating calls only"),
                      (["--backend", "numpy"], "--backend is for --framework numpy")):
        assert main(["bench", "--framework", "torch", "--op", "relu", "--size", "1K", *argv]) == 2
        assert msg in capsys.readouterr().err


def test_bench_forward_backward_on_arrays(capsys, tmp_path):
    _, rep = _bench_json(capsys, tmp_path, "--op", "silu", "--size", "1K", "--direction", "forward_backward",
                         "--backend", "numpy", "--peers", "numpy")
    rows = rep["rows"]
    assert {r["impl"] for r in rows} == {"copy", "numpy"} and all(r["bytes"] == 5 * 1024 * 4 for r in rows)


@needs_torch
@pytest.mark.parametrize("spec", ["swiglu", "glu", "geglu:approximate=tanh", "glu:act=silu:activate=first"])
def test_gated_peer_computes_the_same(spec):
    """torch's peer of a gated op (F.glu for glu's own form, else the unfused halves) agrees with ma.<op>."""
    op = bench.parse_op(spec)
    rng = np.random.default_rng(2)
    x, dy = (rng.standard_normal(4096).astype(np.float32) for _ in range(2))
    out = np.empty_like(x)
    for direction in ("forward", "backward", "forward_backward"):
        arrays, o = bench._case_arrays(op, direction, x, dy, out)
        want = bench.bind("backend:numpy", op, direction, arrays, o, 1).alloc()
        got = bench.bind("peer:torch", op, direction, arrays, o, 1).alloc()
        want = want[1] if direction == "forward_backward" else want
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-5, err_msg=f"{spec} {direction}")


@needs_torch
def test_bench_gated_ops(capsys, tmp_path):
    _, rep = _bench_json(capsys, tmp_path, "--op", "swiglu,glu", "--size", "4K", "--direction",
                         "forward,forward_backward", "--backend", "numpy", "--peers", "torch")
    rows = rep["rows"]
    assert {r["op"] for r in rows} == {"swiglu", "glu"} and {tuple(r["shape"]) for r in rows} == {(1, 4096)}
    assert {r["note"] for r in rows if r["impl"] == "torch"} == {"unfused", "unfused, autograd", "F.glu",
                                                                 "F.glu, autograd"}
    fwd = [r for r in rows if r["direction"] == "forward"]
    assert all(r["bytes"] == 6 * 1024 * 4 for r in fwd)  # x read, y = half of x written
    rc = main(["bench", "--op", "swiglu:dim=0", "--no-progress"])
    assert rc == 2 and "along dim=-1" in capsys.readouterr().err
    rc = main(["bench", "--op", "glu:act=prelu", "--no-progress"])
    assert rc == 2 and "parameter 'act' must be" in capsys.readouterr().err


def test_bench_quant(capsys, tmp_path):
    """multiact bench --quant: the quantized call, the plain one and torch's unfused composition, per backend;
    the torch composition's codes are the contract's on finite values (it is the same computation)."""
    pytest.importorskip("torch")
    path = tmp_path / "q.json"
    rc = main(["bench", "--quant", "float8_e4m3fn:group:32,int8:token", "--op", "silu,swiglu", "--size", "8K",
               "--backend", "numpy", "--samples", "3", "--no-progress", "--json", str(path)])
    out = capsys.readouterr().out
    assert rc == 0 and "quant / plain" in out and "torch / quant" in out
    rows = json.loads(path.read_text())["runs"][0]["rows"]
    assert {(r["op"], r["quant"]) for r in rows} == {(o, q) for o in ("silu", "swiglu")
                                                      for q in ("float8_e4m3fn:group:32", "int8:token")}
    assert all(r["torch_s"] for r in rows)
    import torch

    from multiact.cli import quant_bench

    x = np.linspace(-6, 6, 4096, dtype=np.float32).reshape(4, 1024)
    q = quant_bench.parse_quant("float8_e4m3fn:group:32")
    codes, scale = quant_bench.torch_composition(torch, torch.from_numpy(ma.silu(x)), q)
    wc, ws = ma.quantize(ma.silu(x), q)
    np.testing.assert_array_equal(codes.reshape(4, 1024).view(torch.uint8).numpy(), wc.view(np.uint8))
    np.testing.assert_array_equal(scale.reshape(4, 32).numpy(), ws)
    with pytest.raises(ValueError, match="a group needs its size"):
        quant_bench.parse_quant("int8:group")


def test_bench_onnx_quant(capsys, tmp_path):
    """benchmarks/onnx_quant.py: the speed table's every column at a small size, and its contract count."""
    pytest.importorskip("onnxruntime")
    mod = _load("onnx_quant")
    out = tmp_path / "q.txt"
    mod.main(["--n", "8192", "--cols", "256", "--reps", "1", "--ops", "relu,swiglu", "--out", str(out)])
    rows = [ln.split() for ln in out.read_text().splitlines() if not ln.startswith(("#", "op "))]
    assert len(rows) == 2 * len(mod.QUANTS)
    assert "CPU: " in out.read_text() and "family" in out.read_text()
    model = mod.composition("gelu", ma.Quant("int8", "group", group_size=128))
    assert [n.op_type for n in model.graph.node][:2] == ["Gelu", "Abs"]
    capsys.readouterr()
