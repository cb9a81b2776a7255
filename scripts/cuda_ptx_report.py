#!/usr/bin/env python3
"""Compile every kernel the `cuda` backend can launch to PTX without a GPU, assemble it, and report.

The simulator compiles nothing, so a kernel that does not type, that does float64 arithmetic where
float32 was meant, or that spills to local memory passes every simulated test.  This script builds
each kernel of `cuda_backend.builds()` (every formula x inputs x layout x dtype, the parameter-gradient
reductions, fill and cast) from the very Python function the backend hands to `cuda.jit`, with the
argument types its launches pass, through numba-cuda's driverless path (`compile_ptx`'s steps, one
front end for all targets); counts the PTX instructions by type; counts the float64 arithmetic and
names the formulas.py function it comes from; notes whether loads are vectorised; and assembles the
PTX with `ptxas -v` (nvJitLink where there is no ptxas) for registers, spills and stack.

Findings (exit status 1):
- a compile or assembly error;
- any float64 arithmetic in a float16/float32 kernel (PTX `.f64` ops other than moves, loads, stores,
  conversions and selects; compares count), but in the kernels `F64_ALLOWED` names with its reason;
- an implicit float16/float32 -> float64 promotion anywhere, allowed kernels included (numba's typed IR:
  a bare float literal, a float64 parameter or a float64 constant meeting float32 math, float32 * int,
  a math call typed float64 only);
- any spill, or a stack frame (local memory).

    python scripts/cuda_ptx_report.py [--target 90] [--target 80:representative] [--out DIR] [--lenient-f64]
                                      [--family all|sample|none] [--only REGEX]

--lenient-f64 reports float64 arithmetic without failing it (only implicit promotions fail).

A target is a compute capability, optionally `:representative` (one kernel per formula: strided, float16
data where that exists), `:sample` (that one and one more variant per formula, in turn: CI's sm_90 set) or
`:thin` (every third formula's representative: CI's sm_80 set) instead of all.  Default: sm_90 and sm_80, all kernels.
`--family sample` keeps only a sample of the composite-family kernels (gated:<act>, 6 per activation
key: about 3 s each to compile, so CI takes `family_sample`'s 10; the default compiles all of them).
"""

from __future__ import annotations

import argparse
import ast
import json
import linecache
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from multiact import vocab

TYPES = {"pred", "b8", "b16", "b32", "b64", "u8", "u16", "u32", "u64", "s8", "s16", "s32", "s64",
         "f16", "f16x2", "bf16", "bf16x2", "f32", "f64"}
NOT_ARITH = {"mov", "ld", "st", "cvt", "cvta", "selp"}  # moves, memory, conversions and selects: not f64 math
PTXAS_PATHS = ("/usr/local/bin/ptxas", "/usr/local/cuda/bin/ptxas")
LAYOUT_ORDER = {"strided": 0, "contiguous": 1, "rows": 2}
DTYPE_ORDER = {d: i for i, d in enumerate(vocab.DTYPE_NAMES)}

# Kernels of float16/float32 data that may do float64 arithmetic, by the suffix of their source, with the reason.
# Every elementwise and composite-family kernel computes in float32 (formulas.py; formulas.WIDE is empty).
F64_ALLOWED: dict[str, str] = {
    "_param_grad": "a parameter gradient is a reduction over the whole tensor into a float64 accumulator "
                   "(float64 per-element term, float64 atomics): float32 accumulation over n elements would "
                   "lose log2(n) bits; one such kernel per call, bound by memory",
    "_db_sums": "bias_act's backward sums db and dscale per channel over every other axis: float64 per thread, "
                "a float64 block reduction in shared memory and a float64 second stage (float32 would lose "
                "log2(elements per channel) bits); the per-element math stays float32",
}


def f64_allowance(source: str) -> str | None:
    """Why kernel source `source` may do float64 arithmetic on float16/float32 data, or None: it may not."""
    return next((why for suffix, why in F64_ALLOWED.items() if source.endswith(suffix)), None)


# ---- what to compile -------------------------------------------------------------------------------------


def parse_target(text: str) -> tuple[tuple[int, int], str]:
    """'90', 'sm_90', '90:representative', '90:sample' or '80:thin' -> ((9, 0), the selection's name)."""
    cc, _, which = text.removeprefix("sm_").partition(":")
    which = which or "full"
    if which not in SELECTIONS or not cc.isdigit() or len(cc) < 2:
        raise argparse.ArgumentTypeError(f"bad target {text!r}: use e.g. 90, 80:representative or 90:sample")
    return (int(cc[:-1]), int(cc[-1])), which


def representative(builds: list) -> list:
    """One kernel per formula: the strided one (index arithmetic on top), with the narrowest data type."""
    best: dict[str, Any] = {}
    for b in builds:
        key = (LAYOUT_ORDER[b.layout], DTYPE_ORDER[b.dtype])
        if b.source not in best or key < (LAYOUT_ORDER[best[b.source].layout], DTYPE_ORDER[best[b.source].dtype]):
            best[b.source] = b
    return list(best.values())


# The second-order kernels (backward2, g * dy * f''(x): 17 formulas x 6 forms, about 4 s each to compile) in CI's
# selections: the representative kernel (float16, strided) of the two heaviest formulas on sm_90's `sample`, none on
# sm_80's `thin`; every one of them in the full lists (`representative` has each formula's).
BACKWARD2_SAMPLE = ("gelu_tanh_grad2", "mish_grad2")


def _second_order(b: Any) -> bool:
    return any(u.endswith(" backward2") for u in b.uses)


def sample(builds: list) -> list:
    """Two kernels per formula (CI's sm_90 selection): the representative one and one more variant, taken in
    turn from the formula's (layout, dtype) variants, so every layout x dtype is compiled for about a sixth of
    the formulas and every formula in two of its forms; about a third of `full`'s compile time.  Of the second-order
    formulas only `BACKWARD2_SAMPLE`'s representative kernels."""
    second = [b for b in representative([b for b in builds if _second_order(b)]) if b.source in BACKWARD2_SAMPLE]
    builds = [b for b in builds if not _second_order(b)]
    rep = {b.name for b in representative(builds)} | {b.name for b in second}
    variants: dict[str, list] = {}
    for b in builds:
        variants.setdefault(b.source, []).append(b)
    extra = set()
    for i, vs in enumerate(variants.values()):
        others = sorted((b for b in vs if b.name not in rep),
                        key=lambda b: (LAYOUT_ORDER[b.layout], DTYPE_ORDER[b.dtype]))
        if others:
            extra.add(others[i % len(others)].name)
    return [b for b in (*builds, *second) if b.name in rep or b.name in extra]


def thin(builds: list) -> list:
    """Every third formula's representative kernel (CI's sm_80 set: sm_80 differs from sm_90 in the assembler's
    target, not in what numba generates); no second-order formula."""
    return representative([b for b in builds if not _second_order(b)])[::3]


SELECTIONS = {"full": list, "representative": representative, "sample": sample, "thin": thin}


def family_sample(builds: list) -> list:
    """The composite-family kernels CI compiles (`--family sample`): for every third gated key and any whose
    kernels compute in float64 (formulas.WIDE; none now), the backward in float16 data, strided (it holds the
    activation's forward and backward formulas and five operands: the most registers)."""
    fam = [b for b in builds if b.family == "gated"]
    keys = list(dict.fromkeys(b.source for b in fam))
    wide = {b.source for b in fam if b.compute == "float64" and b.dtype != "float64"}
    pick = wide | set(keys[::3])
    return representative([b for b in fam if b.source in pick]) + bias_act_sample(builds) + quant_sample(builds)


# bias_act (issue 16): 360 kernels (every key x forward, backward, backward_y where it exists x dtype x layout:
# "strided", one block per channel, and "rows", a warp on consecutive channels for dim=-1) of 5-D index arithmetic;
# CI compiles these three (a heavy formula's backward in the rows layout and the y form in the strided one, each
# with its float64 block reduction, in float16 data; a rows forward) and the three second-stage sums kernels;
# `--only bias_act --family all` compiles all of them (tests/test_bias_act_ptx.py under MULTIACT_TEST_FULL=1;
# results/cuda-ptx-bias_act.md).
BIAS_ACT_SAMPLE = ("bias_act:gelu.backward.float16.rows", "bias_act:sigmoid.backward_y.float16.strided",
                   "bias_act:gelu_tanh.forward.float16.rows")


def bias_act_sample(builds: list) -> list:
    return [b for b in builds if b.family == "bias_act" and b.name in BIAS_ACT_SAMPLE]


# quant= (issue 46): the quantizing kernels `builds()` lists (every elementwise forward formula's group kernel; for
# silu every kind x target x input dtype; the gated family's group kernel per key); CI compiles these five: a
# group kernel (warp shuffles, e4m3fn bits) in float32, a row kernel (shuffles and the cross-warp step, e5m2) on
# bfloat16 bits, an MX kernel (E8M0) in float16, the tensor amax (int32 atomic max) and apply (int8) kernels, and
# swiglu's group kernel; `--only quant: --family all` compiles all of them (results/cuda-ptx-quant.md).
QUANT_SAMPLE = ("quant:silu.group32.float8_e4m3fn.float32.strided", "quant:silu.row.float8_e5m2.bfloat16.strided",
                "quant:silu.mx.float8_e4m3fn.float16.strided", "quant:silu.amax.any.float16.strided",
                "quant:silu.tensor.int8.float32.strided", "quant:gated:silu.group32.float8_e4m3fn.float16.strided")


def quant_sample(builds: list) -> list:
    return [b for b in builds if b.family == "quant" and b.name in QUANT_SAMPLE]


def formula_functions(path: str) -> list[tuple[int, int, str]]:
    """(first line, last line, name) of each function in formulas.py, to name where PTX instructions come from."""
    tree = ast.parse(Path(path).read_text())
    return [(n.lineno, n.end_lineno or n.lineno, n.name) for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]


# ---- reading PTX -----------------------------------------------------------------------------------------


def instructions(ptx: str):
    """(opcode, source line or None) of each instruction, in order."""
    line = None
    for raw in ptx.splitlines():
        s = raw.strip()
        if s.startswith(".loc"):
            line = int(s.split()[2])
            continue
        if not s or s[0] in ".{}/$" or s.endswith(":") or s.startswith(")"):
            continue
        if s.startswith("@"):
            s = s.split(None, 1)[1]
        yield s.split(None, 1)[0].rstrip(";"), line


def op_key(opcode: str) -> tuple[str, str, str]:
    """('fma', '', 'f32'), ('ld', 'global', 'f32'), ...: the base, the state space of a load/store, the type."""
    parts = opcode.split(".")
    space = next((p for p in parts[1:] if p in ("global", "shared", "local", "param", "const")), "")
    ty = next((p for p in reversed(parts) if p in TYPES), "")
    return parts[0], space if parts[0] in ("ld", "st", "atom", "red") else "", ty


def attribute(line: int | None, scaffold_end: int, funcs: list) -> str:
    """The function an instruction comes from.

    The formulas are inlined at numba's IR level, so their lines keep formulas.py's numbers under the kernel's
    file name; the kernel's own source (the grid-stride loop) is its first few lines.
    """
    if line is None or line <= scaffold_end:
        return "kernel loop"
    return next((name for first, last, name in funcs if first <= line <= last), f"line {line}")


def analyse(ptx: str, build: Any, funcs: list) -> dict[str, Any]:
    """Instruction counts by type, float64 arithmetic and its sources, vectorised loads."""
    scaffold_end = max(ln for _, _, ln in build.pyfunc.__code__.co_lines() if ln is not None)
    counts: Counter = Counter()
    f64_from: Counter = Counter()
    f32_ops = f64_cvt = vec = 0
    for opcode, line in instructions(ptx):
        base, space, ty = op_key(opcode)
        counts[".".join(p for p in (base, space, ty) if p)] += 1
        parts = opcode.split(".")
        if base == "cvt" and "f64" in parts:
            f64_cvt += 1
        if base == "ld" and space == "global" and any(p in ("v2", "v4", "v8") for p in parts):
            vec += 1
        f32_ops += ty == "f32" and base not in NOT_ARITH
        if ty == "f64" and base not in NOT_ARITH:
            f64_from[attribute(line, scaffold_end, funcs)] += 1
    return {
        "instructions": sum(counts.values()), "counts": dict(sorted(counts.items())), "f32_ops": f32_ops,
        "f64_ops": sum(f64_from.values()), "f64_from": dict(f64_from),
        "f64_cvt": f64_cvt, "vector_loads": vec, "global_loads": sum(v for k, v in counts.items()
                                                                      if k.startswith("ld.global")),
    }


# ---- assembling ------------------------------------------------------------------------------------------


class Assembler:
    """ptxas -v where it exists, else nvJitLink (numba-cuda's CUDA toolkit); kind None: neither, PTX only.

    NVVM may stamp a newer PTX ISA version than the machine's ptxas reads; the header is then relabelled to
    ptxas's own version, which is safe: ptxas still rejects any instruction or directive it does not know.
    """

    def __init__(self, tmp: str):
        self.tmp, self.n = tmp, 0
        self.ptxas = shutil.which("ptxas") or next((p for p in PTXAS_PATHS if os.access(p, os.X_OK)), None)
        self.isa = self._ptxas_isa() if self.ptxas else None
        self.relabelled: set[str] = set()
        self.kind = "ptxas" if self.ptxas else ("nvjitlink" if self._nvjitlink() else None)

    def _ptxas_isa(self) -> str | None:
        """The newest PTX ISA this ptxas reads, from its answer to an impossible one."""
        path = os.path.join(self.tmp, "probe.ptx")
        Path(path).write_text(".version 99.9\n.target sm_80\n.address_size 64\n")
        r = subprocess.run([self.ptxas, "-arch=sm_80", path, "-o", os.devnull], capture_output=True, text=True)
        m = re.search(r"current version is '([\d.]+)'", r.stderr + r.stdout)
        return m.group(1) if m else None

    @staticmethod
    def _nvjitlink():
        try:
            from cuda.bindings import nvjitlink
        except ImportError:
            return None
        return nvjitlink

    def describe(self) -> str:
        if self.kind == "ptxas":
            out = subprocess.run([self.ptxas, "--version"], capture_output=True, text=True).stdout
            rel = re.search(r"release ([\d.]+)", out)
            note = (f"; PTX .version {', '.join(sorted(self.relabelled))} relabelled {self.isa}, the newest it reads"
                    if self.relabelled else "")
            return f"{self.ptxas} (CUDA {rel.group(1) if rel else '?'}){note}"
        if self.kind == "nvjitlink":
            major, minor = self._nvjitlink().version()
            return f"nvJitLink {major}.{minor} (no ptxas found)"
        return "none (no ptxas, no nvJitLink): PTX analysed, not assembled"

    def run(self, ptx: str, cc: tuple[int, int]) -> dict[str, Any]:
        if self.kind is None:
            return {}
        return parse_ptxas(self._ptxas(ptx, cc) if self.kind == "ptxas" else self._link(ptx, cc))

    def _ptxas(self, ptx: str, cc: tuple[int, int]) -> str:
        m = re.search(r"^\.version (\S+)", ptx, re.M)
        if m and self.isa and _vers(m.group(1)) > _vers(self.isa):
            self.relabelled.add(m.group(1))
            ptx = ptx[:m.start(1)] + self.isa + ptx[m.end(1):]
        self.n += 1
        path = os.path.join(self.tmp, f"k{self.n}.ptx")
        Path(path).write_text(ptx)
        r = subprocess.run([self.ptxas, f"-arch=sm_{cc[0]}{cc[1]}", "-v", path, "-o", os.devnull],
                           capture_output=True, text=True)
        os.unlink(path)
        return r.stderr + r.stdout + ("" if r.returncode == 0 else f"\nERROR: ptxas exit {r.returncode}")

    def _link(self, ptx: str, cc: tuple[int, int]) -> str:
        nj = self._nvjitlink()
        h = nj.create(3, [f"-arch=sm_{cc[0]}{cc[1]}", "-Xptxas=-v", "-verbose"])
        try:
            data = ptx.encode()
            nj.add_data(h, nj.InputType.PTX, data, len(data), "kernel")
            try:
                nj.complete(h)
                err = ""
            except Exception as e:  # the error log says why
                err = f"\nERROR: {e}"
            size = nj.get_info_log_size(h)
            buf = bytearray(size)
            nj.get_info_log(h, buf)
            return buf.decode(errors="replace") + err
        finally:
            nj.destroy(h)


def _vers(v: str) -> tuple[int, ...]:
    return tuple(int(p) for p in v.split("."))


def parse_ptxas(log: str) -> dict[str, Any]:
    """Registers, spill stores/loads and stack frame bytes from ptxas -v's report (one entry function)."""
    regs = re.search(r"Used (\d+) registers", log)
    frame = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", log)
    out: dict[str, Any] = {"registers": int(regs.group(1)) if regs else None}
    if frame:
        out.update(stack=int(frame.group(1)), spill_stores=int(frame.group(2)), spill_loads=int(frame.group(3)))
    if "\nERROR: " in log:
        why = [ln for ln in log.splitlines() if "fatal" in ln or "error" in ln.lower()]
        out["error"] = " / ".join(why)[:400]
    return out


# ---- the run ----------------------------------------------------------------------------------------------


def promotions(fndesc: Any) -> list[str]:
    """Every implicit float16/float32 -> float64 conversion numba's typing put into the kernel.

    An operator, comparison or call whose signature takes float64 where its operand is a float16/float32 value:
    a bare float literal or a float64 parameter meeting float32 math, float32 * int64, a math call that has only
    a float64 version.  Explicit widening (`D(x)`, `np.float64(x)`) is a cast, not a promotion, and passes.
    """
    out = set()
    for expr, sig in fndesc.calltypes.items():  # types compared by name: numba-cuda has its own ir and types
        if type(expr).__name__ != "Expr" or expr.op not in ("binop", "inplace_binop", "call") or sig is None:
            continue
        operands = list(expr.args) if expr.op == "call" else [expr.lhs, expr.rhs]
        for var, want in zip(operands, sig.args, strict=False):
            have = str(fndesc.typemap.get(getattr(var, "name", None)))
            if have in ("float16", "float32") and str(want) == "float64":
                what = getattr(expr.fn, "__name__", "call") if expr.op != "call" else "call"
                src = linecache.getline(expr.loc.filename, expr.loc.line).strip()
                out.add(f"{Path(expr.loc.filename).name}:{expr.loc.line} {what} {have}->float64: {src}")
    return sorted(out)


def compile_kernel(build: Any, ccs: list[tuple[int, int]]) -> tuple[dict[tuple[int, int], str], list[str]]:
    """PTX for each target and the implicit promotions, from one run of numba's front end.

    This is what `cuda.compile_ptx` does (compile_cuda, then the kernel fixup, then NVVM), split so that the typed
    IR stays in reach and each extra target costs only NVVM; numba lowers identically for sm_60 and up.
    cuda.jit's defaults: opt=3, no fastmath.  lineinfo adds a line table only (the instructions are the same).
    """
    from numba.cuda.compiler import compile_cuda, kernel_fixup

    with warnings.catch_warnings():  # exec'd kernel source: numba cannot find it for its line table
        warnings.filterwarnings("ignore", message=".*Could not find source for function")
        cres = compile_cuda(build.pyfunc, None, build.argtypes, lineinfo=True,
                            nvvm_options={"opt": 3, "fastmath": False}, cc=max(ccs))
        kernel_fixup(cres.library.get_function(cres.fndesc.llvm_func_name), False)
        return {cc: cres.library.get_asm_str(cc=cc) for cc in ccs}, promotions(cres.fndesc)


def findings(row: dict[str, Any], strict: bool) -> list[str]:
    """What makes this kernel fail the check."""
    if row.get("error"):
        return [f"error: {row['error']}"]
    out = []
    if row["promotions"]:
        out.append(f"{len(row['promotions'])} implicit float64 promotion(s): " + " | ".join(row["promotions"]))
    if strict and row["dtype"] != "float64" and row["f64_ops"] and not f64_allowance(row["source"]):
        where = ", ".join(f"{k} {v}" for k, v in row.get("f64_from", {}).items())
        out.append(f"{row['f64_ops']} float64 ops in a {row['dtype']} kernel ({where or 'no source line'})")
    if row.get("spill_stores") or row.get("spill_loads") or row.get("stack"):
        out.append(f"spills: {row.get('spill_stores')} B stored, {row.get('spill_loads')} B loaded, "
                   f"{row.get('stack')} B stack frame")
    return out


def selected(builds: list, targets: list) -> list[tuple[Any, list[tuple[int, int]]]]:
    """(build, the targets it is compiled for), in the backend's order."""
    chosen = {cc: {b.name for b in SELECTIONS[which](builds)} for cc, which in targets}
    out = []
    for b in builds:
        ccs = [cc for cc, _ in targets if b.name in chosen[cc]]
        if ccs:
            out.append((b, ccs))
    return out


def compile_all(targets, strict: bool, ptx_dir: str | None, only: str | None = None,
                family: str = "all") -> dict[str, Any]:
    """Compile, analyse and assemble every selected kernel for every target; one dict per kernel and target.
    `family`: the composite-family kernels (gated:<act>) to include: all, sample (`family_sample`) or none."""
    from multiact import registry

    backend = registry.module("cuda")
    from multiact.backend import formulas

    funcs = formula_functions(formulas.__file__)
    builds = [b for b in backend.builds() if not only or re.search(only, b.name)]
    if family != "all":
        keep = {b.name for b in family_sample(builds)} if family == "sample" else set()
        builds = [b for b in builds if not getattr(b, "family", "") or b.name in keep]
    rows, started = [], time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="multiact-ptx-") as tmp, ThreadPoolExecutor(2) as pool:
        asm = Assembler(tmp)
        pending: list[tuple[dict[str, Any], Future]] = []
        for b, ccs in selected(builds, targets):
            base = {"kernel": b.name, "source": b.source, "layout": b.layout, "dtype": b.dtype,
                    "compute": b.compute, "uses": list(b.uses)}
            try:
                ptxs, promoted = compile_kernel(b, ccs)
            except Exception as e:
                why = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300]}"
                rows += [{**base, "target": f"sm_{cc[0]}{cc[1]}", "error": why} for cc in ccs]
                continue
            for cc, ptx in ptxs.items():
                row = {**base, "target": f"sm_{cc[0]}{cc[1]}", "promotions": promoted, **analyse(ptx, b, funcs)}
                if ptx_dir:
                    Path(ptx_dir, f"{b.name}.{row['target']}.ptx").write_text(ptx)
                pending.append((row, pool.submit(asm.run, ptx, cc)))
                rows.append(row)
        for row, fut in pending:
            row.update(fut.result())
        assembler = asm.describe()
    rows.sort(key=lambda r: r["target"], reverse=True)  # sm_90 first; stable within a target
    for row in rows:
        row["findings"] = findings(row, strict)
    return {"rows": rows, "builds": len(builds), "seconds": round(time.perf_counter() - started, 1),
            "assembler": assembler,
            "numba_cuda": _version("numba-cuda"), "nvvm": _nvvm_version(), "strict_f64": strict, "family": family,
            "targets": [f"sm_{cc[0]}{cc[1]}:{which}" for cc, which in targets]}


def _version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return "not installed"


def _nvvm_version() -> str:
    try:
        from numba.cuda.cudadrv import nvvm

        major, minor = nvvm.NVVM().get_version()[:2]
        return f"{major}.{minor}"
    except Exception as e:
        return f"unknown ({type(e).__name__})"


# ---- writing it down -------------------------------------------------------------------------------------


def summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One line per target: kernels, errors, registers, spills, float64 and vectorised loads."""
    out = []
    for target in dict.fromkeys(r["target"] for r in rows):
        rs = [r for r in rows if r["target"] == target]
        ok = [r for r in rs if not r.get("error")]
        regs = [r["registers"] for r in ok if r.get("registers") is not None]
        narrow = [r for r in ok if r["dtype"] != "float64"]
        out.append({
            "target": target, "kernels": len(rs), "errors": len(rs) - len(ok),
            "registers": f"{min(regs)}-{max(regs)} (median {statistics.median(regs):g})" if regs else "n/a",
            "spilling": sum(bool(r.get("spill_stores") or r.get("spill_loads")) for r in ok),
            "stack": sum(bool(r.get("stack")) for r in ok),
            "f16/f32 kernels": len(narrow),
            "f64 compute": sum(r["compute"] == "float64" for r in narrow),
            "with f64 ops": sum(r["f64_ops"] > 0 for r in narrow),
            "f64 ops": sum(r["f64_ops"] for r in narrow),
            "allowed (F64_ALLOWED)": sum(r["f64_ops"] > 0 and bool(f64_allowance(r["source"])) for r in narrow),
            "implicit promotions": sum(bool(r["promotions"]) for r in ok),
            "vectorised loads": sum(r["vector_loads"] > 0 for r in ok),
            "failing": sum(bool(r["findings"]) for r in rs),
        })
    return out


def table(rows: list[dict[str, Any]], cols: list[str]) -> str:
    lines = ["| " + " | ".join(cols) + " |", "|" + " --- |" * len(cols)]
    lines += ["| " + " | ".join(str(r.get(c, "")) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def markdown(report: dict[str, Any]) -> str:
    rows = report["rows"]
    per_kernel = [{
        "kernel": r["kernel"], "target": r["target"], "compute": r["compute"], "regs": r.get("registers", ""),
        "spill B": f"{r.get('spill_stores', '')}/{r.get('spill_loads', '')}", "stack B": r.get("stack", ""),
        "instrs": r.get("instructions", ""), "f32 ops": r.get("f32_ops", ""),
        "f64 ops": r.get("f64_ops", ""), "f64 from": ", ".join(f"{k} {v}" for k, v in r.get("f64_from", {}).items()),
        "vec ld": r.get("vector_loads", ""), "findings": "; ".join(r["findings"]) or "-",
    } for r in rows]
    return "\n\n".join([
        "# cuda backend: PTX report",
        f"numba-cuda {report['numba_cuda']}, NVVM {report['nvvm']}; assembler: {report['assembler']}; "
        f"targets {', '.join(report['targets'])}; {report['seconds']} s.",
        table(summary(rows), list(summary(rows)[0])) if rows else "no kernels",
        "f64 ops count PTX float64 arithmetic (compares included; moves, loads, stores, conversions and selects "
        "not); 'f64 from' names the formulas.py function each comes from.  The grid-stride loops are unrolled "
        "by NVVM (4 + 1), so per-element counts are about a fifth.",
        table(per_kernel, list(per_kernel[0])) if per_kernel else "",
    ]) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", action="append", type=parse_target,
                    help="compute capability, e.g. 90, 80:representative or 90:sample (repeatable)")
    ap.add_argument("--out", help="write cuda-ptx-report.md and .json here")
    ap.add_argument("--ptx-dir", help="also keep every kernel's PTX here")
    ap.add_argument("--only", metavar="REGEX", help="only the kernels whose name matches")
    ap.add_argument("--lenient-f64", action="store_true",
                    help="report float64 ops in float16/float32 kernels without failing them (promotions still fail)")
    ap.add_argument("--family", choices=("all", "sample", "none"), default="all",
                    help="composite-family kernels (gated:<act>): all (default), a sample (CI), or none")
    args = ap.parse_args(argv)
    if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0"):
        print("cuda_ptx_report: unset NUMBA_ENABLE_CUDASIM (the simulator compiles nothing)", file=sys.stderr)
        return 2
    targets = args.target or [parse_target("90"), parse_target("80")]
    if args.ptx_dir:
        os.makedirs(args.ptx_dir, exist_ok=True)
    report = compile_all(targets, not args.lenient_f64, args.ptx_dir, args.only, args.family)
    text = markdown(report)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        Path(args.out, "cuda-ptx-report.md").write_text(text)
        Path(args.out, "cuda-ptx-report.json").write_text(json.dumps(report, indent=1))
    print(table(summary(report["rows"]), list(summary(report["rows"])[0])))
    print(f"{report['seconds']} s; assembler: {report['assembler']}")
    bad = [r for r in report["rows"] if r["findings"]]
    for r in bad:
        print(f"FAIL {r['kernel']} {r['target']}: {'; '.join(r['findings'])}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
