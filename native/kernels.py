"""The kernel table of multiact._native: (op, direction, dtype, ISA) -> C symbol.

Read by the cffi builder (which generates the C X-macro list and the cdef from it), by the
`native` backend (which looks symbols up here) and by the tests (which run every row).  It
imports nothing but the standard library, so the builder can load it before multiact exists.

C names: `ma_<dtype>_<cname>__<isa>`, e.g. `ma_f32_gelu_tanh__avx2`, `ma_f16_sigmoid_grad_y__neon`.
"""

from __future__ import annotations

import os
import platform
import re
from typing import NamedTuple

DTYPES = {"float32": "f32", "float16": "f16"}
ISAS_BY_ARCH = {"x86_64": ("scalar", "avx2"), "aarch64": ("scalar", "neon")}
ARCH_ALIASES = {"amd64": "x86_64", "arm64": "aarch64"}

# Elementwise C kernels: name -> arity (1: x -> y; 2: (dy, x or y) -> dx).
UNARY = (
    "relu", "relu6", "leaky_relu", "hardtanh", "hardswish", "hardsigmoid", "softshrink", "hardshrink",
    "threshold", "elu", "selu", "celu", "sigmoid", "logsigmoid", "tanh", "softplus", "softsign",
    "swish", "silu", "fast_gelu", "gelu_tanh", "gelu", "mish", "tanhshrink",
)
BINARY = (
    "relu_grad", "relu6_grad", "leaky_relu_grad", "hardtanh_grad", "hardswish_grad", "hardsigmoid_grad",
    "shrink_grad", "threshold_grad", "elu_grad", "elu_grad_y", "selu_grad", "selu_grad_y", "celu_grad",
    "celu_grad_y", "sigmoid_grad", "sigmoid_grad_y", "logsigmoid_grad", "tanh_grad", "tanh_grad_y",
    "softplus_grad", "softsign_grad", "swish_grad", "silu_grad", "fast_gelu_grad", "gelu_tanh_grad",
    "gelu_grad", "mish_grad", "tanhshrink_grad",
)

# A kernel's time per element relative to relu's (in cache, AVX2 on the project's Zen 1, where relu
# takes ~0.21 ns: after the four-vector steps, rounded); unlisted kernels (piecewise linear) cost 1.
# The runtime threads a call once elements x cost reach its parallel minimum (256K: where a second
# thread gives relu 1.38x here; at 128K 1.12x), so that expensive kernels go parallel at smaller sizes
# (measured break-even for gelu and sigmoid: ~12K elements; they now start at 21K and 51K).
COST = {
    "elu": 5, "selu": 5, "celu": 7, "sigmoid": 5, "logsigmoid": 8, "tanh": 6, "softplus": 10, "swish": 7,
    "silu": 5, "fast_gelu": 6, "gelu_tanh": 8, "gelu": 12, "mish": 7, "tanhshrink": 13,
    "elu_grad": 8, "selu_grad": 8, "celu_grad": 8, "sigmoid_grad": 7, "logsigmoid_grad": 7, "tanh_grad": 6,
    "softplus_grad": 7, "swish_grad": 7, "silu_grad": 8, "fast_gelu_grad": 7, "gelu_tanh_grad": 11,
    "gelu_grad": 15, "mish_grad": 10, "tanhshrink_grad": 6,
    "swish_beta_grad": 63,  # a double exp per element (a sum, kept in double)
}

# (public op, direction) -> C name; gelu's variant depends on `approximate` (see cname()).
_GRAD = {"softshrink": "shrink_grad", "hardshrink": "shrink_grad"}
# Ops whose backward_y is the same formula as the backward (y > 0 <=> x > 0 and so on).
_Y_SAME = ("relu", "relu6", "leaky_relu", "hardtanh")
_Y_OWN = ("elu", "selu", "celu", "sigmoid", "tanh")
SPECIAL = {("prelu", "forward"): "prelu", ("prelu", "backward"): "prelu",
           ("prelu", "param_grad"): "prelu_weight_grad", ("swish", "param_grad"): "swish_beta_grad"}

# Parameter block (ma_params a, b, c, d) per C name prefix: which op parameter goes where.
PARAMS = {
    "leaky_relu": ("negative_slope",), "elu": ("alpha",), "celu": ("alpha",), "swish": ("beta",),
    "hardtanh": ("min_val", "max_val"), "softplus": ("beta", "threshold"), "softshrink": ("lambd",),
    "hardshrink": ("lambd",), "shrink": ("lambd",), "threshold": ("threshold", "value"),
}


class Kernel(NamedTuple):
    op: str  # public op name (gelu rows carry the variant in cname)
    direction: str  # forward | backward | backward_y | param_grad
    dtype: str  # float32 | float16
    isa: str
    cname: str
    symbol: str
    signature: str  # unary | binary | prelu | prelu_weight_grad | swish_beta_grad


def arch(machine: str | None = None) -> str:
    m = (machine or platform.machine()).lower()
    return ARCH_ALIASES.get(m, m)


def isas(machine: str | None = None) -> tuple[str, ...]:
    """ISAs compiled into the extension on this architecture (scalar everywhere)."""
    return ISAS_BY_ARCH.get(arch(machine), ("scalar",))


def symbol(cname: str, dtype: str, isa: str) -> str:
    return f"ma_{DTYPES[dtype]}_{cname}__{isa}"


def cname(op: str, direction: str, approximate: str = "none") -> str | None:
    """The C kernel name for a public (op, direction), or None where there is none."""
    if (op, direction) in SPECIAL:
        return SPECIAL[(op, direction)]
    base = "gelu_tanh" if op == "gelu" and approximate == "tanh" else op
    if direction == "forward":
        return base if base in UNARY else None
    if direction == "backward":
        name = _GRAD.get(op, base + "_grad")
        return name if name in BINARY else None
    if direction == "backward_y":
        if op in _Y_SAME:
            return base + "_grad"
        return base + "_grad_y" if op in _Y_OWN else None
    return None


def _signature(name: str) -> str:
    if name in UNARY:
        return "unary"
    if name in BINARY:
        return "binary"
    return {"prelu": "prelu", "prelu_weight_grad": "prelu_weight_grad", "swish_beta_grad": "swish_beta_grad"}[name]


def _public_rows() -> list[tuple[str, str, str]]:
    ops = sorted({*(n for n in UNARY if n != "gelu_tanh"), "prelu", "softshrink", "hardshrink"})
    rows = []
    for op in ops:
        for direction in ("forward", "backward", "backward_y", "param_grad"):
            for approx in (("none", "tanh") if op == "gelu" else ("none",)):
                name = cname(op, direction, approx)
                if name is not None and (op, direction, name) not in rows:
                    rows.append((op, direction, name))
    return rows


def table(machine: str | None = None) -> list[Kernel]:
    """Every kernel in the extension for this architecture."""
    return [
        Kernel(op, direction, dtype, isa, name, symbol(name, dtype, isa), _signature(name))
        for isa in isas(machine)
        for dtype in DTYPES
        for op, direction, name in _public_rows()
    ]


def split_kernels(ops_header: str | None = None) -> frozenset[str]:
    """Kernels with a fast path: the names of ma_ops.h's top-level MA_SPLIT_UNARY / MA_SPLIT_BINARY
    lines, and both directions of each MA_GATE_OPS line (the loops test a step of vectors for it at
    once; see ma_kernels.inc)."""
    path = ops_header or os.path.join(os.path.dirname(os.path.abspath(__file__)), "src", "ma_ops.h")
    with open(path) as f:
        text = f.read()
    gates = re.findall(r"^MA_GATE_OPS\((\w+),", text, flags=re.M)
    split = re.findall(r"^MA_SPLIT_(?:UNARY|BINARY)\((\w+),", text, flags=re.M)
    return frozenset(split + gates + [g + "_grad" for g in gates])


def x_macro_header() -> str:
    """ma_kernel_list.h: the elementwise kernels for the C side, MA_UNARY(name, kind) /
    MA_BINARY(name, kind) with kind `split` (has a fast path) or `plain`."""
    split = split_kernels()
    unknown = split - set(UNARY) - set(BINARY)
    if unknown:
        raise ValueError(f"ma_ops.h splits kernels the table lacks: {sorted(unknown)}")
    kind = {n: "split" if n in split else "plain" for n in (*UNARY, *BINARY)}
    lines = [f"    MA_UNARY({n}, {kind[n]})" for n in UNARY] + [f"    MA_BINARY({n}, {kind[n]})" for n in BINARY]
    body = " \\\n".join(lines)
    return f"/* Generated from native/kernels.py; do not edit. */\n#define MA_KERNEL_LIST \\\n{body}\n"


_SIGS = {
    "unary": "void {s}(const {t} *x, {t} *y, size_t n, const ma_params *p);",
    "binary": "void {s}(const {t} *dy, const {t} *x, {t} *dx, size_t n, const ma_params *p);",
    "prelu": "void {s}(const {t} *dy, const {t} *x, {t} *y, size_t outer, size_t c, size_t inner, "
             "const float *w, int nthreads);",
    "prelu_weight_grad": "void {s}(const {t} *dy, const {t} *x, size_t outer, size_t c, size_t inner, double *acc);",
    "swish_beta_grad": "double {s}(const {t} *dy, const {t} *x, size_t n, float beta, unsigned cost, int nthreads);",
}


def params_of(name: str) -> tuple[str, ...]:
    """Op parameters packed into ma_params (a, b, ...) for C kernel `name`."""
    for prefix, names in PARAMS.items():
        if name == prefix or name.startswith(prefix + "_"):
            return names
    return ()


def table_text(machine: str | None = None) -> str:
    """The table as text, one kernel a line (its fields, packed parameters, cost), embedded in the
    extension for the backend."""
    rows = [" ".join([*k, ",".join(params_of(k.cname)) or "-", str(COST.get(k.cname, 1))]) for k in table(machine)]
    return "\n".join(rows) + "\n"


def declarations(machine: str | None = None) -> str:
    """C prototypes of every kernel (for the cffi cdef and the C test harness)."""
    seen, lines = set(), []
    for k in table(machine):
        if k.symbol not in seen:
            seen.add(k.symbol)
            t = "float" if k.dtype == "float32" else "uint16_t"
            lines.append(_SIGS[k.signature].format(s=k.symbol, t=t))
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    import sys

    if sys.argv[1:2] == ["--header"]:
        sys.stdout.write(x_macro_header())
    elif sys.argv[1:2] == ["--decls"]:
        sys.stdout.write(declarations(sys.argv[2] if len(sys.argv) > 2 else None))
    else:
        for k in table():
            print(*k)
