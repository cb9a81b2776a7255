"""Facts about the ops live in multiact/_opdefs.py (issues 14 and 41): no module of the package, the backends,
the native build, the benchmarks or the scripts writes a list of ops by hand, or tests an op's name.

A literal collection naming three or more ops (or kernel keys) is flagged unless it is one of the places
below, each a backend's or a peer's own kernels for the ops, or a tool's choice of a few ops, never a
restatement of what the ops are.  A test of an op's name is flagged wherever it is: a comparison with an op's
name (`op == "prelu"`, `spec.name in ("a", "b")`), a `match` case on one, or a table keyed by op names (a dict
dispatch) outside the allowed places.  What one op needs is a field of its definition or a registration keyed
by (op, direction), as `@_formula((key, direction))` is in multiact/backend/formulas.py.  A comparison of a
choice parameter's value (`p["approximate"] == "tanh"`: gelu's variant, not the op tanh) is not a name test.
"""

from __future__ import annotations

import ast
from pathlib import Path

from multiact._opdefs import COMPOSITES, DEFS
from multiact.optable import KEYS, OPS

ROOT = Path(__file__).resolve().parents[1]
NAMES = set(OPS) | set(KEYS)
PARAMS = {p.name for d in (*DEFS, *COMPOSITES) for p in d.params}  # "threshold" is an op and a parameter
CHOICES: dict[str, set[str]] = {}  # choice parameter -> its values ("approximate": "none", "tanh")
for _d in (*DEFS, *COMPOSITES):
    for _p in _d.params:
        if _p.kind == "choice":
            CHOICES.setdefault(_p.name, set()).update(_p.choices)
SCANNED = ("multiact/**/*.py", "native/*.py", "native/tests/*.py", "benchmarks/**/*.py", "scripts/**/*.py")

ALLOWED = {
    ("multiact/_opdefs.py", "DEFS"): "the definitions themselves",
    ("multiact/optable.py", "_NUMERICS"): "the op table's numerics: each op's float64 references, kinks, bound",
    ("multiact/cli/peers.py", "_ORT_NODES"): "the ONNX Runtime peer's nodes per op",
    ("multiact/cli/peers.py", "_NUMPY_FWD"): "the NumPy peer's formulas",
    ("multiact/cli/peers.py", "_NUMPY_BWD"): "the NumPy peer's formulas",
    ("multiact/cli/peers.py", "_NUMPY_NO_OUT"): "which of the NumPy peer's formulas end in np.where",
    ("multiact/backend/onnx_graphs.py", "BUILTIN_OK"): "ORT operators measured to meet the tolerance, per dtype",
    ("multiact/backend/onnx_graphs.py", "F64_FORWARD"): "composites measured to need float64 to meet the tolerance",
    ("multiact/onnx_export.py", "RUNTIME_ERRORS"): "ORT operators' measured errors, per op",
    ("multiact/onnx_export.py", "RUNTIME_ULPS"): "ORT operators' measured errors, per op, as figures",
    ("multiact/onnx_export.py", "_DEVIATIONS"): "why a graph is not ORT's own operator, per op",
    ("multiact/backend/formulas.py", "WIDE"): "the CUDA kernels computed in float64 (a numerics choice per kernel)",
    ("multiact/cli/bench.py", "DEFAULT_OPS"): "the few ops a bare `multiact bench` times",
    ("multiact/cli/commands.py", "DEMO_OPS"): "the few ops `multiact demo` shows",
    ("multiact/compat.py", "STYLEGAN_ACTS"): "StyleGAN's own activation table (its names, alphas and gains)",
    ("multiact/consistency.py", "bias_act_cases"): "a few activations run in every bias_act form",
    ("multiact/cli/accuracy.py", "SWEEP_CASES"): "the non-default parameters a dense accuracy sweep covers",
    ("benchmarks/bench_backward2.py", "OPS"): "the kernel keys this benchmark times, with their parameters",
    ("benchmarks/test_numpy_vs_numba.py", "CASES"): "the kernel keys this benchmark times, with their parameters",
    ("benchmarks/bench_composite.py", "BIAS_ACTS"): "the activations this benchmark times with bias_act",
    ("benchmarks/bench_quant.py", "CASES"): "the ops issue 45's speed floors name, with their torch composition",
    ("benchmarks/bench_quant_backward.py", "CASES"): "the ops issue 46's backward floor is measured on, with torch's "
                                                     "backward kernels",
    ("benchmarks/test_native_vs_peers.py", "PARAMS"): "the benchmark's parameters for the ops without defaults",
    ("benchmarks/onnx_export.py", "PARAMS"): "the benchmark's parameters for the ops without defaults",
    ("scripts/gpu_bench.py", "PARAMS"): "the benchmark's parameters for the ops without defaults",
    ("scripts/accuracy_f64.py", "_mp_forms"): "the smooth ops' exact forms in mpmath (an independent reference)",
}

# Whole modules whose name tests are allowed, with the reason (none: every rule is the op's own).
NAME_TESTS_ALLOWED: dict[str, str] = {}


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


def _files() -> list[Path]:
    return sorted({p for pattern in SCANNED for p in ROOT.glob(pattern)})


def _statements():
    """(path relative to the root, top-level statement, its owner) of every scanned module."""
    for path in _files():
        rel = path.relative_to(ROOT).as_posix()
        for stmt in ast.parse(path.read_text()).body:
            yield rel, stmt, _owner(stmt)


def _hand_lists() -> list[str]:
    found = []
    for rel, stmt, owner in _statements():
        if (rel, owner) in ALLOWED:
            continue
        for node in ast.walk(stmt):
            names = _op_names(node)
            if len(names) >= 3:
                found.append(f"{rel}:{node.lineno} ({owner or 'module'}): {sorted(names)}")
    return found


def _named(node: ast.AST) -> set[str]:
    """The op names a comparison operand or a match pattern spells: a str constant, or a collection of them."""
    if isinstance(node, ast.Constant):
        return {node.value} & NAMES if isinstance(node.value, str) else set()
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return {e.value for e in node.elts if isinstance(e, ast.Constant) and e.value in NAMES}
    return set()


def _parameter(node: ast.AST) -> str | None:
    """The parameter an operand reads, if it reads one by name: `approximate`, `p["approximate"]`,
    `p.get("approximate")`, `call.approximate`."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        return node.slice.value
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
            and node.args and isinstance(node.args[0], ast.Constant)):
        return node.args[0].value
    return None


def _choice_value(names: set[str], others: list[ast.AST]) -> bool:
    """Whether the names are values of the choice parameter every other operand reads (gelu's "tanh")."""
    return all(names <= CHOICES.get(_parameter(o) or "", set()) for o in others)


def _keyed_by_names(node: ast.Dict) -> set[str]:
    """The op names a dict literal is keyed by: a key that is an op's name and not a parameter's, or one whose
    value is more than a number (a parameter dict {"threshold": 0.5} is not a table; {"threshold": {...}} is)."""
    keys = set()
    for k, v in zip(node.keys, node.values, strict=True):
        if isinstance(k, ast.Constant) and k.value in NAMES:
            scalar = isinstance(v, ast.Constant) or (isinstance(v, ast.UnaryOp) and isinstance(v.operand, ast.Constant))
            if k.value not in PARAMS or not scalar:
                keys.add(k.value)
    return keys


def _name_tests() -> list[str]:
    """Every test of an op's name outside the allowed places: comparisons, match cases, dicts keyed by names."""
    found = []
    for rel, stmt, owner in _statements():
        if rel in NAME_TESTS_ALLOWED or rel == "multiact/_opdefs.py":
            continue
        for node in ast.walk(stmt):
            what = ""
            if isinstance(node, ast.Compare):
                operands = [node.left, *node.comparators]
                for i, operand in enumerate(operands):
                    names = _named(operand)
                    if names and not _choice_value(names, operands[:i] + operands[i + 1:]):
                        what = f"compares with {sorted(names)}: {ast.unparse(node)[:80]}"
                        break
            elif isinstance(node, ast.match_case):
                names = {n for p in ast.walk(node.pattern) if isinstance(p, ast.MatchValue) for n in _named(p.value)}
                if names:
                    what = f"match case {sorted(names)}"
                    node = node.pattern  # (a case has no line of its own)
            elif isinstance(node, ast.Dict) and (rel, owner) not in ALLOWED:
                names = _keyed_by_names(node)
                if names:
                    what = f"a table keyed by op names {sorted(names)}"
            if what:
                found.append(f"{rel}:{node.lineno} ({owner or 'module'}): {what}")
    return found


def test_no_hand_written_op_lists_outside_the_definitions():
    assert not _hand_lists(), "derive these from multiact._opdefs:\n" + "\n".join(_hand_lists())


def test_no_module_tests_an_op_name():
    found = _name_tests()
    assert not found, ("make these a field of the op's definition or a registration keyed by (op, direction):\n"
                       + "\n".join(found))


def test_the_scan_finds_a_hand_written_list(tmp_path, monkeypatch):
    """The check above can fail: a module that lists ops by hand is found."""
    (tmp_path / "multiact").mkdir()
    (tmp_path / "multiact" / "bad.py").write_text('Y_SAME = ("relu", "relu6", "hardtanh")\n')
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
    assert _hand_lists() == ["multiact/bad.py:1 (Y_SAME): ['hardtanh', 'relu', 'relu6']"]


def test_the_scan_finds_name_tests_in_the_package_benchmarks_and_scripts(tmp_path, monkeypatch):
    """The check above can fail: if-chains, membership tests, match cases and dict dispatch on op names are
    found in the package, the benchmarks and the scripts; a choice parameter's value and a parameter dict are
    not name tests, and an allowed module is skipped."""
    for folder in ("multiact", "benchmarks", "scripts"):
        (tmp_path / folder).mkdir()
    (tmp_path / "multiact" / "bad.py").write_text(
        "def fwd(op, spec, p):\n"
        "    if op == 'prelu':\n"
        "        return 1\n"
        "    if spec.name in ('relu', 'gelu'):\n"
        "        return 2\n"
        "    if p['approximate'] == 'tanh' or p.get('approximate') != 'none':\n"  # gelu's variant: not a name test
        "        return 3\n"
        "    match op:\n"
        "        case 'swish' | 'silu':\n"
        "            return 4\n"
        "    return {'fast_gelu': 1.702, 'silu': 1.0}.get(op)\n"
    )
    (tmp_path / "benchmarks" / "bench.py").write_text("K = 'gelu_tanh' if x else 'relu'\nok = key != 'tanh'\n")
    (tmp_path / "scripts" / "run.py").write_text(
        "PARAMS = {'threshold': {'threshold': 0.1, 'value': 0.0}}\ncase = {'beta': 1.0, 'threshold': 20.0}\n")
    (tmp_path / "multiact" / "legacy.py").write_text("x = op == 'prelu'\n")  # an allowed module
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
    monkeypatch.setattr(__import__(__name__), "NAME_TESTS_ALLOWED", {"multiact/legacy.py": "a test's allowance"})
    assert _name_tests() == [
        "benchmarks/bench.py:2 (ok): compares with ['tanh']: key != 'tanh'",
        "multiact/bad.py:2 (fwd): compares with ['prelu']: op == 'prelu'",
        "multiact/bad.py:4 (fwd): compares with ['gelu', 'relu']: spec.name in ('relu', 'gelu')",
        "multiact/bad.py:9 (fwd): match case ['silu', 'swish']",
        "multiact/bad.py:11 (fwd): a table keyed by op names ['fast_gelu', 'silu']",
        "scripts/run.py:1 (PARAMS): a table keyed by op names ['threshold']",
    ]


def test_every_allowance_still_names_a_place():
    """An allowance whose place is gone is dropped, so the list cannot hide new hand-written tables."""
    for rel, owner in ALLOWED:
        tree = ast.parse((ROOT / rel).read_text())
        assert any(_owner(s) == owner for s in tree.body), (rel, owner)
    for rel in NAME_TESTS_ALLOWED:
        assert (ROOT / rel).is_file(), rel
