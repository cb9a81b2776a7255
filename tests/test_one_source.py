"""Facts about the ops live in multiact/_opdefs.py: no other module of the package, the backends or the
native build writes a list of ops by hand (issue 14).  A literal collection naming three or more ops
(or kernel keys) is flagged unless it is one of the places below, each a backend's or a peer's own
kernels for the ops, or a tool's choice of a few ops, never a restatement of what the ops are."""

from __future__ import annotations

import ast
from pathlib import Path

from multiact.optable import KEYS, OPS

ROOT = Path(__file__).resolve().parents[1]
NAMES = set(OPS) | set(KEYS)

ALLOWED = {
    ("multiact/_opdefs.py", "DEFS"): "the definitions themselves",
    ("multiact/optable.py", "_NUMERICS"): "the op table's numerics: each op's float64 references, kinks, bound",
    ("multiact/tools/peers.py", "_ORT_NODES"): "the ONNX Runtime peer's nodes per op",
    ("multiact/tools/peers.py", "_NUMPY_FWD"): "the NumPy peer's formulas",
    ("multiact/tools/peers.py", "_NUMPY_BWD"): "the NumPy peer's formulas",
    ("multiact/tools/peers.py", "_NUMPY_NO_OUT"): "which of the NumPy peer's formulas end in np.where",
    ("multiact/backend/onnx_graphs.py", "BUILTIN_OK"): "ORT operators measured to meet the tolerance, per dtype",
    ("multiact/backend/onnx_graphs.py", "F64_FORWARD"): "composites measured to need float64 to meet the tolerance",
    ("multiact/onnx_export.py", "RUNTIME_ERRORS"): "ORT operators' measured errors, per op",
    ("multiact/onnx_export.py", "RUNTIME_ULPS"): "ORT operators' measured errors, per op, as figures",
    ("multiact/onnx_export.py", "_DEVIATIONS"): "why a graph is not ORT's own operator, per op",
    ("multiact/backend/ascend_backend.py", "_torch_forward"): "torch composites for the ops torch has no function for",
    ("multiact/backend/formulas.py", "WIDE"): "the CUDA kernels computed in float64 (a numerics choice per kernel)",
    ("multiact/tools/bench.py", "DEFAULT_OPS"): "the few ops a bare `multiact bench` times",
    ("multiact/tools/cli.py", "DEMO_OPS"): "the few ops `multiact demo` shows",
    ("multiact/compat.py", "STYLEGAN_ACTS"): "StyleGAN's own activation table (its names, alphas and gains)",
    ("multiact/consistency.py", "bias_act_cases"): "a few activations run in every bias_act form",
    ("multiact/tools/accuracy.py", "SWEEP_CASES"): "the non-default parameters a dense accuracy sweep covers",
}


def _op_names(node: ast.AST) -> set[str]:
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        elts = node.elts
    elif isinstance(node, ast.Dict):
        elts = [k for k in node.keys if k is not None]
    else:
        return set()
    found = set()
    for e in elts:
        if isinstance(e, ast.Tuple) and e.elts:  # (op, direction) keys
            e = e.elts[0]
        if isinstance(e, ast.Constant) and e.value in NAMES:
            found.add(e.value)
    return found


def _owner(stmt: ast.stmt) -> str:
    if isinstance(stmt, (ast.FunctionDef, ast.ClassDef)):
        return stmt.name
    if isinstance(stmt, (ast.Assign, ast.AnnAssign)):
        target = stmt.targets[0] if isinstance(stmt, ast.Assign) else stmt.target
        return getattr(target, "id", "")
    return ""


def _hand_lists() -> list[str]:
    files = [*ROOT.glob("multiact/**/*.py"), *ROOT.glob("multiact/backend/*.py"), *ROOT.glob("native/*.py"),
             *ROOT.glob("native/tests/*.py")]
    found = []
    for path in sorted(files):
        rel = path.relative_to(ROOT).as_posix()
        for stmt in ast.parse(path.read_text()).body:
            if (rel, _owner(stmt)) in ALLOWED:
                continue
            for node in ast.walk(stmt):
                names = _op_names(node)
                if len(names) >= 3:
                    found.append(f"{rel}:{node.lineno} ({_owner(stmt) or 'module'}): {sorted(names)}")
    return found


def test_no_hand_written_op_lists_outside_the_definitions():
    assert not _hand_lists(), "derive these from multiact._opdefs:\n" + "\n".join(_hand_lists())


def test_the_scan_finds_a_hand_written_list(tmp_path, monkeypatch):
    """The check above can fail: a module that lists ops by hand is found."""
    (tmp_path / "multiact").mkdir()
    (tmp_path / "multiact" / "bad.py").write_text('Y_SAME = ("relu", "relu6", "hardtanh")\n')
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
    assert _hand_lists() == ["multiact/bad.py:1 (Y_SAME): ['hardtanh', 'relu', 'relu6']"]


def test_every_allowance_still_names_a_place():
    """An allowance whose place is gone is dropped, so the list cannot hide new hand-written tables."""
    for rel, owner in ALLOWED:
        tree = ast.parse((ROOT / rel).read_text())
        assert any(_owner(s) == owner for s in tree.body), (rel, owner)
