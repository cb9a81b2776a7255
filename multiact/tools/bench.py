"""Side-by-side timing of multiact's backends and its peers on the same arrays, in one run.

For each (op, params, dtype, size, threads, direction) every implementation is
bound to the same input arrays; a plain copy of the same number of bytes is
timed with them as the bandwidth limit.  Calls are warmed up, then timed in
rounds that visit the implementations in a rotating order (so a noisy neighbour
or a clock change hits all of them alike); a sample is the mean of enough calls
to last a couple of milliseconds; the result is the median and the
interquartile range of the samples.  Allocating calls and calls into a
preallocated `out` are separate rows.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import numpy as np

from .. import registry
from ..consistency import param_cases
from ..optable import OPS, REQUIRED, get
from . import peers as P

# The ops a bare `multiact bench` compares: the common ones, which every peer has.
DEFAULT_OPS = ("relu", "leaky_relu", "gelu", "gelu:approximate=tanh", "silu", "sigmoid", "tanh", "elu", "softplus",
               "mish", "hardswish")
DEFAULT_SIZES = (1 << 10, 1 << 16, 1 << 20, 1 << 24)
# backward_y: the gradient from the forward output y (what autograd saves for sigmoid, tanh, elu...)
DIRECTIONS = ("forward", "backward", "backward_y")
SHORT_DIRECTION = {"forward": "fwd", "backward": "bwd", "backward_y": "bwd_y"}
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    """'1K' -> 1024, '16M' -> 16777216, '3000' -> 3000 (K and M are powers of two)."""
    t = text.strip().upper()
    unit = t[-1] if t and t[-1] in _UNITS else ""
    try:
        n = int(float(t[: len(t) - len(unit)]) * _UNITS[unit])
    except ValueError:
        raise ValueError(f"bad size {text!r}: use a number with an optional K or M suffix, e.g. 64K") from None
    if n < 1:
        raise ValueError(f"bad size {text!r}: must be at least 1")
    return n


def size_label(n: int) -> str:
    for unit in ("G", "M", "K"):
        if n % _UNITS[unit] == 0:
            return f"{n // _UNITS[unit]}{unit}"
    return str(n)


@dataclass(frozen=True)
class OpCase:
    """An op with the parameters it is timed with ('gelu:approximate=tanh' on the command line)."""

    op: str
    params: tuple[tuple[str, Any], ...]

    @property
    def label(self) -> str:
        spec = OPS[self.op]
        shown = [f"{k}={v}" for k, v in self.params if k != "weight" and spec.defaults().get(k, None) != v]
        return self.op + (f"({','.join(shown)})" if shown else "")

    def call_params(self, dtype: np.dtype) -> dict[str, Any]:
        if self.op == "prelu":
            return {"weight": np.array([0.25], dtype=dtype)}
        return dict(self.params)


def parse_op(text: str) -> OpCase:
    """'gelu' -> gelu with its defaults; 'gelu:approximate=tanh' or 'softplus:beta=2:threshold=5' sets parameters."""
    name, *items = text.strip().split(":")
    spec = get(name.strip())
    if spec.name == "prelu":
        return OpCase("prelu", (("weight", "single"),))  # one slope, as on a 1-D array
    given: dict[str, Any] = {}
    for item in items:
        k, eq, v = item.partition("=")
        if not eq:
            raise ValueError(f"bad op parameter {item!r} in {text!r}: use name=value")
        given[k.strip()] = _value(v.strip())
    if not items and any(p.default is REQUIRED for p in spec.params):
        given = dict(param_cases(spec)[0])
    return OpCase(spec.name, tuple(spec.validate(given).items()))


def _value(v: str) -> Any:
    try:
        return float(v)
    except ValueError:
        return v


@dataclass
class Row:
    """One implementation timed on one configuration."""

    op: str
    direction: str
    dtype: str
    size: int
    threads: int
    mode: str  # "alloc" | "out"
    impl: str
    kind: str  # "backend" | "peer" | "baseline"
    median_s: float
    q1_s: float
    q3_s: float
    calls_per_sample: int
    samples: list[float] = field(default_factory=list)
    bytes: int = 0
    note: str = ""
    copy_s: float | None = None
    best_peer_s: float | None = None

    @property
    def ns_per_element(self) -> float:
        return self.median_s / self.size * 1e9

    @property
    def gb_per_s(self) -> float:
        return self.bytes / self.median_s / 1e9

    @property
    def spread(self) -> float:
        """Interquartile range relative to the median."""
        return (self.q3_s - self.q1_s) / self.median_s

    @property
    def vs_copy(self) -> float | None:
        return None if not self.copy_s else self.median_s / self.copy_s

    @property
    def speedup(self) -> float | None:
        """Best peer's time over this one (backends only)."""
        return None if self.kind != "backend" or not self.best_peer_s else self.best_peer_s / self.median_s

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Row:
        """A row back from `as_dict()` (a saved --json run)."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(ns_per_element=self.ns_per_element, gb_per_s=self.gb_per_s, spread=self.spread,
                 vs_copy=self.vs_copy, speedup_vs_best_peer=self.speedup)
        return d


def time_interleaved(fns: Sequence[Callable[[], Any]], samples: int = 7, sample_s: float = 2e-3,
                     budget_s: float = 3.0) -> list[tuple[list[float], int]]:
    """Per function: (seconds per call of each sample, calls per sample), rounds in rotating order."""
    calls: list[tuple[int, float]] = []
    pre: list[list[float]] = []
    for f in fns:  # warm up (first calls compile, build sessions, fault pages in), then calibrate
        t0 = time.perf_counter()
        f()
        one = time.perf_counter() - t0
        if one < 0.1:  # a slow call's first run is a fair estimate; time fast ones in growing batches
            n = 1
            while True:
                t0 = time.perf_counter()
                for _ in range(n):
                    f()
                took = time.perf_counter() - t0
                if took >= sample_s / 2 or n >= 1 << 20:
                    break
                n *= 4
            one = took / n
        one = max(one, 1e-8)
        calls.append((max(1, round(sample_s / one)), one))
        # A call of half a second or more: its warm-up is within noise of a timed call; keep it as a sample.
        # (Rounds then skip it once it has enough samples: 3, or 2 for calls of a second or more.)
        pre.append([one] if one >= 0.5 else [])
    per_round = sum(n * one for n, one in calls)
    rounds = max(3, min(samples, int(budget_s / max(per_round, 1e-9))))
    out: list[list[float]] = pre
    for r in range(rounds):
        for j in range(len(fns)):
            i = (j + r) % len(fns)
            if len(out[i]) >= (2 if calls[i][1] >= 1.0 else rounds):
                continue  # a call of a second or more: two samples say enough, and keep the run short
            f, n = fns[i], calls[i][0]
            t0 = time.perf_counter()
            for _ in range(n):
                f()
            out[i].append((time.perf_counter() - t0) / n)
    return [(s, c[0]) for s, c in zip(out, calls, strict=True)]


def host_backends(names: Sequence[str] | None = None) -> tuple[list[str], dict[str, str]]:
    """(available backends that take NumPy arrays, {name: why not} for the rest asked about)."""
    chosen, skipped = [], {}
    for name in names or registry.BACKEND_NAMES:
        registry.check_name(name)
        ok, why = registry.availability(name)
        mod = registry.module(name)
        if not ok:
            skipped[name] = why
        elif "numpy" not in mod.KINDS:
            skipped[name] = f"runs on {', '.join(mod.KINDS)} arrays, not NumPy arrays"
        else:
            chosen.append(name)
    return chosen, skipped


def _backend_bound(name: str, op: OpCase, direction: str, arrays, out, params) -> P.Bound | str:
    import multiact as ma

    mod = registry.module(name)
    if not mod.supports(op.op, direction, out.dtype.name):
        return f"{name} has no {op.op} {direction} kernel for {out.dtype}"
    if direction == "forward":
        f = getattr(ma, op.op)
        (x,) = arrays
        return P.Bound(name, lambda: f(x, backend=name, **params), lambda: f(x, out=out, backend=name, **params))
    g = getattr(ma, f"{op.op}_grad")
    if direction == "backward_y":
        dy, y = arrays
        return P.Bound(name, lambda: g(dy, y=y, backend=name, **params),
                       lambda: g(dy, y=y, out=out, backend=name, **params))
    dy, x = arrays
    return P.Bound(name, lambda: g(dy, x, backend=name, **params), lambda: g(dy, x, out=out, backend=name, **params))


def bind(impl: str, op: OpCase, direction: str, arrays: tuple[np.ndarray, ...], out: np.ndarray,
         threads: int) -> P.Bound | str:
    """Implementation 'backend:NAME' or 'peer:NAME' bound to `arrays` ((x,), (dy, x), or (dy, y) for
    backward_y) and `out`, or why not."""
    kind, _, name = impl.partition(":")
    params = op.call_params(out.dtype)
    if kind == "backend":
        return _backend_bound(name, op, direction, arrays, out, params)
    if kind == "peer":
        if not P.covers(name, op.op, direction):
            return f"no peer: {name} has no {op.op} {direction}"
        return P.make(name, op.op, direction, params, arrays, out, threads)
    raise ValueError(f"implementation must be 'backend:NAME' or 'peer:NAME', got {impl!r}")


def _compile_on_small(impl: str, op: OpCase, direction: str, arrays, out, threads: int) -> None:
    """Call once on 64 elements, so JIT compilation and session set-up are not mistaken for a slow first call."""
    small = bind(impl, op, direction, tuple(a[:64] for a in arrays), out[:64], threads)
    if isinstance(small, str):
        return
    for f in (small.alloc, small.into):
        if f is not None:
            f()


def _copy_bound(n_elements: int, dtype: np.dtype) -> Callable[[], Any]:
    src = np.ones(n_elements, dtype=dtype)
    dst = np.empty_like(src)
    return lambda: np.copyto(dst, src)


def _y_of(op: OpCase, x: np.ndarray) -> np.ndarray:
    """The forward output a backward_y starts from."""
    import multiact as ma

    return getattr(ma, op.op)(x, backend="numpy", **op.call_params(x.dtype))


def run(
    ops: Sequence[OpCase],
    dtypes: Sequence[str] = ("float32",),
    sizes: Sequence[int] = DEFAULT_SIZES,
    threads: Sequence[int] | None = None,
    directions: Sequence[str] = ("forward", "backward"),
    backends: Sequence[str] | None = None,
    peers: Sequence[str] = P.PEERS,
    modes: Sequence[str] = ("alloc",),
    samples: int = 7,
    budget_s: float = 2.0,
    progress: Callable | None = None,
) -> dict[str, Any]:
    """Time everything asked for; returns {"rows": [Row...], "skipped": [...], "missing_peers": {...}}."""
    import multiact as ma

    chosen, skipped_backends = host_backends(backends)
    peer_ok = {p: P.available(p) for p in peers}
    missing = {p: why for p, (ok, why) in peer_ok.items() if not ok}
    live_peers = [p for p in peers if peer_ok[p][0]]
    thread_list = list(threads or [ma.get_num_threads()])
    configs = [(op, dt, n, t, d) for op in ops for dt in dtypes for n in sizes for t in thread_list for d in directions]
    rows: list[Row] = []
    skipped: list[dict[str, str]] = []
    old_threads = ma.get_num_threads()
    rng = np.random.default_rng(0)
    data: dict[tuple[str, int], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    items = progress(configs, len(configs)) if progress else configs
    try:
        with np.errstate(all="ignore"):
            for op, dt, n, t, d in items:
                key = (dt, n)
                if key not in data:
                    data.clear()  # one size at a time in memory
                    x = (rng.standard_normal(n, dtype=np.float32) * 3).astype(dt)
                    dy = rng.standard_normal(n, dtype=np.float32).astype(dt)
                    data[key] = (x, dy, np.empty_like(x))
                x, dy, out = data[key]
                if d == "backward_y" and OPS[op.op].backward_y is None:
                    skipped.append({"impl": "all", "case": f"{op.label} {d} {dt}", "why": f"{op.op} has no y-form"})
                    continue
                arrays = (x,) if d == "forward" else (dy, _y_of(op, x)) if d == "backward_y" else (dy, x)
                rows += _one_config(op, d, np.dtype(dt), n, t, arrays, out, chosen, live_peers, modes, samples,
                                    budget_s, skipped)
    finally:
        ma.set_num_threads(old_threads)
    return {"rows": rows, "skipped": skipped, "skipped_backends": skipped_backends, "missing_peers": missing}


def _one_config(op, direction, dtype, n, threads, arrays, out, backends, peers, modes, samples, budget_s, skipped):
    import multiact as ma

    ma.set_num_threads(threads)
    bounds: list[tuple[str, P.Bound]] = []
    where = f"{op.label} {direction} {dtype.name}"
    for kind, name in [("backend", b) for b in backends] + [("peer", p) for p in peers]:
        res = bind(f"{kind}:{name}", op, direction, arrays, out, threads)
        if isinstance(res, str):
            skipped.append({"impl": name, "case": where, "why": res})
            continue
        bounds.append((kind, res))
        _compile_on_small(f"{kind}:{name}", op, direction, arrays, out, threads)
    streams = len(arrays) + 1
    nbytes = streams * n * dtype.itemsize
    fns: list[Callable[[], Any]] = [_copy_bound(max(1, streams * n // 2), dtype)]
    labels: list[tuple[str, str, str, str]] = [("copy", "baseline", "out", "")]
    for kind, b in bounds:
        for mode in modes:
            f = b.alloc if mode == "alloc" else b.into
            if f is None:
                skipped.append({"impl": b.name, "case": where, "why": f"no {mode} form"})
                continue
            fns.append(f)
            labels.append((b.name, kind, mode, b.note))
    timed = time_interleaved(fns, samples=samples, budget_s=budget_s)
    made = []
    for (name, kind, mode, note), (s, calls) in zip(labels, timed, strict=True):
        q1, med, q3 = np.percentile(s, [25, 50, 75])
        made.append(Row(op.label, direction, dtype.name, n, threads, mode, name, kind, float(med), float(q1),
                        float(q3), calls, [float(v) for v in s], nbytes, note))
    copy_s = made[0].median_s
    for r in made:
        r.copy_s = copy_s
        if r.kind == "backend":
            peer_times = [q.median_s for q in made if q.kind == "peer" and q.mode == r.mode]
            r.best_peer_s = min(peer_times) if peer_times else None
    return made


def header(cpu: dict[str, Any] | None = None) -> str:
    """The first line of `multiact bench` output: the CPU the figures were measured on (this machine's,
    or the `cpu` dict a saved run recorded)."""
    from . import sysinfo

    cpu = sysinfo.cpu() if cpu is None else cpu
    usable = f", {cpu['usable_cpus']} of {cpu['logical_cpus']} CPUs usable" if "usable_cpus" in cpu else ""
    return f"# CPU: {sysinfo.summary(cpu)}{usable}"


def plot(rows: Sequence[Row], path: str, title: str | None = None, note: str = "",
         cpu: dict[str, Any] | None = None) -> None:
    """GB/s against size, one panel per (op, direction, dtype).

    Colour: the implementation; solid: allocating calls, dashed: into a preallocated out=; marker: thread
    count; dotted grey: np.copyto of the same bytes, the bandwidth limit.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    from . import sysinfo

    panels: dict[tuple[str, str, str], list[Row]] = {}
    for r in rows:
        panels.setdefault((r.op, r.direction, r.dtype), []).append(r)
    keys = list(panels)
    ops = list(dict.fromkeys(k[0] for k in keys))
    cols = list(dict.fromkeys((k[1], k[2]) for k in keys))
    if len(ops) * len(cols) != len(keys) or len(cols) > 4:  # ragged: just wrap
        ncols = min(4, len(keys))
        grid = {k: divmod(i, ncols) for i, k in enumerate(keys)}
        nrows = (len(keys) + ncols - 1) // ncols
    else:
        ncols, nrows = len(cols), len(ops)
        grid = {k: (ops.index(k[0]), cols.index((k[1], k[2]))) for k in keys}
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.4 * ncols + 0.6, 3.3 * nrows + 1.4), squeeze=False)
    impls = list(dict.fromkeys(display_name(r, long=True) for r in rows if r.kind != "baseline"))
    spare = iter(("#aec7e8", "#98df8a", "#ffbb78", "#c5b0d5", "#c49c94", "#000000"))
    colors = {name: _COLORS.get(name) or next(spare, "k") for name in impls}
    threads = sorted({r.threads for r in rows})
    markers = dict(zip(threads, "osD^v<>ph", strict=False))
    modes = sorted({r.mode for r in rows if r.kind != "baseline"})
    for key, rs in panels.items():
        ax = axes[grid[key]]
        series: dict[tuple, list[Row]] = {}
        for r in rs:
            if r.kind == "baseline" and r.threads != threads[0]:
                continue  # np.copyto is single-threaded: one line is enough
            series.setdefault((r.kind, display_name(r, long=True), r.mode, r.threads), []).append(r)
        for (kind, name, mode, thr), pts in series.items():
            pts.sort(key=lambda r: r.size)
            xs = [r.size for r in pts]
            ys = [r.gb_per_s for r in pts]
            if kind == "baseline":
                ax.plot(xs, ys, color="0.55", ls=":", lw=1.6)
                continue
            backend = kind == "backend"
            ax.plot(xs, ys, color=colors[name], lw=2.4 if backend else 1.4, marker=markers[thr],
                    ms=5.5 if backend else 4.5, ls="--" if mode == "out" else "-")
            lo = [r.bytes / r.q3_s / 1e9 for r in pts]
            hi = [r.bytes / r.q1_s / 1e9 for r in pts]
            ax.fill_between(xs, lo, hi, color=colors[name], alpha=0.12, lw=0)
        sizes = sorted({r.size for r in rs})
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(sizes)
        ax.set_xticklabels([size_label(n) for n in sizes])
        ax.set_title(f"{key[0]} {key[1]} ({key[2]})", fontsize=11)
        ax.grid(True, which="major", alpha=0.3)
        ax.set_xlabel("elements", fontsize=9)
        ax.set_ylabel("GB/s (read + written)", fontsize=9)
    for i in range(nrows):
        for j in range(ncols):
            if (i, j) not in grid.values():
                axes[i, j].set_visible(False)
    handles = [Line2D([], [], color=colors[n], lw=2.4 if n.startswith("multiact") else 1.4) for n in impls]
    labels = list(impls)
    handles.append(Line2D([], [], color="0.55", ls=":", lw=1.6))
    labels.append("np.copyto, same bytes")
    if len(modes) > 1:
        handles += [Line2D([], [], color="k", ls="-"), Line2D([], [], color="k", ls="--")]
        labels += ["allocating", "into out="]
    if len(threads) > 1:
        handles += [Line2D([], [], color="k", ls="", marker=markers[t]) for t in threads]
        labels += [f"{t} thread{'s' if t > 1 else ''}" for t in threads]
    ncol = min(len(labels), max(3, 2 * ncols + 1))
    legend_rows = (len(labels) + ncol - 1) // ncol
    cpu = sysinfo.cpu() if cpu is None else cpu  # a saved run's plot names the CPU it was measured on
    thr = ",".join(str(t) for t in threads)
    fig.suptitle(title or f"multiact bench, {cpu.get('usable_cpus', '?')} CPUs, {thr} threads{note}; "
                 f"higher is better; band: interquartile range\n{sysinfo.summary(cpu)}", fontsize=11)
    bottom = (0.35 + 0.28 * legend_rows) / fig.get_figheight()
    fig.legend(handles, labels, loc="lower center", ncol=ncol, fontsize=9, frameon=False)
    fig.tight_layout(rect=(0, bottom, 1, 1 - 0.7 / fig.get_figheight()))  # two title lines
    _save_small(fig, path)
    plt.close(fig)


def _save_small(fig: Any, path: str) -> None:
    """PNG with a 256-colour palette where Pillow is there (a few times smaller; line plots lose nothing)."""
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    try:
        from PIL import Image

        img = Image.open(io.BytesIO(buf.getvalue())).convert("RGB")
        img.quantize(colors=256, method=Image.Quantize.MEDIANCUT).save(path, optimize=True)
    except Exception:  # no Pillow, or an old one: the plain PNG
        with open(path, "wb") as f:
            f.write(buf.getvalue())


# Fixed colours, so that plots from different runs and machines read alike.
_COLORS = {
    "multiact native": "#1f77b4", "multiact numba": "#2ca02c", "multiact numpy": "#17becf",
    "multiact onnxruntime": "#9467bd", "multiact cuda": "#bcbd22", "multiact ascend": "#e377c2",
    "PyTorch": "#d62728", "ONNX Runtime": "#ff7f0e", "NumPy formula": "#8c564b",
}

PEER_LABELS = {"torch": "PyTorch", "onnxruntime": "ONNX Runtime", "numpy": "NumPy formula"}


def display_name(r: Row, long: bool = False) -> str:
    """'ma:numba' for a backend, the peer's name for a peer ('np formula' for the NumPy one)."""
    if r.kind == "backend":
        return f"multiact {r.impl}" if long else f"ma:{r.impl}"
    if r.kind == "peer":
        return PEER_LABELS.get(r.impl, r.impl) if long else {"numpy": "np formula"}.get(r.impl, r.impl)
    return "np.copyto" if long else "copy"
