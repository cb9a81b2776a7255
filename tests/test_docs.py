"""The README's op list is the op table's, and its examples run."""

from __future__ import annotations

import re
from pathlib import Path

from multiact.tools import docs

README = Path(__file__).resolve().parent.parent / "README.md"
CI = README.parent / ".ci" / "run"


def test_readme_op_table_is_generated_from_the_op_table():
    text = README.read_text()
    assert docs.render(text) == text, "README op table is stale: run `python -m multiact.tools.docs`"


def test_readme_examples_run():
    text = README.read_text()
    examples = re.findall(r"```python\n(.*?)```", text, re.S)
    ns: dict = {}
    for example in examples:  # in order, sharing names, as a reader runs them
        exec(compile(example, "README example", "exec"), ns)


def test_ci_runs_the_readme_test_command():
    """CI runs what the README tells a user to run (its pytest line, options included)."""
    m = re.search(r'pip install -e "(\.\[[\w,]+\])" && (python -m pytest[^#\n]*?)\s*#', README.read_text())
    extras, readme = m.groups()
    ci = [line.strip() for line in CI.read_text().splitlines() if line.startswith("python -m pytest")]
    assert ci == [readme]
    assert f'pip install -q -e "{extras}"' in CI.read_text()  # and installs the same extras
