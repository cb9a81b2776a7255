"""The kernel table of multiact._native: (op, kernel key, direction, dtype, ISA) -> C symbol.

Derived from the op definitions (`multiact/_opdefs.py`) and the vocabulary of dtypes and ISAs
(`multiact/vocab.py`), both loaded by path: this module imports only the standard library, so the cffi
builder can run before multiact or NumPy exist.  Read by the builder (which generates the C X-macro list,
the cdef and the runtime's ISA list), by the `native` backend (the table is embedded in
the extension) and by the tests (which run every row).

C names: `ma_<dtype>_<cname>__<isa>`, e.g. `ma_f32_gelu_tanh__avx2`, `ma_f16_sigmoid_grad_y__neon`,
`ma_bf16_silu__scalar`, `ma_f32_silu__avx512`.
An op's elementwise kernels are its kernel keys (forward), `<key>_grad` or the op's shared backward
kernel, and `<key>_grad_y` for a backward of its own from the output; an op with an array parameter
(prelu: signature `channel`, a weight per channel) and the parameter gradients (`channel_param_grad`,
`scalar_param_grad`) have signatures of their own.

Second derivatives (direction backward2, `ma.backward2`): `<key>_grad2` for every kernel key, signature
ternary (g, dy, x) -> g dy f''(x), bodies in ma_ops2.h (prelu's takes no weight: its f'' is 0 for every one).

Composite kernels (`_opdefs.family_keys()`): one forward and one backward per family and activation
key, kernel key `gated:<act key>`, C name `Family.cname` (`gated_silu`, `gated_silu_grad`); row
`op` is the family's name.  They take 2-D strided views (rows x n, a row and an element stride per
array, see ma_native.h's ma_gshape) and run the activation's own bodies (op_<key>, op_<backward>).
bias_act (`bias_act:<act key>`, and its own `linear`) also has a backward from the forward's output,
direction backward_y, C name `bias_act_<key>_grad_y`, with the backward's signature (b and scale unread),
for linear and the keys whose activation has a backward from y.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from typing import NamedTuple


def _load(name: str):
    """multiact/<name>.py loaded by path as _multiact_<name> (once; _opdefs as _multiact_opdefs): the
    definitions and the vocabulary import only the standard library."""
    mod_name = "_multiact_" + name.lstrip("_")
    if mod_name not in sys.modules:
        path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "multiact", f"{name}.py")
        spec = importlib.util.spec_from_file_location(mod_name, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[mod_name] = mod  # dataclasses look their module up while the class is made
        spec.loader.exec_module(mod)
    return sys.modules[mod_name]


# The vocabulary (multiact/vocab.py): dtypes, directions, ISAs.
VOCAB = _load("vocab")
# Storage dtype -> its tag in C symbols (f32, f16, bf16, f64).  float16 and bfloat16 are loaded into float32,
# computed there and rounded once on the store; float64 is computed in float64 lanes, by the elementwise bodies
# that have a float64 form (float64_bodies).
DTYPES = {name: d.ctag for name, d in VOCAB.DTYPES.items()}
# The signatures that float64 has kernels of (ma_kernels64.inc).
F64_SIGNATURES = ("unary", "binary", "ternary")


_OPDEFS = _load("_opdefs")
DEFS = _OPDEFS.DEFS


def _gated_keys():
    """(family, activation, activation key) of the gated kernels native builds."""
    return [(f, d, k) for f, d, k in _OPDEFS.family_keys() if f.name == _OPDEFS.GATED.name]


# bias_act's own activation (the family's own_keys): its C bodies op_linear / op_linear_grad live in the
# bias_act section of ma_kernels.inc (the table has no identity op).
_LINEAR_BODIES = {"forward": "linear", "backward": "linear_grad"}


def _bias_keys():
    """(activation definition or None for linear, activation key) of the bias_act kernels: linear (the
    family's own) and every key of every composable activation, in definition order."""
    fam = _OPDEFS.BIAS_ACT
    return [(None, k) for k in fam.own_keys] + [(d, k) for d in DEFS if _OPDEFS.composable(d) for k in d.keys]


def _bias_bodies(d, k) -> dict[str, str]:
    return _LINEAR_BODIES if d is None else d.kernel_names(k)


def _bias_y_name(k: str) -> str:
    """The C name of bias_act's backward from y (bias_act_<key>_grad_y)."""
    return _OPDEFS.BIAS_ACT.cname(k, "backward") + "_y"


def bias_y_bodies() -> list[tuple[str, str]]:
    """(C name, the activation's y body) of every bias_act kernel from y: linear (its backward) and the keys
    whose activation has a backward from its output (the op's own body, `_grad_y`, or its backward read on y)."""
    return [(_bias_y_name(k), _bias_bodies(d, k)["backward" if d is None else "backward_y"])
            for d, k in _bias_keys() if "backward_y" in _bias_bodies(d, k) or d is None]


class Kernel(NamedTuple):
    op: str  # public op name
    key: str  # kernel key (the op's name, or its variant's: gelu_tanh)
    direction: str  # forward | backward | backward_y | backward2 | param_grad
    dtype: str  # a storage dtype of the vocabulary (float16 | bfloat16 | float32 | float64)
    isa: str
    cname: str
    symbol: str
    signature: str  # unary | binary | ternary | channel | channel_param_grad | scalar_param_grad | gated | gated_grad
    #                 | bias_act | bias_act_grad


def _grad2_name(key: str) -> str:
    """The C name of a kernel key's second derivative (ma_ops2.h's op_<key>_grad2)."""
    return f"{key}_grad2"


def zero_grad2_keys() -> tuple[str, ...]:
    """The kernel keys whose second derivative is the zero body (the definitions' piecewise_linear ops; prelu's
    for every weight, its kernel takes none): ma_kernel_list.h's MA_ZERO_GRAD2_LIST, expanded by ma_ops2.h."""
    return tuple(k for d in DEFS if d.piecewise_linear for k in d.keys)


def _channel_op(d) -> bool:
    """An op with an array parameter (a weight per channel) has kernels of its own signature."""
    return any(p.kind == "array" for p in d.params)


def _rows() -> list[tuple[str, str, str, str, str]]:
    """(op, key, direction, cname, signature) for every kernel, in definition order."""
    rows = []
    for d in DEFS:
        for key in d.keys:
            if _channel_op(d):
                rows += [(d.name, key, "forward", d.name, "channel"), (d.name, key, "backward", d.name, "channel")]
            else:
                names = d.kernel_names(key)
                rows += [(d.name, key, direction, cname, "unary" if direction == "forward" else "binary")
                         for direction, cname in names.items()]
            rows.append((d.name, key, "backward2", _grad2_name(key), "ternary"))
        if d.param_grad:
            sig = "channel_param_grad" if _channel_op(d) else "scalar_param_grad"
            rows.append((d.name, d.name, "param_grad", f"{d.name}_{d.param_grad}_grad", sig))
    for fam, _, k in _gated_keys():
        rows += [(fam.name, fam.key(k), direction, fam.cname(k, direction), fam.name + sig)
                 for direction, sig in (("forward", ""), ("backward", "_grad"))]
    fam = _OPDEFS.BIAS_ACT
    for d, k in _bias_keys():
        rows += [(fam.name, fam.key(k), direction, fam.cname(k, direction), fam.name + sig)
                 for direction, sig in (("forward", ""), ("backward", "_grad"))]
        if d is None or "backward_y" in d.kernel_names(k):  # the x form's signature, b and scale unread
            rows.append((fam.name, fam.key(k), "backward_y", _bias_y_name(k), fam.name + "_grad"))
    return rows


def family_bodies() -> list[tuple[str, str, str, str]]:
    """(forward C name, backward C name, the activation's forward body, its backward body) of every
    composite kernel: the bodies are the activation's own elementwise kernels (op_<name> in ma_ops.h)."""
    out = []
    for fam, d, k in _gated_keys():
        names = d.kernel_names(k)
        out.append((fam.cname(k, "forward"), fam.cname(k, "backward"), names["forward"], names["backward"]))
    return out


def bias_bodies() -> list[tuple[str, str, str, str]]:
    """(forward C name, backward C name, the activation's forward body, its backward body) of every
    bias_act kernel (linear's bodies are the family's own)."""
    fam = _OPDEFS.BIAS_ACT
    return [(fam.cname(k, "forward"), fam.cname(k, "backward"), _bias_bodies(d, k)["forward"],
             _bias_bodies(d, k)["backward"]) for d, k in _bias_keys()]


def _elementwise(signature: str) -> tuple[str, ...]:
    return tuple(dict.fromkeys(r[3] for r in _rows() if r[4] == signature))


# Elementwise C kernels: unary x -> y, binary (dy, x or y) -> dx (a shared one, such as shrink_grad, once),
# ternary (g, dy, x) -> g dy f''(x).
UNARY = _elementwise("unary")
BINARY = _elementwise("binary")
TERNARY = _elementwise("ternary")
# Composite C kernels (gated_<act key>, gated_<act key>_grad).
GATED = _elementwise("gated") + _elementwise("gated_grad")
BIAS = _elementwise("bias_act") + _elementwise("bias_act_grad")

# A kernel's time per element relative to relu's (the definitions' `cost`: in cache, 64K float32, one
# thread, AVX2, measured on AMD EPYC family 23 model 1 = Zen 1, where relu takes ~0.21 ns; after the
# four-vector steps, rounded; not re-measured on Zen 3 (family 25) or with AVX-512). Unlisted kernels,
# the piecewise linear ones, cost 1. The runtime threads a call once elements x cost reach its parallel
# minimum (256K: where a second thread gave relu 1.38x on that machine), so that expensive kernels go
# parallel at smaller sizes.
COST = {name: c for d in DEFS for key in d.keys for name, c in d.costs(key).items() if c != 1}
COST.update({f"{d.name}_{d.param_grad}_grad": d.param_grad_cost
             for d in DEFS if d.param_grad and d.param_grad_cost != 1})
# A second derivative: its key's backward cost (not measured; the bodies are of the backward's size).
COST.update({_grad2_name(key): d.cost[key][1] for d in DEFS for key in d.keys if d.cost.get(key, (1, 1))[1] != 1})
# A composite kernel: its activation's forward plus the product (forward), or the activation's forward
# and backward plus the products (backward).  Not measured: derived, as the threshold only needs the scale.
for _fam, _d, _k in _gated_keys():
    _cf, _cb = _d.cost.get(_k, (1, 1))
    COST[_fam.cname(_k, "forward")] = _cf + 1
    COST[_fam.cname(_k, "backward")] = _cf + _cb + 1
# bias_act: the same (its forward runs again in the backward only where clamp is given).
for _d, _k in _bias_keys():
    _cf, _cb = (1, 1) if _d is None else _d.cost.get(_k, (1, 1))
    COST[_OPDEFS.BIAS_ACT.cname(_k, "forward")] = _cf + 1
    COST[_OPDEFS.BIAS_ACT.cname(_k, "backward")] = _cf + _cb + 1
# the backward from y: a piecewise or product body, the products (not measured, as above)
COST.update({_n: 2 for _n, _ in bias_y_bodies()})

# C kernel name -> the op parameters packed into ma_params (a, b, ...), in the definition's slot order.
_PARAMS = {r[3]: d.float_params for d in DEFS for r in _rows() if r[0] == d.name and d.float_params}
_PARAMS.update({fam.cname(k, direction): d.float_params for fam, d, k in _gated_keys()
                for direction in ("forward", "backward") if d.float_params})
_PARAMS.update({_OPDEFS.BIAS_ACT.cname(k, direction): d.float_params for d, k in _bias_keys()
                for direction in ("forward", "backward") if d is not None and d.float_params})
_PARAMS.update({_bias_y_name(k): d.float_params for d, k in _bias_keys()
                if d is not None and d.float_params and "backward_y" in d.kernel_names(k)})


def arch(machine: str | None = None) -> str:
    return VOCAB.arch(machine)


ISAS_ENV = "MULTIACT_NATIVE_ISAS"


def host_isas() -> tuple[str, ...]:
    """The ISAs of this architecture that this CPU runs, by its flags (the vocabulary's ISA flags; every one
    where they cannot be read)."""
    every = VOCAB.isas_of(arch())
    try:
        with open("/proc/cpuinfo") as f:
            line = next((ln for ln in f if ln.startswith(("flags", "Features"))), "")
    except OSError:
        return every
    flags = set(line.partition(":")[2].split())
    return tuple(i for i in every if set(VOCAB.ISAS[i].flags) <= flags)


def isas(machine: str | None = None) -> tuple[str, ...]:
    """ISAs compiled into the extension on this architecture (the vocabulary's, baseline first; scalar
    everywhere).  MULTIACT_NATIVE_ISAS (a comma list, or `host`: those this CPU runs) builds fewer, for a quicker
    build where the others could not run anyway (CI on a CPU without AVX-512: the avx512 units are a third of
    the build); set it for the tests too.  A named machine (the C harness, cross builds) always gets every ISA."""
    every = VOCAB.isas_of(arch(machine))
    want = os.environ.get(ISAS_ENV, "").strip().lower()
    if machine is not None or not want:
        return every
    keep = set(host_isas()) if want == "host" else {w.strip() for w in want.split(",")}
    return tuple(i for i in every if i == VOCAB.BASELINE or i in keep)


def isa_header() -> str:
    """ma_isa_list.h: the C runtime's ISA table (ma_runtime.c), from the vocabulary: MA_ISA(name, arch) for
    every ISA, best first (the `native` backend's preference); arch `any` for the portable baseline."""
    rows = " \\\n".join(f"    MA_ISA({i.name}, {i.arch or 'any'})" for i in VOCAB.ISAS.values())
    return ("/* Generated from multiact/vocab.py by native/kernels.py; do not edit. */\n"
            "/* MA_ISA(name, architecture): every ISA, best first; `any`: the portable C of every architecture */\n"
            f"#define MA_ISA_LIST \\\n{rows}\n")


def symbol(cname: str, dtype: str, isa: str) -> str:
    return f"ma_{DTYPES[dtype]}_{cname}__{isa}"


def cname(key: str, direction: str) -> str | None:
    """The C kernel name for a kernel key and direction, or None where there is none."""
    for _, k, d, name, _ in _rows():
        if k == key and d == direction:
            return name
    return None


def _src(name: str) -> str:
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "src", name)) as f:
        return f.read()


def float64_bodies() -> frozenset[str]:
    """The C names whose bodies compile in float64 lanes: the op_<name> bodies of ma_ops.h and ma_ops2.h above
    their `#if !defined(MA_F64)` line (the bodies below it use float32 math), the zero second derivatives
    (zero_grad2_keys: ma_ops2.h expands them above that line), and every one of ma_ops64.h (the float64 bodies
    of the exponential ops)."""
    names: set[str] = {_grad2_name(k) for k in zero_grad2_keys()}
    for header in ("ma_ops.h", "ma_ops2.h", "ma_ops64.h"):
        head = _src(header).split("\n#if !defined(MA_F64)", 1)[0]
        names.update(re.findall(r"^MA_INLINE V op_(\w+)\(", head, flags=re.M))
    return frozenset(names)


def _has(dtype: str, name: str, sig: str, f64: frozenset[str]) -> bool:
    """Whether the extension has kernel `name` (of signature sig) for dtype."""
    return dtype != "float64" or (sig in F64_SIGNATURES and name in f64)


def table(machine: str | None = None) -> list[Kernel]:
    """Every kernel in the extension for this architecture."""
    f64 = float64_bodies()
    return [
        Kernel(op, key, direction, dtype, isa, name, symbol(name, dtype, isa), sig)
        for isa in isas(machine)
        for dtype in DTYPES
        for op, key, direction, name, sig in _rows()
        if _has(dtype, name, sig, f64)
    ]


def split_kernels(ops_header: str | None = None) -> frozenset[str]:
    """Kernels with a fast path: the names of ma_ops.h's top-level MA_SPLIT_UNARY / MA_SPLIT_BINARY(_IF)
    lines, and both directions of each MA_GATE_OPS line (the loops test a step of vectors for it at
    once; see ma_kernels.inc)."""
    path = ops_header or os.path.join(os.path.dirname(os.path.abspath(__file__)), "src", "ma_ops.h")
    with open(path) as f:
        text = f.read()
    gates = re.findall(r"^MA_GATE_OPS\((\w+),", text, flags=re.M)
    split = re.findall(r"^MA_SPLIT_(?:UNARY|BINARY)(?:_IF)?\((\w+),", text, flags=re.M)
    return frozenset(split + gates + [g + "_grad" for g in gates])


# The extension compiles each ISA's kernels as PARTS translation units (MA_PART = 0 .. PARTS-1), so that
# the build runs on every core (setup.py compiles the sources in parallel); without MA_PART a unit holds
# every kernel (the C harness builds it that way).
PARTS = 4


def _parts(entries: list[tuple[str, int]]) -> list[str]:
    """Each entry wrapped in the MA_P<i> guard of the part it falls to: the heaviest first into the
    lightest part (weights: a rough compile cost)."""
    load = [0] * PARTS
    part = {}
    for text, weight in sorted(entries, key=lambda e: -e[1]):
        i = load.index(min(load))
        part[text] = i
        load[i] += weight
    return [f"    MA_P{part[text]}({text})" for text, _ in entries]


def bf16_representatives(within: frozenset[str] | None = None) -> frozenset[str]:
    """One C kernel (a composite's by its forward name) per list and kinds of its bodies: the bfloat16 kernels
    the C harness builds by default.  Their bfloat16 code is the same macro text for every kernel of a list
    (ma_kernels.inc: LD_bf16 / ST_bf16 / ST2_bf16 / SS_bf16 around the float32 body), and each is checked bit
    for bit against its float32 kernel, whose body the harness checks for every kernel; so one kernel per
    (list, split or plain bodies) covers every bfloat16-specific path of an ISA (steps, single vectors, tails,
    heads, streaming, pairs).  tests/test_native_bf16.py runs every bfloat16 kernel the same way on the
    host's ISAs; scripts/test_neon_qemu.sh builds them all (HARNESS_BF16=all).  within: pick among these C
    names only (the harness's sample)."""
    split = split_kernels()
    ok = (lambda n: True) if within is None else (lambda n: n in within)
    pick: dict[tuple, str] = {}
    for n in filter(ok, UNARY):
        pick.setdefault(("unary", n in split), n)
    for n in filter(ok, BINARY):
        pick.setdefault(("binary", n in split), n)
    for n in filter(ok, TERNARY):
        pick.setdefault(("ternary", False), n)
    for f, _, af, ab in family_bodies():
        if ok(f):
            pick.setdefault(("gated", af in split, ab in split), f)
    for f, _, af, ab in bias_bodies():
        if ok(f):
            pick.setdefault(("bias_act", af in split, ab in split), f)
    for f, _ in bias_y_bodies():
        if ok(f):
            pick.setdefault(("bias_act_y",), f)
    return frozenset(pick.values())


def _kinds() -> dict[str, str]:
    """C kernel name -> `split` (has a fast path) or `plain`, for the elementwise kernels and bodies."""
    split = split_kernels()
    unknown = split - set(UNARY) - set(BINARY)
    if unknown:
        raise ValueError(f"ma_ops.h splits kernels the table lacks: {sorted(unknown)}")
    kind = {n: "split" if n in split else "plain" for n in (*UNARY, *BINARY)}
    kind.update({n: "plain" for n in TERNARY})
    kind.update({n: "plain" for n in _LINEAR_BODIES.values()})
    return kind


def sample() -> frozenset[str]:
    """A small set of C kernel names that still runs every loop of ma_kernels.inc and every macro of a
    vector layer: the cheapest kernel (COST, then table order) of each signature, direction and kind of
    its body (split or plain; a composite's is its activation's forward body).  The C harness under SIMDe's
    AVX-512 emulation compiles only these in the default test run (the whole table takes many minutes
    there); prelu and the parameter gradients are always compiled (the first part, MA_PART_FIRST)."""
    kind = _kinds()
    pairs = {f: (b, af) for f, b, af, _ in family_bodies() + bias_bodies()}
    ybodies = dict(bias_y_bodies())
    best: dict[tuple[str, str, str], tuple[int, int, tuple[str, ...]]] = {}
    for order, (_, key, direction, name, sig) in enumerate(_rows()):
        if name in pairs:  # a composite's forward and backward are one X-macro entry: chosen together
            b, af = pairs[name]
            group, cand = (sig, "both", kind[af]), (COST.get(name, 1) + COST.get(b, 1), order, (name, b))
        elif name in kind:
            group, cand = (sig, direction, kind[name]), (COST.get(name, 1), order, (name,))
        elif name in ybodies:  # bias_act from y: with its key's pair (the harness's scalar forward makes its y)
            pair = (cname(key, "forward"), cname(key, "backward"))
            group, cand = (sig, direction, kind[ybodies[name]]), (COST.get(name, 1), order, (name, *pair))
        else:
            continue
        best[group] = min(best.get(group, cand), cand)
    names = {n for _, _, chosen in best.values() for n in chosen}
    # a backward_y kernel's input y comes from its key's forward kernel (the harness's scalar twin)
    return frozenset(names | {cname(key, "forward") for _, key, direction, name, _ in _rows()
                              if direction == "backward_y" and name in names})


def harness_selection(sampled: bool, bf16_all: bool) -> tuple[frozenset[str] | None, frozenset[str] | None]:
    """(bf16, only) of the C harness's build (x_macro_header's arguments; None: all): if `sampled`, only
    sample()'s kernels; bfloat16 kernels: all of those, or (the default) bf16_representatives among them."""
    only = sample() if sampled else None
    return (None if bf16_all and only is None else only if bf16_all else bf16_representatives(only)), only


# Terms of x - tanh(x)'s series that float64's tanhshrink sums on |x| < 1 (the reference's float64 count: the
# series converges like (2x / pi)^2 per term, 44 reach 1e-17 at |x| = 1).
TANHSHRINK_TERMS_F64 = 44


def series64_header() -> str:
    """ma_series64.h: the float64 kernels' series coefficients, from the definitions (_opdefs.tanhshrink_series,
    exact fractions rounded once), as hex floats."""
    cs = _OPDEFS.tanhshrink_series(TANHSHRINK_TERMS_F64)
    body = "".join(f"    {c.hex()}, /* {c!r} */\n" for c in cs)
    return ("/* Generated from native/kernels.py: x - tanh(x) = sum_k c_k x^(2k+3), k < M64_TANHSHRINK_N */\n"
            f"#define M64_TANHSHRINK_N {len(cs)}\nstatic const double m64_tanhshrink_c[M64_TANHSHRINK_N] = {{\n"
            + body + "};\n")


def x_macro_header(bf16: frozenset[str] | None = None, only: frozenset[str] | None = None) -> str:
    """ma_kernel_list.h: the elementwise kernels for the C side, MA_UNARY(name, kind) / MA_BINARY(name,
    kind) / MA_TERNARY(name, plain) with kind `split` (has a fast path) or `plain`, and the gated kernels, each in
    the part (MA_P<i>) of the translation unit that compiles it; the *_BF16 lists: those whose bfloat16
    kernels are built, every one (bf16=None, the extension) or the C names in bf16 (the C harness).
    With `only`, just those C names (prelu and the parameter gradients are not in the lists)."""
    kind = _kinds()
    keep = (lambda n: True) if only is None else (lambda n: n in only)
    entries = [(f"MA_UNARY({n}, {kind[n]})", 1 + 2 * (kind[n] == "split")) for n in UNARY if keep(n)]
    entries += [(f"MA_BINARY({n}, {kind[n]})", 1 + 2 * (kind[n] == "split")) for n in BINARY if keep(n)]
    entries += [(f"MA_TERNARY({n}, plain)", 1 + (COST.get(n, 1) > 1)) for n in TERNARY if keep(n)]
    gated = [(f"MA_GATED({f}, {b}, {af}, {ab}, {kind[af]}, {kind[ab]})", 6 + 3 * (kind[af] == "split"))
             for f, b, af, ab in family_bodies() if keep(f)]
    bias = [(f"MA_BIAS({f}, {b}, {af}, {ab}, {kind[af]}, {kind[ab]})", 4 + 2 * (kind[af] == "split"))
            for f, b, af, ab in bias_bodies() if keep(f)]
    bias_y = [(f"MA_BIAS_Y({f}, {yb})", 1) for f, yb in bias_y_bodies() if keep(f)]
    wrapped = _parts(entries + gated + bias + bias_y)
    guards = "".join(f"#if !defined(MA_PART) || MA_PART == {i}\n#define MA_P{i}(k) k\n"
                     f"#else\n#define MA_P{i}(k)\n#endif\n" for i in range(PARTS))
    body = " \\\n".join(wrapped[:len(entries)])
    gbody = " \\\n".join(wrapped[len(entries):len(entries) + len(gated)])
    n_b = len(entries) + len(gated) + len(bias)
    bbody = " \\\n".join(wrapped[len(entries) + len(gated):n_b])
    ybody = " \\\n".join(wrapped[n_b:])

    def bf16_list(name: str, items: list[str]) -> str:
        if bf16 is None:
            return f"#define {name}_BF16 {name}\n"
        kept = [w for w in items if re.search(r"\(MA_[A-Z_]+\((\w+),", w).group(1) in bf16]
        return f"#define {name}_BF16 \\\n" + " \\\n".join(kept) + "\n"
    n_e, n_g = len(entries), len(entries) + len(gated)
    f64 = float64_bodies()
    f64_body = " \\\n".join(f"    MA_{sig.upper()}({n}, plain)" for sig in F64_SIGNATURES
                              for n in _elementwise(sig) if n in f64 and only is None)  # the C harness: none
    lists_bf16 = (bf16_list("MA_KERNEL_LIST", wrapped[:n_e]) + bf16_list("MA_GATED_LIST", wrapped[n_e:n_g])
                  + bf16_list("MA_BIAS_LIST", wrapped[n_g:n_b]) + bf16_list("MA_BIAS_Y_LIST", wrapped[n_b:]))
    zero = " \\\n".join(f"    MA_ZERO_GRAD2({k})" for k in zero_grad2_keys())
    return ("/* Generated from native/kernels.py; do not edit. */\n#ifndef MA_KERNEL_LIST_H\n"
            f"#define MA_KERNEL_LIST_H\n{guards}"
            "/* The prelu and swish-beta kernels (not in the lists) go with part 0. */\n"
            "#if !defined(MA_PART) || MA_PART == 0\n#define MA_PART_FIRST 1\n#else\n#define MA_PART_FIRST 0\n#endif\n"
            f"#define MA_KERNEL_LIST \\\n{body}\n"
            "/* MA_GATED(forward name, backward name, activation forward body, activation backward body,\n"
            " * their kinds) */\n"
            f"#define MA_GATED_LIST \\\n{gbody}\n"
            "/* MA_BIAS(forward name, backward name, activation forward body, activation backward body,\n"
            " * their kinds) */\n"
            f"#define MA_BIAS_LIST \\\n{bbody}\n"
            "/* MA_BIAS_Y(name, the activation's y body): bias_act's backward from y */\n"
            f"#define MA_BIAS_Y_LIST \\\n{ybody}\n"
            "/* The kernels whose bfloat16 versions are built (the extension: all) */\n"
            f"{lists_bf16}"
            "/* The float64 kernels (ma_kernels64.inc), one translation unit per ISA */\n"
            f"#define MA_KERNEL_LIST_F64 \\\n{f64_body}\n"
            "/* MA_ZERO_GRAD2(key): the keys whose f'' is 0 (the definitions' piecewise_linear), every one whatever\n"
            " * the selection: ma_ops2.h's zero bodies */\n"
            f"#define MA_ZERO_GRAD2_LIST \\\n{zero}\n"
            "#endif\n")


_SIGS = {
    "unary": "void {s}(const {t} *x, {t} *y, size_t n, const ma_params *p);",
    "binary": "void {s}(const {t} *dy, const {t} *x, {t} *dx, size_t n, const ma_params *p);",
    "ternary": "void {s}(const {t} *g, const {t} *dy, const {t} *x, {t} *out, size_t n, const ma_params *p);",
    "channel": "void {s}(const {t} *dy, const {t} *x, {t} *y, size_t outer, size_t c, size_t inner, "
             "const float *w, int nthreads);",
    "channel_param_grad": "void {s}(const {t} *dy, const {t} *x, size_t outer, size_t c, size_t inner, "
                          "double *acc);",
    "scalar_param_grad": "double {s}(const {t} *dy, const {t} *x, size_t n, float beta, unsigned cost, "
                         "int nthreads);",
    "gated": "void {s}(const {t} *gate, const {t} *up, {t} *y, const ma_gshape *s, const ma_params *p);",
    "gated_grad": "void {s}(const {t} *dy, const {t} *gate, const {t} *up, {t} *dgate, {t} *dup, "
                  "const ma_gshape *s, const ma_params *p);",
    "bias_act": "void {s}(const {t} *x, const {t} *b, const {t} *scale, {t} *y, const ma_bshape *s, "
                "const ma_params *p);",
    "bias_act_grad": "int {s}(const {t} *dy, const {t} *x, const {t} *b, const {t} *scale, {t} *dx, {t} *db, "
                     "{t} *dscale, double *sums, const ma_bshape *s, const ma_params *p);",
}


def params_of(name: str) -> tuple[str, ...]:
    """Op parameters packed into ma_params (a, b, ...) for C kernel `name`."""
    return _PARAMS.get(name, ())


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
            lines.append(_SIGS[k.signature].format(s=k.symbol, t=VOCAB.DTYPES[k.dtype].ctype))
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    if sys.argv[1:2] == ["--header"]:
        sys.stdout.write(x_macro_header())
    elif sys.argv[1:2] == ["--isa-header"]:
        sys.stdout.write(isa_header())
    elif sys.argv[1:2] == ["--decls"]:
        sys.stdout.write(declarations(sys.argv[2] if len(sys.argv) > 2 else None))
    else:
        for k in table():
            print(*k)
