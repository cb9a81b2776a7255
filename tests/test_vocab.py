"""The shared vocabulary (`multiact/vocab.py`, issue 41): dtypes, directions and ISAs are stated there and read
everywhere else.  A module of the package, the native build, scripts/ or benchmarks/ that writes one of these
lists by hand is flagged: a literal collection (tuple, list, set, or a dict's keys) naming three or more dtypes
(any spelling) or two or more ISAs, or a tuple, list or set naming four or more directions (fewer are a tool's
choice, and tables keyed by direction are per-direction facts, as formulas.py's are), unless it is one of the
places below, each with its reason.  The rest checks that the vocabulary is what the C runtime, the native
backend, the public functions and the commands use."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import numpy as np
import pytest
from conftest import native_kernels

import multiact as ma
from multiact import vocab

ROOT = Path(__file__).resolve().parents[1]

ALLOWED = {
    ("multiact/backend/onnx_graphs.py", "elem"): "ONNX's element type of each dtype the graphs write (TensorProto)",
    ("multiact/cli/served.py", "COMMANDS"): "the lab's harness command per ISA it can serve off its hardware "
                                             "(recipes, not the list of ISAs; keys checked against the vocabulary)",
    ("native/tests/gen_harness_table.py", "DT"): "harness.c's DT_* codes, the C harness's own enum",
    ("multiact/backend/native_backend.py", "_QDTYPE"): "ma_quant.inc's input codes, the C unit's own enum",
    ("scripts/cuda_ptx_report.py", "TYPES"): "PTX's instruction types (its f16, bf16, f32, f64 are PTX's names)",
}

_SPELLINGS = {s: d.name for d in vocab.DTYPES.values() for s in d.spellings}


def _literals(node: ast.AST) -> tuple[list[ast.AST], bool]:
    """The elements of a literal collection (a dict's keys), and whether it is a dict."""
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return node.elts, False
    if isinstance(node, ast.Dict):
        return [k for k in node.keys if k is not None], True
    return [], False


def _strings(elts: list[ast.AST]) -> set[str]:
    return {e.value for e in elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}


def _restated(node: ast.AST) -> str | None:
    """What a literal collection restates of the vocabulary, or None."""
    elts, is_dict = _literals(node)
    words = _strings(elts)
    dtypes = {_SPELLINGS[w] for w in words if w in _SPELLINGS}
    if len(dtypes) >= 3:
        return f"dtypes {sorted(dtypes)}"
    isas = words & set(vocab.ISAS)
    if len(isas) >= 2:
        return f"ISAs {sorted(isas)}"
    directions = words & set(vocab.DIRECTIONS)
    if not is_dict and len(directions) >= 4:
        return f"directions {sorted(directions)}"
    return None


def _owner(stmt: ast.stmt) -> str:
    if isinstance(stmt, (ast.FunctionDef, ast.ClassDef)):
        return stmt.name
    if isinstance(stmt, (ast.Assign, ast.AnnAssign)):
        target = stmt.targets[0] if isinstance(stmt, ast.Assign) else stmt.target
        return getattr(target, "id", "")
    return ""


def _files(root: Path) -> list[Path]:
    return sorted({*root.glob("multiact/**/*.py"), *root.glob("native/*.py"), *root.glob("native/tests/*.py"),
                   *root.glob("scripts/*.py"), *root.glob("benchmarks/*.py")})


def _hand_lists(root: Path = ROOT) -> list[str]:
    found = []
    for path in _files(root):
        rel = path.relative_to(root).as_posix()
        if rel == "multiact/vocab.py":
            continue
        for stmt in ast.parse(path.read_text()).body:
            owner = _owner(stmt)
            if owner == "__all__" or (rel, owner) in ALLOWED:  # __all__: public function names
                continue
            for node in ast.walk(stmt):
                what = _restated(node)
                if what:
                    found.append(f"{rel}:{node.lineno} ({owner or 'module'}): {what}")
    return found


def test_no_hand_written_vocabulary_outside_vocab():
    found = _hand_lists()
    assert not found, "read these from multiact.vocab:\n" + "\n".join(found)


def test_the_scan_finds_hand_written_lists(tmp_path):
    """The check above can fail: dtypes (in any spelling), ISAs and directions written by hand are found; a
    tool's choice of two or three directions, or a table keyed by direction, is not."""
    (tmp_path / "multiact").mkdir()
    (tmp_path / "scripts").mkdir()
    (tmp_path / "multiact" / "bad.py").write_text(
        'FLOATS = ("float16", "bfloat16", "float32")\n'
        'ELSIZE = {"f16": 2, "fp32": 4, "double": 8}\n'
        'PREFERENCE = ["avx512", "avx2"]\n'
        'DIRS = ("forward", "backward", "backward_y", "param_grad")\n'
        'FINE = ("forward", "backward", "backward_y")\n'
        'ATOL = {"forward": 1, "backward": 2, "backward_y": 3, "backward2": 4}\n'
        '__all__ = ["forward", "backward", "backward2", "param_grad", "param_grad2"]\n')
    (tmp_path / "scripts" / "bad.py").write_text('def f(isa):\n    return isa in {"neon", "scalar"}\n')
    assert _hand_lists(tmp_path) == [
        "multiact/bad.py:1 (FLOATS): dtypes ['bfloat16', 'float16', 'float32']",
        "multiact/bad.py:2 (ELSIZE): dtypes ['float16', 'float32', 'float64']",
        "multiact/bad.py:3 (PREFERENCE): ISAs ['avx2', 'avx512']",
        "multiact/bad.py:4 (DIRS): directions ['backward', 'backward_y', 'forward', 'param_grad']",
        "scripts/bad.py:2 (f): ISAs ['neon', 'scalar']",
    ]


def test_every_allowance_still_names_a_place():
    """An allowance whose place is gone is dropped, so the list cannot hide new hand-written tables."""
    for rel, owner in ALLOWED:
        tree = ast.parse((ROOT / rel).read_text())
        assert any(_owner(s) == owner for s in tree.body), (rel, owner)


# ---- the vocabulary itself ---------------------------------------------------------------------------------

def test_the_vocabulary_is_consistent():
    for d in vocab.DTYPES.values():
        assert d.compute in vocab.DTYPES and d.spellings[:2] == (d.name, d.ctag)
        assert d.half == (vocab.DTYPES[d.compute].itemsize > d.itemsize)
    spellings = [s for d in vocab.DTYPES.values() for s in d.spellings]
    assert len(spellings) == len(set(spellings))  # one dtype per spelling
    for i in vocab.ISAS.values():
        assert (ROOT / "native" / "src" / f"isa_{i.name}.c").exists(), i.name
        assert i.arch is None or set(i.flags) <= set(vocab.ARCHES[i.arch].flags), i
    assert vocab.isas_of("riscv64") == (vocab.BASELINE,)  # an architecture without SIMD kernels: the portable C
    assert vocab.isas_of("x86_64") == ("scalar", "avx2", "avx512") and vocab.isas_of("arm64") == ("scalar", "neon")
    assert vocab.arch("AMD64") == "x86_64" and vocab.arch("riscv64") == "riscv64"


def test_a_dtype_is_resolved_from_any_spelling():
    import ml_dtypes

    assert [vocab.dtype(s).name for s in ("float32", "F32", " fp32 ", "single")] == ["float32"] * 4
    assert vocab.dtype(np.float16).name == vocab.dtype(np.dtype("half")).name == "float16"
    assert vocab.dtype(np.dtype(ml_dtypes.bfloat16)).name == vocab.dtype("bf16").name == "bfloat16"
    assert vocab.dtypes(["f64", "double", "float64", "f16"]) == ["float64", "float16"]
    with pytest.raises(ValueError, match=r"unknown dtype 'int8'; valid dtypes: float16, bfloat16, float32, float64$"):
        vocab.dtype("int8")
    assert vocab.DTYPE_TEXT == "float16, bfloat16, float32 or float64"


def test_the_directions_are_the_public_functions_arrays():
    """Each direction's arrays are the array arguments of the generic function that reaches it, in order."""
    funcs = {"forward": ma.forward, "backward": ma.backward, "param_grad": ma.param_grad,
             "backward2": ma.backward2, "param_grad2": ma.param_grad2}
    assert {d.function for d in vocab.DIRECTIONS.values()} == set(funcs)
    for d in vocab.DIRECTIONS.values():
        params = [p for p in inspect.signature(funcs[d.function]).parameters if p not in ("op", "param")]
        if d.name == "backward_y":  # backward(op, dy, x=None, *, y=...): dy and the output y
            assert params[0] == "dy" and "y" in params
        else:
            assert params[:d.arity] == list(d.arrays), d.name
    assert vocab.FIRST_ORDER == ma.optable.DIRECTIONS == ("forward", "backward", "backward_y", "param_grad")


# ---- what reads it -----------------------------------------------------------------------------------------

def test_the_kernel_table_and_the_isa_header_come_from_the_vocabulary():
    K = native_kernels()
    assert K.DTYPES == {n: d.ctag for n, d in vocab.DTYPES.items()}
    assert K.isas("x86_64") == vocab.isas_of("x86_64") and K.isas("aarch64") == vocab.isas_of("aarch64")
    header = K.isa_header()
    assert [line.split("(")[1].split(",")[0] for line in header.splitlines() if "MA_ISA(" in line
            and "#define" not in line and "/*" not in line] == list(vocab.ISAS)
    built = ROOT / "native" / "_build" / "ma_isa_list.h"
    if built.exists():  # the build's copy (setup.py build_ext writes it)
        assert built.read_text() == header


def test_the_c_runtime_knows_the_vocabularys_isas_best_first():
    native = pytest.importorskip("multiact._native", reason="the native extension is not built")
    lib, ffi = native.lib, native.ffi
    assert ffi.string(lib.ma_isa_names()).decode().split() == list(vocab.ISAS)
    here = vocab.arch()
    for i in vocab.ISAS.values():
        why = ffi.string(lib.ma_isa_why(i.name.encode())).decode()
        if i.arch not in (None, here):
            assert why == "not an ISA of this architecture", i.name
    assert ffi.string(lib.ma_isa_why(b"nosuch")).decode() == "not an ISA of this architecture"
    assert lib.ma_isa_supported(vocab.BASELINE.encode()) == 1


def test_the_native_backend_prefers_the_vocabularys_order():
    from multiact.backend import native_backend

    ok, _ = native_backend.available()
    if not ok:
        pytest.skip("the native extension is not built")
    runs = native_backend.info()["isas"]
    assert runs == [i for i in vocab.ISAS if i in runs]
    assert native_backend.info()["isa"] in (runs[0], *runs)  # MULTIACT_NATIVE_ISA may force another


def test_served_isas_are_isas():
    from multiact.cli import served

    assert set(served.COMMANDS) <= set(vocab.ISAS)


def test_every_command_takes_the_same_dtypes(capsys):
    """check and bench (either framework) refuse an unknown dtype with one message, and take every spelling."""
    from multiact.cli import selfcheck, tensor_bench
    from multiact.cli.commands import main

    want = "unknown dtype 'int8'; valid dtypes: float16, bfloat16, float32, float64"
    for argv in (["check", "--dtype", "int8"], ["check", "--exhaustive", "--dtype", "int8"],
                 ["bench", "--dtype", "float32,int8", "--no-progress"]):
        assert main(argv) == 2
        assert capsys.readouterr().err.strip() == f"multiact {argv[0]}: error: {want}"
    with pytest.raises(ValueError, match=want):
        tensor_bench.check(["forward"], ["int8"], ["alloc"])
    with pytest.raises(ValueError, match=want):
        selfcheck.run(["numpy"], ["relu"], ["int8"])
    with pytest.raises(ValueError, match="run_bf16"):  # bfloat16's check is the exhaustive one
        selfcheck.run(["numpy"], ["relu"], ["bf16"])
    report = selfcheck.run(["numpy"], ["relu"], ["fp32", "f16"])
    assert {r.dtype for r in report["rows"]} == {"float32", "float16"} and report["passed"]
    assert main(["check", "--backend", "numpy", "--op", "relu", "--dtype", "f32,half", "--no-progress"]) == 0
    assert "PASSED" in capsys.readouterr().out
