"""The math libraries' coefficient tables are generated, not pasted.

native/fit_coefficients.py writes native/src/ma_coeffs.h (the native library's tables) and
multiact/backend/_numba_coeffs.py (numba_math's), each stamped with the sha256 of the script (the fit's inputs)
and of its own text (the outputs).  The checks here are fast (a few seconds): the stamps; every fit run
again, compared bit for bit with the files; the math sources import the tables and paste none.  The
full run (fit and measure errors, about 10 s) happens only when the script changed since the files
were written, to show what they would become.
"""

from __future__ import annotations

import difflib
import importlib.util
import re
import sys
from pathlib import Path

import pytest

pytest.importorskip("mpmath")

ROOT = Path(__file__).resolve().parent.parent
REGEN = "rerun `python native/fit_coefficients.py` and commit what it writes"


@pytest.fixture(scope="module")
def gen():
    spec = importlib.util.spec_from_file_location("_multiact_fit_coefficients", ROOT / "native" / "fit_coefficients.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    try:
        spec.loader.exec_module(mod)
        yield mod
    finally:
        sys.modules.pop(spec.name, None)


def _disk(gen) -> dict[str, str]:
    return {rel: (ROOT / rel).read_text() for rel in (gen.C_HEADER, gen.PY_MODULE)}


def test_generated_files_carry_the_current_scripts_stamp(gen):
    stale = []
    for rel, text in _disk(gen).items():
        stamp = gen.stamp_of(text)
        assert stamp is not None, f"{rel} has no fit_coefficients.py stamp: {REGEN}"
        inputs, outputs = stamp
        assert outputs == gen.outputs_digest(text), f"{rel} was edited after it was generated: {REGEN}"
        if inputs != gen.inputs_digest():
            stale.append(rel)
    if stale:  # the inputs changed: the full run says what the files would become
        fresh, disk = gen.generate(), _disk(gen)
        diff = "".join(
            "".join(difflib.unified_diff(disk[rel].splitlines(True), fresh[rel].splitlines(True), rel, rel + " (new)"))
            for rel in fresh if fresh[rel] != disk[rel]
        )
        pytest.fail(f"native/fit_coefficients.py changed since {', '.join(stale)} were written: {REGEN}\n{diff[:6000]}")


_BITS = re.compile(r"^(?:#define )?(\w+)\b.*\b0x([0-9a-f]{8}|[0-9a-f]{16})\b")


def _units_apart(line: str, disk: set[str]) -> int | None:
    """How many units in the last place a fitted value's line is from the disk's line of the same name."""
    m = _BITS.match(line)
    if not m:
        return None
    for other in disk:
        o = _BITS.match(other)
        if o and o.group(1) == m.group(1) and len(o.group(2)) == len(m.group(2)):
            return abs(int(m.group(2), 16) - int(o.group(2), 16))
    return None


def test_every_fit_reproduces_the_bits_on_disk(gen):
    """Bit for bit, or one unit in the last place: the fit's float64 least squares runs in the BLAS that NumPy
    ships, whose kernels differ by CPU (OpenBLAS's AVX-512 ones on Zen 4 put one float32 coefficient on the
    other side of its rounding: MA_ERFC_G12, 0xb6628290 on disk from Zen 1/3, 0xb6628291 there)."""
    disk = {rel: set(text.splitlines()) for rel, text in _disk(gen).items()}
    missing, fitted, near = [], 0, 0
    for t, values, _note in gen.fitted_values():
        rel = gen.C_HEADER if t.lib == "native" else gen.PY_MODULE
        fitted += t.fitted
        for line in gen.value_lines(t, values):
            if line in disk[rel]:
                continue
            if _units_apart(line, disk[rel]) == 1:
                near += 1
            else:
                missing.append(f"{rel}: {line}")
    assert fitted >= 7
    assert not missing, "a fit here gives other values than the files hold:\n" + "\n".join(missing)
    assert near <= 2, f"{near} fitted values one unit off the files': {REGEN}"


def test_numba_math_takes_its_tables_from_the_generated_module():
    from multiact.backend import _numba_coeffs as k
    from multiact.backend import numba_math as nm

    names = [n for n in vars(k) if re.fullmatch(r"_[A-Z][A-Z0-9_]*", n)]
    assert len(names) >= 30
    assert all(getattr(nm, n) is getattr(k, n) for n in names)


# Named constants of closed form that the sources may spell out; anything else with 6 or more significant
# digits is a pasted coefficient (it belongs in fit_coefficients.py).
def _closed_forms():
    import mpmath as mp

    mp.mp.dps = 40
    return [
        mp.sqrt(2), 1 / mp.sqrt(2), 2 * mp.sqrt(2), 1 / mp.sqrt(2 * mp.pi), mp.sqrt(2 / mp.pi), 2 * mp.sqrt(2 / mp.pi),
        mp.mpf("1.6732632423543772848170429916717"), mp.mpf("1.0507009873554804934193349852946"),  # SELU (PyTorch)
        mp.mpf("3.40282346638528859811704183484516925e38"),  # FLT_MAX
    ]


@pytest.mark.parametrize("rel", ["native/src/ma_math.h", "native/src/ma_ops.h", "multiact/backend/numba_math.py"])
def test_math_sources_paste_no_coefficients(rel):
    import mpmath as mp

    forms = _closed_forms()
    comments = r"/\*.*?\*/" if rel.endswith(".h") else r"#[^\n]*|\"\"\".*?\"\"\""
    text = re.sub(comments, " ", (ROOT / rel).read_text(), flags=re.S)
    pasted = []
    for m in re.finditer(r"(?<![\w.])(\d+\.\d*|\.\d+)(?:[eE][-+]?\d+)?", text):
        lit = m.group(0)
        digits = len(re.sub(r"^[0.]+", "", re.sub(r"[eE].*", "", lit).replace(".", "")).rstrip("0"))
        if digits < 6:
            continue
        v = mp.mpf(lit)
        if v == int(v) or mp.frexp(v)[0] == 0.5:  # integers and powers of two are exact
            continue
        if not any(abs(v - f) <= abs(f) * mp.mpf(10) ** (1 - digits) for f in forms):
            pasted.append(lit)
    assert not pasted, f"{rel} spells out constants that are not closed forms: {pasted}"
