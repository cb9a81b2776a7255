"""Kernels of an ISA this machine cannot run, for the accuracy sweeps: the C harness built for that ISA
answers requests over a pipe (native/tests/harness.c --serve), e.g. the NEON build under qemu-aarch64 or the
AVX-512 build on SIMDe's emulation, while the reference and the judging stay on the host
(`multiact check --subset | --dense --isa neon --serve`).

The harness holds every elementwise float32 kernel of its ISA (not prelu, whose kernel takes a weight
array); the host's native table gives each kernel's C name and packed parameters, which do not depend on
the ISA."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
# How each ISA's harness is built and run here, and the build's optimisation level (HARNESS_OPT overrides it):
# NEON cross-compiled and run under qemu-aarch64 at -O2 (the CI harness's -O0 build computes the same bits, the
# same IEEE semantics at any level, only slower); AVX-512 on SIMDe's emulation of it (the script's -O1).
COMMANDS = {
    "neon": ("scripts/test_native_harness.sh neon aarch64-linux-gnu-gcc qemu-aarch64 -cpu max", "-O2"),
    "avx512": ("scripts/test_native_harness.sh avx512-simde gcc", None),
}
_servers: dict[tuple[str, str], subprocess.Popen] = {}


@dataclass(frozen=True)
class ServedISA:
    """One ISA's kernels behind a command that starts the harness's server (picklable: each sweep worker
    process starts its own server on first use)."""

    isa: str
    command: str
    opt: str | None = None  # the harness build's HARNESS_OPT (None: the script's default)

    @property
    def label(self) -> str:
        return f"native/{self.isa} (served)"

    def _server(self) -> subprocess.Popen:
        key = (self.isa, self.command)
        proc = _servers.get(key)
        if proc is None or proc.poll() is not None:
            env = {"PYTHON": sys.executable, **os.environ, "HARNESS_ARGS": "--serve"}
            if self.opt and "HARNESS_OPT" not in os.environ:
                env["HARNESS_OPT"] = self.opt
            proc = subprocess.Popen(shlex.split(self.command), cwd=ROOT, stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, env=env)
            _servers[key] = proc
        return proc

    def run(self, key: str, direction: str, p: dict[str, Any], *ins: np.ndarray) -> np.ndarray:
        """The ISA's float32 kernel for (key, direction) on ins (x; dy and x, or dy and y; backward2: g, dy and x),
        p validated."""
        from ..backend import native_backend

        cname, _, signature, names, _ = native_backend.entry(key, direction, "float32")  # the host's row
        if signature not in ("unary", "binary", "ternary"):
            raise NotImplementedError(f"{self.label}: the {signature} kernel {cname} is not served")
        vals = [float(np.float32(p[n])) for n in names] + [0.0] * (4 - len(names))
        n = ins[0].size
        proc = self._server()
        head = f"ma_f32_{cname}__{self.isa} {n} " + " ".join(v.hex() for v in vals) + "\n"
        try:
            proc.stdin.write(head.encode() + b"".join(np.ascontiguousarray(a, np.float32).tobytes() for a in ins))
            proc.stdin.flush()
            raw = proc.stdout.read(4 * n)
        except BrokenPipeError:
            raw = b""
        if len(raw) != 4 * n:
            raise RuntimeError(f"{self.label}: the server ({self.command}) stopped (exit status {proc.wait()}) "
                               f"on {cname} {direction}")
        return np.frombuffer(raw, np.float32).copy()


def served(isa: str, command: str | None = None) -> ServedISA:
    """The served ISA, by its default command (COMMANDS) unless one is given."""
    opt = None
    if command is None:
        if isa not in COMMANDS:
            raise SystemExit(f"multiact check --serve: no harness command for ISA {isa!r} (known: "
                             f"{', '.join(COMMANDS)})")
        command, opt = COMMANDS[isa]
    if not (ROOT / "scripts" / "test_native_harness.sh").exists():
        raise SystemExit(f"multiact check --serve: the C harness builds from a source checkout ({ROOT} has no "
                         "scripts/test_native_harness.sh)")
    return ServedISA(isa, command, os.environ.get("HARNESS_OPT", opt))
