"""A griffe extension for the API reference: multiact generates most of its public functions at import time
(from the op table), so static analysis cannot see them.  For each module named here, the names of its
`__all__` that the static pass did not find are inspected from the live module (their real signatures and
docstrings).  Everything else stays static, and nothing but the listed modules is imported."""

from __future__ import annotations

import importlib
from typing import Any

import griffe


class PublicNames(griffe.Extension):
    def __init__(self, modules: tuple[str, ...] = ("multiact", "multiact.torch")) -> None:
        self.modules = set(modules)

    def on_module(self, *, mod: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        if mod.path not in self.modules:
            return
        live = importlib.import_module(mod.path)
        missing = [name for name in getattr(live, "__all__", ()) if name not in mod.members]
        if not missing:
            return
        inspected = griffe.inspect(mod.path, docstring_parser=None)
        for name in missing:
            mod.set_member(name, inspected.members[name])
