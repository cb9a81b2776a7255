"""The shared vocabulary: dtypes, directions, ISAs and architectures, each stated once.

Beside the op definitions (`multiact._opdefs`) and like them standard library only, so that the cffi build
(`native/kernels.py`, which loads this file by path before NumPy or multiact exist) reads the same tables as
the package.  Everything that names a dtype, a direction or an ISA reads it here: the kernel table and the C
runtime's ISA table (generated into `ma_isa_list.h`), the backends' coverage, the commands' options and their
messages, `multiact info`.  `tests/test_vocab.py` fails when a module restates one of these lists by hand.

- `DTYPES`: the storage dtypes, in the order messages list them; each with the dtype its kernels compute in,
  its tag in C symbols, C element type, item size and the spellings commands accept (`dtype()` resolves one).
- `DIRECTIONS`: what a kernel computes (forward, backward, ... second order), with its array arguments.
- `ISAS`: the native kernels' instruction sets, best first (the order the `native` backend prefers), each
  with its architecture and the CPU flags it needs; `ARCHES`: the architectures, their other spellings and
  the SIMD flags `multiact info` reports.
"""

from __future__ import annotations

import platform
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

__all__ = ["ARCHES", "BASELINE", "DIRECTIONS", "DTYPES", "DTYPE_NAMES", "DTYPE_TEXT", "FIRST_ORDER", "ISAS",
           "NUMPY_DTYPES", "Arch", "Direction", "Dtype", "ISA", "arch", "direction", "dtype", "dtypes", "isa",
           "isas_of"]


def _listing(names: Iterable[str], last: str = "or") -> str:
    """'a, b, c or d'."""
    names = list(names)
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} {last} {names[-1]}"


# ---- dtypes --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Dtype:
    """A storage dtype: how arrays hold it, and how the kernels treat it."""

    name: str  # NumPy's name (ml_dtypes' for bfloat16), and torch's after "torch."
    compute: str  # what the kernels compute in: the half types widen to float32 and round once on the store
    ctag: str  # its tag in C kernel symbols: ma_<ctag>_<kernel>__<isa> (native/kernels.py)
    ctype: str  # the C element type of the kernels' arrays (the 16-bit types as their bits)
    itemsize: int  # bytes per element
    aliases: tuple[str, ...] = ()  # other spellings commands accept (the name and the C tag always)
    needs: str | None = None  # the package NumPy arrays of it need (None: NumPy's own dtype)

    @property
    def spellings(self) -> tuple[str, ...]:
        """Every spelling `dtype()` accepts for it, the name first."""
        return tuple(dict.fromkeys((self.name, self.ctag, *self.aliases)))

    @property
    def half(self) -> bool:
        """Computed in a wider type and rounded once to this one (float16, bfloat16)."""
        return self.compute != self.name


DTYPES: dict[str, Dtype] = {d.name: d for d in (
    Dtype("float16", "float32", "f16", "uint16_t", 2, ("fp16", "half")),
    Dtype("bfloat16", "float32", "bf16", "uint16_t", 2, (), needs="ml_dtypes"),
    Dtype("float32", "float32", "f32", "float", 4, ("fp32", "single")),
    Dtype("float64", "float64", "f64", "double", 8, ("fp64", "double")),
)}
DTYPE_NAMES: tuple[str, ...] = tuple(DTYPES)
# The dtypes NumPy has itself (the consistency suite's; bfloat16 arrays need ml_dtypes).
NUMPY_DTYPES: tuple[str, ...] = tuple(n for n, d in DTYPES.items() if d.needs is None)
# For messages: "float16, bfloat16, float32 or float64".
DTYPE_TEXT = _listing(DTYPE_NAMES)
_SPELLED = {s: d for d in DTYPES.values() for s in d.spellings}


def dtype(spelling: Any) -> Dtype:
    """The dtype a spelling names: a name, C tag or alias ('float32', 'f32', 'fp32'; any case), a NumPy dtype
    or scalar type, a torch dtype.  ValueError listing the valid names otherwise."""
    text = spelling if isinstance(spelling, str) else getattr(spelling, "name", None)
    if not isinstance(text, str):
        text = getattr(spelling, "__name__", None) or str(spelling)
    key = text.strip().lower().removeprefix("torch.")
    if key not in _SPELLED:
        raise ValueError(f"unknown dtype {spelling!r}; valid dtypes: {', '.join(DTYPE_NAMES)}")
    return _SPELLED[key]


def dtypes(spellings: Iterable[Any]) -> list[str]:
    """The names of the dtypes spelled (`dtype()`), each once, in the order given."""
    return list(dict.fromkeys(dtype(s).name for s in spellings))


# ---- directions ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Direction:
    """What a kernel computes: its array arguments (in order; the result comes after them) and derivative
    order.  `function` is the public generic function that reaches it (`ma.<function>`)."""

    name: str
    arrays: tuple[str, ...]
    order: int  # 0: the function itself; 1: a first derivative; 2: a second
    function: str
    summed: bool = False  # the result is summed to the parameter's shape (no out=), not one per element

    @property
    def arity(self) -> int:
        return len(self.arrays)


DIRECTIONS: dict[str, Direction] = {d.name: d for d in (
    Direction("forward", ("x",), 0, "forward"),
    Direction("backward", ("dy", "x"), 1, "backward"),
    Direction("backward_y", ("dy", "y"), 1, "backward"),  # from the output: backward(..., y=y)
    Direction("param_grad", ("dy", "x"), 1, "param_grad", summed=True),  # in the learnable parameter
    Direction("backward2", ("g", "dy", "x"), 2, "backward2"),  # g * dy * f''(x)
    Direction("param_grad2", ("g", "dy", "x"), 2, "param_grad2"),  # g * dy * d2f/dx dp (wrt="x")
    Direction("param_grad2_param", ("g", "dy", "x"), 2, "param_grad2"),  # g * dy * d2f/dp2 (wrt=the parameter)
)}
# The function and its first derivatives: what an op definition says it has.
FIRST_ORDER: tuple[str, ...] = tuple(n for n, d in DIRECTIONS.items() if d.order <= 1)


def direction(name: str) -> Direction:
    """The direction of this name; ValueError listing the valid ones otherwise."""
    if name not in DIRECTIONS:
        raise ValueError(f"unknown direction {name!r}; valid directions: {', '.join(DIRECTIONS)}")
    return DIRECTIONS[name]


# ---- architectures and ISAs ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Arch:
    """A CPU architecture as platform.machine() names it (lowercase)."""

    name: str
    aliases: tuple[str, ...]  # other names platforms give it
    flags: tuple[str, ...]  # the SIMD flags `multiact info` reports (Linux /proc/cpuinfo's names), in its order


ARCHES: dict[str, Arch] = {a.name: a for a in (
    Arch("x86_64", ("amd64",), ("sse4_2", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512dq", "avx512vl",
                                "avx512_bf16", "avx512_fp16")),
    # "asimd" is NEON, "asimdhp" its FP16 arithmetic
    Arch("aarch64", ("arm64",), ("asimd", "asimdhp", "fphp", "bf16", "sve", "sve2")),
)}
_ARCH_NAMES = {s: a.name for a in ARCHES.values() for s in (a.name, *a.aliases)}


def arch(machine: str | None = None) -> str:
    """The architecture's name for a machine name (this machine's when None): amd64 -> x86_64, arm64 ->
    aarch64; an unknown one as given, lowercased."""
    m = (machine or platform.machine()).lower()
    return _ARCH_NAMES.get(m, m)


@dataclass(frozen=True)
class ISA:
    """An instruction set the native kernels are compiled for (native/src/isa_<name>.c)."""

    name: str
    arch: str | None  # None: portable C, built on every architecture
    flags: tuple[str, ...]  # CPU flags it needs (/proc/cpuinfo's names; ma_runtime.c tests them by CPUID, HWCAP)


# Best first: the `native` backend runs the first one this machine runs (MULTIACT_NATIVE_ISA forces another).
ISAS: dict[str, ISA] = {i.name: i for i in (
    ISA("avx512", "x86_64", ("avx512f", "avx512bw", "avx512dq", "avx512vl")),
    ISA("avx2", "x86_64", ("avx2", "fma", "f16c")),
    # Advanced SIMD is part of every ARMv8-A (ma_runtime.c still asks Linux for HWCAP_ASIMD)
    ISA("neon", "aarch64", ()),
    ISA("scalar", None, ()),
)}
# The ISA every build has, on every architecture: the reference the SIMD kernels are checked against.
BASELINE: str = next(n for n, i in ISAS.items() if i.arch is None)


def isa(name: str) -> ISA:
    """The ISA of this name; ValueError listing the valid ones otherwise."""
    if name not in ISAS:
        raise ValueError(f"unknown ISA {name!r}; valid ISAs: {', '.join(ISAS)}")
    return ISAS[name]


def isas_of(arch_name: str | None = None) -> tuple[str, ...]:
    """The ISAs built on an architecture (this machine's when None), baseline first (the build's order, the
    reverse of the preference); just the baseline on an architecture without SIMD kernels."""
    a = arch(arch_name)
    return tuple(reversed([n for n, i in ISAS.items() if i.arch in (None, a)]))

