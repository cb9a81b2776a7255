"""Readable objects: `ma.ops()` prints as a table and stays a dict; an OpSpec's repr is one short line;
progress bars are drawn only on a terminal (no carriage-return frames in a log file)."""

from __future__ import annotations

import io

import multiact as ma
from multiact.cli import _report
from multiact.optable import LINEAR, OPS, OpTable


def test_ops_prints_as_a_table_of_the_definitions():
    table = ma.ops()
    text = repr(table)
    assert str(table) == text and text.startswith(f"{len(OPS)} ops")
    lines = text.splitlines()
    assert lines[1].split()[:1] == ["op"] and "y-form" in lines[1] and "extras" in lines[1]
    body = lines[3:]
    assert len(body) == len(OPS)
    for line, spec in zip(body, OPS.values(), strict=True):  # one row per op, in table order, from its definition
        assert line.startswith(spec.signature())
        for p in spec.params:
            assert p.name in line
        assert spec.y_form_text() in line and spec.extras() in line
    assert "function" not in text and "0x" not in text
    leaky = next(line for line in body if line.startswith("leaky_relu("))
    assert "negative_slope=0.01" in leaky and "same, if negative_slope > 0" in leaky and "ONNX LeakyRelu" in leaky
    gelu = next(line for line in body if line.startswith("gelu("))
    assert "approximate='none'|'tanh'" in gelu and "kernels gelu/gelu_tanh by approximate" in gelu
    swish = next(line for line in body if line.startswith("swish("))
    assert "d/dbeta: swish_beta_grad" in swish


def test_ops_is_still_a_dict_of_specs():
    table = ma.ops()
    assert isinstance(table, dict) and isinstance(table, OpTable)
    assert list(table) == list(OPS) and table["gelu"] is OPS["gelu"]
    table.pop("gelu")  # a copy: the caller may change it
    assert "gelu" in OPS and "gelu" in ma.ops()
    assert dict(table) == {k: v for k, v in OPS.items() if k != "gelu"}


def test_opspec_repr_is_short():
    for spec in [*OPS.values(), LINEAR]:
        r = repr(spec)
        assert r.startswith(f"OpSpec({spec.name}(x") and len(r) < 120 and "function" not in r and "0x" not in r, r
    assert repr(OPS["elu"]) == "OpSpec(elu(x, alpha=1.0); y-form: own, if alpha >= 0)"
    assert repr(OPS["prelu"]) == "OpSpec(prelu(x, weight: array, axis=1); y-form: -)"
    assert repr(OPS["threshold"]) == "OpSpec(threshold(x, threshold, value); y-form: -)"  # required: no default


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_only_on_a_terminal():
    log = io.StringIO()  # a file or a pipe: plain lines, no '\r' frames
    assert list(_report.progress(range(4), 4, "work", stream=log)) == [0, 1, 2, 3]
    assert "\r" not in log.getvalue() and log.getvalue() == "work: 4/4 (0 s)\n"
    try:
        import tqdm  # noqa: F401
    except ImportError:
        return
    tty = _Terminal()
    assert list(_report.progress(range(4), 4, "work", stream=tty)) == [0, 1, 2, 3]
    assert "\r" in tty.getvalue()  # tqdm draws its bar on a terminal
