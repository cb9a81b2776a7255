"""torch.onnx.export of models built with multiact.torch: every forward custom op translated into standard ONNX.

Both of torch's exporters take a multiact model after `import multiact.torch`:

    torch.onnx.export(model, (x,), dynamo=True)            # the torch.export-based exporter (onnxscript)
    torch.onnx.export(model, (x,), "m.onnx", dynamo=False)  # the TorchScript exporter
    mt.export_onnx(model, (x,), accuracy="runtime")         # either, with an accuracy mode

The graphs are the ones `ma.to_onnx` exports (multiact.backend.onnx_graphs' registered bodies, one per kernel key
and direction): each translation builds the model of its op at the call's dtype, rank, parameters, opset and
accuracy mode, and replays that model's nodes into the exporter's graph (onnxscript ops for the dynamo exporter,
`g.op` for the TorchScript one).  So the exported graph holds standard ONNX operators only (no custom domain), and
computes what `ma.to_onnx` does: within the op's contract by default (accuracy="auto": ORT's own operator where its
measured error meets the contract, else the composite).  The opset is the export's (`opset_version`): an operator
that opset lacks (Gelu below 20, Mish below 18) gives way to the composite; below opset 15 (MIN_OPSET) the graphs
cannot be written and the export fails saying so.

Registration: torch.onnx.export(dynamo=True) builds its table of translations per call, from torch's own and
onnxscript's torchlib registry; multiact registers its translations in that registry (onnxscript's
`torch_lib.registration.torch_op`, the way torchlib registers aten's) as soon as onnxscript's registry is imported,
which a dynamo export does first.  `onnx_translations()` gives the same table to pass as
`custom_translation_table=` by hand.  The TorchScript exporter's translations are `torch.onnx.register_custom_op_
symbolic` registrations, made when torch.onnx is imported.  Translated: every op's forward (`multiact::<op>`,
learnable `<op>_t`, the in-place `<op>_` runs as the out-of-place op under export), the gated ops (one- and
two-input forms) and bias_act; not the backward ops (an inference graph has none).

quant= (`multiact::quantized`, multiact.torch_quant) exports as `ma.to_onnx(..., quant=Q)` builds it: the float32
graph, then QuantizeLinear, outputs (codes, scales), from opset 21 (`opset_version=21`), so with the dynamo exporter
only (the TorchScript exporter's newest opset is 20: it raises saying so).  MX is refused: torch's scales are
float8_e8m0fnu, which ONNX types from opset 24 only (ma.to_onnx's MX graph gives uint8 E8M0 bits).
"""

from __future__ import annotations

import contextvars
import functools
import importlib.abc
import importlib.util
import linecache
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from . import vocab

ACCURACY = contextvars.ContextVar("multiact_onnx_accuracy", default="auto")  # export_onnx(accuracy=...)
_ONNXSCRIPT_REGISTRY = "onnxscript.function_libs.torch_lib.registration"
_FALLBACK_OPSET = 18  # the dynamo exporter's own (TORCHLIB_OPSET), where its tracer does not say


class Translation:
    """One custom op's translation: its torch name, its arguments (schema order, with defaults), and `build`,
    which turns the call's arguments (a dict, tensors as the exporter's values) into (model, feeds): the
    ONNX model to replay and the exporter's value for each of the model's inputs."""

    def __init__(self, name: str, build: Callable[..., tuple[Any, dict[str, Any]]]):
        import torch

        self.name = name
        self.overload = getattr(torch.ops.multiact, name).default
        self.args = [(a.name, a.default_value if a.has_default_value() else _REQUIRED, str(a.type))
                     for a in self.overload._schema.arguments]
        self.build = build

    def dynamo(self, opset: int | None = None, accuracy: str | None = None) -> Callable:
        """The onnxscript translation: a function with the op's signature, traced by the exporter."""
        sig = ", ".join(n if d is _REQUIRED else f"{n}={d!r}" for n, d, _ in self.args)
        names = ", ".join(n for n, _, _ in self.args)
        src = f"def {self.name}({sig}):\n    return _run(_t, _opset, _accuracy, ({names},))\n"
        filename = f"<multiact.torch_onnx.{self.name}>"
        # onnxscript reads a translation's source (its signature): kept where inspect.getsource finds it
        linecache.cache[filename] = (len(src), None, src.splitlines(keepends=True), filename)
        ns: dict[str, Any] = {"_run": _run_dynamo, "_t": self, "_opset": opset, "_accuracy": accuracy,
                              "__name__": __name__}
        exec(compile(src, filename, "exec"), ns)  # noqa: S102 - from the op's schema
        return ns[self.name]

    def torchscript(self, g: Any, *values: Any) -> Any:
        """The TorchScript exporter's symbolic: constants read back from the graph, tensors as they are."""
        call = {}
        for (n, _, typ), v in zip(self.args, values, strict=True):
            call[n] = v if "Tensor" in typ and not _is_none_value(v) else _constant(v)
        opset = g.opset
        if opset < _min_opset():
            raise RuntimeError(f"multiact.torch: {self.name} exports to ONNX from opset {_min_opset()} (the opset "
                               f"its graphs are written for), not at opset_version={opset}")
        model, feeds = self.build(call, _ts_dtype, _ts_rank, opset, ACCURACY.get())
        return _replay(model, feeds, _TorchScriptEmitter(g))


_REQUIRED = object()


def _min_opset() -> int:
    from .backend.onnx_graphs import MIN_OPSET

    return MIN_OPSET


# ---- building each op's model (multiact.onnx_export's graphs) ----------------------------------------------


def _dtype_name(d: Any, what: str) -> str:
    name = vocab.dtype(d).name
    from .backend.onnx_graphs import DTYPES

    if name not in (*DTYPES, "bfloat16"):
        raise TypeError(f"multiact.torch: {what} exports to ONNX in float16, float32 or bfloat16, not {name} "
                        "(cast the model, e.g. model.float())")
    return name


@functools.lru_cache(maxsize=1024)
def _activation_model(op: str, dtype: str, ndim: int, accuracy: str, opset: int, params: tuple,
                      param_inputs: tuple[str, ...]) -> Any:
    from .onnx_export import to_onnx

    return to_onnx(op, dtype=dtype, shape=ndim, accuracy=accuracy, opset=opset, param_inputs=param_inputs,
                   **_plain(params))


@functools.lru_cache(maxsize=1024)
def _gated_model(name: str, dtype: str, ndim: int, opset: int, params: tuple) -> Any:
    from .onnx_export import to_onnx

    return to_onnx(name, dtype=dtype, ndim=ndim, opset=opset, **_plain(params))


@functools.lru_cache(maxsize=1024)
def _gated_up_model(name: str, dtype: str, opset: int, given: tuple, extra: tuple) -> tuple[Any, bool]:
    from . import gated
    from ._opdefs import COMPOSITE_DEFINITIONS
    from .backend.onnx_graphs import gated_kernel_onnx
    from .onnx_export import bfloat16_model

    cdef = COMPOSITE_DEFINITIONS[name]
    fn = gated.label(cdef, "forward")
    call = gated.resolve(cdef, _plain(given), _plain(extra), fn)
    gated.check_precision(call, np.dtype("float32" if dtype == "bfloat16" else dtype), fn)
    if dtype == "bfloat16":
        return bfloat16_model(gated_kernel_onnx(call.key, "forward", "float32", call.kp, opset)), call.gate_first
    return gated_kernel_onnx(call.key, "forward", dtype, call.kp, opset), call.gate_first


@functools.lru_cache(maxsize=1024)
def _bias_act_model(dtype: str, ndim: int, forms: tuple, opset: int, params: tuple) -> Any:
    from .onnx_export import bias_act_model

    return bias_act_model(dtype=dtype, ndim=ndim, forms=forms, opset=opset, **_plain(params))


def _hashable(d: dict) -> tuple:
    """Parameters as a cache key: (name, value, repr), so that -0.0 and 0.0 are two keys (their graphs differ)."""
    return tuple(sorted((k, v, repr(v)) for k, v in d.items()))


def _plain(key: tuple) -> dict:
    return {k: v for k, v, _ in key}


def activation_builder(spec: Any, learn: str | None) -> Callable:
    """build() of an op's forward custom op (`multiact::<op>`, or `<op>_t` with the learnable parameter `learn`
    as a tensor): the parameters after x in the definition's order, then backend."""
    array = spec.defn.array_param

    def build(call: dict, dtype_of: Callable, rank_of: Callable, opset: int, accuracy: str):
        x = call["x"]
        dtype = _dtype_name(dtype_of(x), f"multiact.{spec.name}")
        feeds = {"x": x}
        params = {}
        inputs: tuple[str, ...] = ()
        for q in spec.params:
            if q.name == array:
                feeds[array] = call[q.name]
            elif q.name == learn:
                feeds[q.name] = call[q.name]
                inputs = (q.name,)
            else:
                params[q.name] = call[q.name]
        model = _activation_model(spec.name, dtype, rank_of(x), accuracy, opset, _hashable(params), inputs)
        return model, feeds

    return build


def gated_builder(cdef: Any, decode: Callable[[str], dict], two_inputs: bool) -> Callable:
    """build() of a gated op's forward: `multiact::<name>(x, ...)` (x split in the graph) or `<name>_up(x, up,
    ...)` (the two-input form)."""

    def build(call: dict, dtype_of: Callable, rank_of: Callable, opset: int, accuracy: str):
        x = call["x"]
        dtype = _dtype_name(dtype_of(x), f"multiact.{cdef.name}")
        given = {p.name: call[p.name] for p in cdef.params}
        extra = decode(call["act_params"]) if cdef.takes_act_params else {}
        if two_inputs:
            model, gate_first = _gated_up_model(cdef.name, dtype, opset, _hashable(given), _hashable(extra))
            up = call["up"]
            return model, {"gate": x, "up": up} if gate_first else {"gate": up, "up": x}
        params = {k: v for k, v in given.items() if v is not None}
        return _gated_model(cdef.name, dtype, rank_of(x), opset, _hashable({**params, **extra})), {"x": x}

    return build


def bias_act_builder(cdef: Any, decode: Callable[[str], dict]) -> Callable:
    """build() of `multiact::bias_act(x, b, scale, ...)`: b and scale absent (None), one per channel along dim,
    or of x's shape."""

    def build(call: dict, dtype_of: Callable, rank_of: Callable, opset: int, accuracy: str):
        x = call["x"]
        dtype = _dtype_name(dtype_of(x), "multiact.bias_act")
        ndim = rank_of(x)
        feeds = {"x": x}
        forms = []
        for side in ("b", "scale"):
            v = call[side]
            if v is None:
                forms.append(None)
                continue
            feeds[side] = v
            forms.append("f" if rank_of(v) == ndim and ndim > 1 else "c")
        given = {p.name: call[p.name] for p in cdef.params}
        params = {**{k: v for k, v in given.items() if v is not None}, **decode(call["act_params"])}
        return _bias_act_model(dtype, ndim, tuple(forms), opset, _hashable(params)), feeds

    return build


def quantized_builder(decode: Callable[[str], tuple[dict, Any]]) -> Callable:
    """build() of `multiact::quantized(x, t1, t2, call)` (multiact.torch's quant=): the model `ma.to_onnx` (or
    bias_act_model, or the gated kernel for the two-input form) makes of the call's function with quant=, whose
    outputs are (codes, scales).  Opset 21 and up (QuantizeLinear's float8 outputs and blocked scales)."""

    def build(call: dict, dtype_of: Callable, rank_of: Callable, opset: int, accuracy: str):
        from ._opdefs import COMPOSITE_DEFINITIONS
        from .backend.onnx_quant import QUANT_OPSET

        c, q = decode(call["call"])
        fn, x = c["fn"], call["x"]
        if opset < QUANT_OPSET:
            raise RuntimeError(f"multiact.torch: {fn}(quant=...) exports to ONNX from opset {QUANT_OPSET} "
                               f"(QuantizeLinear with float8 outputs and blocked scales), not at opset {opset}: pass "
                               f"opset_version={QUANT_OPSET} or above")
        if q.granularity == "mx":  # torch's scales are float8_e8m0fnu, the graph's E8M0 bits uint8 (opset 21)
            raise RuntimeError(f"multiact.torch: {fn}(quant=Quant(granularity='mx')) does not export to ONNX: its "
                               "scales are torch.float8_e8m0fnu, which ONNX has from opset 24 only; export the "
                               "float model and quantize with ma.to_onnx's MX graph (uint8 E8M0 bits)")
        tensors = {n: v for n, v in zip(c["tensors"], (call["t1"], call["t2"]), strict=False) if v is not None}
        dtype = _dtype_name(dtype_of(x), f"multiact.{fn}")
        params = {k: v for k, v in c["params"].items() if v is not None}
        key = (fn, dtype, rank_of(x), accuracy, opset, _hashable(params), q,
               tuple((n, rank_of(v)) for n, v in tensors.items()))
        model, gate_first = _quantized_model(key, tuple(tensors))
        if fn in COMPOSITE_DEFINITIONS and "up" in tensors:  # the gated kernel's inputs: gate, up
            up = tensors["up"]
            return model, {"gate": x, "up": up} if gate_first else {"gate": up, "up": x}
        return model, {"x": x, **tensors}

    return build


@functools.lru_cache(maxsize=1024)
def _quantized_model(key: tuple, names: tuple[str, ...]) -> tuple[Any, bool]:
    """(the quantized model of the call `key`, whether x is the gate: the two-input gated form)."""
    from . import gated
    from ._opdefs import COMPOSITE_DEFINITIONS
    from .backend.onnx_graphs import gated_kernel_onnx
    from .backend.onnx_quant import quantized_model
    from .onnx_export import bias_act_model, to_onnx

    fn, dtype, ndim, accuracy, opset, params, q, ranks = key
    p = _plain(params)
    if fn == "bias_act":
        forms = tuple(None if n not in dict(ranks) else ("f" if dict(ranks)[n] == ndim and ndim > 1 else "c")
                      for n in ("b", "scale"))
        return bias_act_model(dtype=dtype, ndim=ndim, forms=forms, opset=opset, quant=q, **p), True
    if fn in COMPOSITE_DEFINITIONS:
        if "up" not in names:
            return to_onnx(fn, dtype=dtype, ndim=ndim, opset=opset, quant=q, **p), True
        cdef = COMPOSITE_DEFINITIONS[fn]
        own = {k: v for k, v in p.items() if k in cdef.param_names}
        call = gated.resolve(cdef, own, {k: v for k, v in p.items() if k not in cdef.param_names},
                             gated.label(cdef, "forward"))
        base = gated_kernel_onnx(call.key, "forward", "float32", call.kp, opset)  # elementwise: any shape
        return quantized_model(base, q, dtype, opset=opset), call.gate_first
    return to_onnx(fn, dtype=dtype, shape=ndim, accuracy=accuracy, opset=opset, quant=q, **p), True


# ---- replaying a model's nodes into an exporter's graph -----------------------------------------------------


def _replay(model: Any, feeds: dict[str, Any], emit: Any) -> Any:
    """The model's nodes emitted in order; its initializers as Constant nodes; its inputs read from feeds."""
    from onnx import helper, numpy_helper

    g = model.graph
    env: dict[str, Any] = {}
    for i in g.input:
        if i.name not in feeds:
            raise RuntimeError(f"multiact.torch: no value for the ONNX graph's input {i.name!r}")
        env[i.name] = feeds[i.name]
    for init in g.initializer:
        env[init.name] = emit.constant(numpy_helper.to_array(init))
    for node in g.node:
        attrs = {a.name: (a.type, helper.get_attribute_value(a)) for a in node.attribute}
        ins = [env[n] if n else None for n in node.input]
        outs = emit.node(node.op_type, ins, attrs, len(node.output))
        for name, v in zip(node.output, outs if len(node.output) > 1 else (outs,), strict=True):
            env[name] = v
    if len(g.output) > 1:  # a quantized model: (codes, scales)
        return tuple(env[o.name] for o in g.output)
    return env[g.output[0].name]


class _OnnxscriptEmitter:
    """Nodes through an onnxscript opset (the dynamo exporter's tracer records them)."""

    def __init__(self, opset: int):
        import onnxscript

        self.op = onnxscript.values.Opset("", opset)

    def constant(self, a: np.ndarray) -> Any:
        import onnx_ir as ir

        return self.op.Constant(value=ir.tensor(a))

    def node(self, op_type: str, ins: list, attrs: dict, n_out: int) -> Any:
        kw = {k: v.decode() if isinstance(v, bytes) else v for k, (_, v) in attrs.items()}
        if n_out > 1:
            kw["_num_outputs"] = n_out
        return getattr(self.op, op_type)(*ins, **kw)


class _TorchScriptEmitter:
    """Nodes through the TorchScript exporter's GraphContext (g.op, attributes suffixed by kind)."""

    _SUFFIX = {1: "f", 2: "i", 3: "s", 4: "t", 6: "f", 7: "i"}  # onnx AttributeProto: FLOAT, INT, STRING, ...

    def __init__(self, g: Any):
        self.g = g

    def constant(self, a: np.ndarray) -> Any:
        import torch

        return self.g.op("Constant", value_t=torch.from_numpy(np.array(a)))

    def node(self, op_type: str, ins: list, attrs: dict, n_out: int) -> Any:
        kw = {}
        for k, (kind, v) in attrs.items():
            if kind not in self._SUFFIX:
                raise RuntimeError(f"multiact.torch: ONNX attribute {k} of {op_type} has a kind the TorchScript "
                                   "exporter's g.op does not take")
            kw[f"{k}_{self._SUFFIX[kind]}"] = v.decode() if isinstance(v, bytes) else v
        ins = [self.g.op("prim::Constant") if v is None else v for v in ins]
        return self.g.op(op_type, *ins, outputs=n_out, **kw) if n_out > 1 else self.g.op(op_type, *ins, **kw)


def _is_none_value(v: Any) -> bool:
    return v is None or (hasattr(v, "node") and v.node().mustBeNone())


def _constant(v: Any) -> Any:
    """A constant argument of a TorchScript graph (an onnx::Constant or prim::Constant node) as a Python value."""
    if _is_none_value(v):
        return None
    node = v.node()
    if not node.hasAttribute("value"):
        raise RuntimeError(f"multiact.torch: a parameter of a multiact op must be a constant to export to ONNX, got "
                           f"{node}")
    kind = node.kindOf("value")
    value = getattr(node, kind)("value")
    if kind == "t":
        value = value.item()
    return value


def _ts_dtype(v: Any) -> Any:
    return v.type().dtype()


def _ts_rank(v: Any) -> int:
    r = v.type().dim()
    if r is None:
        raise RuntimeError("multiact.torch: exporting to ONNX needs each input's rank (trace with example inputs)")
    return r


def _dynamo_dtype(v: Any) -> Any:
    return v.dtype.numpy()


def _dynamo_rank(v: Any) -> int:
    if v.shape is None:
        raise RuntimeError("multiact.torch: exporting to ONNX needs each input's rank")
    return len(v.shape)


def _tracer_opset() -> int:
    """The opset the dynamo exporter builds its graph at (its tracer's), else its default."""
    import onnxscript

    opset = getattr(onnxscript.evaluator.default(), "opset", None)
    return getattr(opset, "version", None) or _FALLBACK_OPSET


def _run_dynamo(t: Translation, opset: int | None, accuracy: str | None, values: tuple) -> Any:
    call = {n: v for (n, _, _), v in zip(t.args, values, strict=True)}
    traced = _tracer_opset()  # the exporter's graph; it converts to an opset_version below 18 afterwards
    build = min(opset or traced, traced)  # which operators the graph may use: the opset asked for, if lower
    model, feeds = t.build(call, _dynamo_dtype, _dynamo_rank, build, accuracy or ACCURACY.get())
    return _replay(model, feeds, _OnnxscriptEmitter(traced))


# ---- registration -------------------------------------------------------------------------------------------

TRANSLATIONS: dict[str, Translation] = {}  # custom op name -> its translation


def add(name: str, build: Callable) -> None:
    """Translate the custom op torch.ops.multiact.<name> with build (see Translation)."""
    TRANSLATIONS[name] = Translation(name, build)


def onnx_translations(*, opset: int | None = None, accuracy: str = "auto") -> dict[Any, Callable]:
    """{torch.ops.multiact.<op>.default: its onnxscript translation} for every forward op: what
    `torch.onnx.export(..., dynamo=True, custom_translation_table=...)` takes.  opset: the opset the graphs are
    built for (default: the exporter's); accuracy as `ma.to_onnx`'s ("auto", "contract", "runtime")."""
    from .backend.onnx_graphs import ACCURACIES

    if accuracy not in ACCURACIES:
        raise ValueError(f"onnx_translations(): accuracy must be one of {ACCURACIES}, got {accuracy!r}")
    return {t.overload: t.dynamo(opset, accuracy) for t in TRANSLATIONS.values()}


def export_onnx(model: Any, args: tuple = (), f: Any = None, *, accuracy: str = "auto", **kwargs: Any) -> Any:
    """torch.onnx.export(model, args, f, **kwargs) with multiact's translations in the given accuracy mode
    (`ma.to_onnx`'s: "auto", the default, "contract" or "runtime"): with dynamo=True (torch's default) they go in
    custom_translation_table (after any given there); with dynamo=False the TorchScript symbolics read the mode."""
    import torch

    from .backend.onnx_graphs import ACCURACIES

    if accuracy not in ACCURACIES:
        raise ValueError(f"export_onnx(): accuracy must be one of {ACCURACIES}, got {accuracy!r}")
    if kwargs.get("dynamo", True):  # the exporter traces at opset 18 or above: the graphs for the opset asked for
        table = onnx_translations(accuracy=accuracy, opset=kwargs.get("opset_version"))
        table.update(kwargs.pop("custom_translation_table", None) or {})
        kwargs["custom_translation_table"] = table
    token = ACCURACY.set(accuracy)
    try:
        return torch.onnx.export(model, args, f, **kwargs)
    finally:
        ACCURACY.reset(token)


def _register_onnxscript(registration: Any) -> None:
    """Every translation in onnxscript's torchlib registry, which torch.onnx.export(dynamo=True) reads."""
    for t in TRANSLATIONS.values():
        registration.torch_op(f"multiact::{t.name}", trace_only=True)(t.dynamo())


def _register_torchscript(torch_onnx: Any) -> None:
    for t in TRANSLATIONS.values():
        torch_onnx.register_custom_op_symbolic(f"multiact::{t.name}", t.torchscript, 1)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs `then(module)` once module `name` has been imported (a one-shot import hook: the registries live in
    modules that are slow to import, and only an export imports them)."""

    def __init__(self, name: str, then: Callable[[Any], None]):
        self.name, self.then = name, then

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        loader, then = spec.loader, self.then  # a loader made for this module alone (importlib's file finder)
        run = loader.exec_module

        def exec_module(module: Any) -> None:
            run(module)
            _safely(then, module)

        loader.exec_module = exec_module
        return spec


def _safely(fn: Callable[[Any], None], module: Any) -> None:
    import warnings

    try:
        fn(module)
    except Exception as e:  # noqa: BLE001 - an exporter's registry that changed must not break importing it
        warnings.warn(f"multiact.torch could not register its ONNX translations ({e!r}); pass "
                      "custom_translation_table=multiact.torch.onnx_translations() or use multiact.torch.export_onnx",
                      RuntimeWarning, stacklevel=2)


def _when_imported(name: str, then: Callable[[Any], None]) -> None:
    module = sys.modules.get(name)
    if module is not None:
        _safely(then, module)
    elif importlib.util.find_spec(name.partition(".")[0]) is not None:
        sys.meta_path.insert(0, _AfterImport(name, then))


def install() -> None:
    """Register the translations with both exporters, each when its registry is imported (at once if it is)."""
    _when_imported(_ONNXSCRIPT_REGISTRY, _register_onnxscript)
    _when_imported("torch.onnx", _register_torchscript)
