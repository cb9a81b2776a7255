"""`multiact check --subset | --dense`: float32 accuracy over strided sets of the input bit patterns, and the
rules every sweep judges by (`multiact check --exhaustive`, exhaustive.py, computes the same rules compiled).

The shared suite samples inputs; this sweeps them.  Each op (its default parameters, each kernel key,
plus the non-default cases of `SWEEP_CASES`) is run forward, backward (dy = 1 and dy = DY2) and from
its output (y-form) on float32 inputs taken from the 2^32 bit patterns (NaN patterns only sampled),
and judged against the float64 reference in float32 ULP of the reference:

- forward: |got - ref| / ulp(ref) where |ref| >= FLT_MIN (the contract's bound: 4), less the op's
  declared cancellation fwd_atol * eps |x| (`Tolerance`: hardsigmoid, logsigmoid, softshrink, whose
  x + c cancels next to x = -c, c a parameter-derived constant rounded to float32); outputs below
  FLT_MIN are reported apart, in units of the smallest subnormal;
- backward: |got - ref| / ulp(ref), relative, everywhere but around the zero crossings of f' away from a
  kink (the x * gate(x) ops': f' = g + x g', g = f / x), where its two terms cancel (|f'| below half of
  |g| + |x g'|, `consistency.crossings`, derived from the references): there (|got - ref| - FLOOR)+ / ulp(ref),
  FLOOR = 2 eps |dy| (|g| + |x g'|) (eps = FLT_EPSILON); from the output (y-form), (|got - ref| - 2 eps
  |dy y|)+ / ulp(ref) (a y-form that adds a constant to y, as elu's y + alpha, cancels: the contract's y_atol).

A result that should be NaN, +-inf or an overflow must be exactly that (counted as `special` misses).
The regions of the histogram are |x| < 1, 1 <= |x| < 10, |x| >= 10 (tails) and subnormal outputs.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from .. import api
from .. import consistency as C
from ..optable import OPS, OpSpec
from .served import ServedISA

Backend = str | ServedISA | None  # a backend's name (None: the default), or a served ISA's kernels
# ops whose native kernel is not elementwise (an array parameter's: served.py serves those only)
UNSERVED = tuple(name for name, spec in OPS.items() if spec.defn.array_param)

FLT_MIN = float(np.finfo(np.float32).tiny)
EPS32 = float(np.finfo(np.float32).eps)
BOUND = 4.0  # the contract, in float32 ULP
FLOOR_ATOL = 2.0  # a backward's absolute floor around the zero crossings of f', in eps |dy| (|g| + |x g'|)
# The rule in one sentence (the results' headers and the docs carry it).
RULE = (f"every result within {BOUND:g} float32 ulp of the float64 reference, relatively, except a backward where "
        "the terms of f' = g + x g' (g = f/x) cancel around a zero crossing of f' (|f'| < (|g| + |x g'|)/2), "
        f"which may be off by {FLOOR_ATOL:g} eps |dy| (|g| + |x g'|) more")
DY2 = -0.6180339887  # the second, fixed upstream gradient (irrational, so products round)
SUBSET_STRIDE = 1 << 12  # the CI subset: every 4096th bit pattern (2^20 points, 2048 per binade)
SUBSET_OFFSET = 1237  # an odd offset, so the subset is not only round numbers
REGIONS = ("|x|<1", "1<=|x|<10", "tails", "subnormal y")

# Non-default parameters swept densely (2^24 points), per op (issue 19's list).
SWEEP_CASES: dict[str, tuple[dict[str, Any], ...]] = {
    "leaky_relu": ({"negative_slope": 0.2},),
    "elu": ({"alpha": 0.3}, {"alpha": 3.0}),
    "celu": ({"alpha": 0.3}, {"alpha": 3.0}),
    "swish": ({"beta": 0.5}, {"beta": 1.702}),
    "softplus": ({"beta": 2.0, "threshold": 10.0},),
    "hardtanh": ({"min_val": -2.0, "max_val": 3.0},),
    "softshrink": ({"lambd": 0.1}, {"lambd": 2.0}),
    "hardshrink": ({"lambd": 0.1}, {"lambd": 2.0}),
}


@dataclass
class Stats:
    """One (op, case, direction) on one backend over the points seen so far."""

    op: str
    case: str
    direction: str
    backend: str
    points: int = 0
    max_ulp: float = 0.0
    worst_x: float = 0.0
    worst_got: float = 0.0
    worst_ref: float = 0.0
    over_bound: int = 0  # points above BOUND (normal outputs)
    special_miss: int = 0  # NaN / inf / overflow not reproduced
    subnormal_max: float = 0.0  # largest error of a subnormal output, in units of 2^-149
    region_max: dict[str, float] = field(default_factory=lambda: dict.fromkeys(REGIONS, 0.0))
    region_over: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REGIONS, 0))

    def merge(self, other: Stats) -> None:
        self.points += other.points
        if other.max_ulp > self.max_ulp:
            self.max_ulp, self.worst_x = other.max_ulp, other.worst_x
            self.worst_got, self.worst_ref = other.worst_got, other.worst_ref
        self.over_bound += other.over_bound
        self.special_miss += other.special_miss
        self.subnormal_max = max(self.subnormal_max, other.subnormal_max)
        for r in REGIONS:
            self.region_max[r] = max(self.region_max[r], other.region_max[r])
            self.region_over[r] += other.region_over[r]

    @property
    def passed(self) -> bool:
        return self.over_bound == 0 and self.special_miss == 0


def bit_points(start: int, stop: int, stride: int = 1, offset: int = 0, nan_stride: int = 1 << 16) -> np.ndarray:
    """float32 values of the bit patterns start + offset, ... (step stride) below stop; NaN patterns only
    every nan_stride-th (there are 2^24 of them, all alike to a kernel)."""
    bits = np.arange(start + offset, stop, stride, dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32)
    nan = np.isnan(x)
    if nan.any():
        keep = ~nan | (bits % np.uint32(nan_stride) == 0)
        x = x[keep]
    return x


def spacing32(ref: np.ndarray) -> np.ndarray:
    """The spacing of float32 at |ref| (float64 ref; the subnormal spacing below FLT_MIN)."""
    _, e = np.frexp(np.abs(ref))
    return np.ldexp(1.0, np.maximum(e - 24, -149))


def ulps(got: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """|got - ref| in float32 ULP of ref."""
    with np.errstate(invalid="ignore"):
        return np.abs(got.astype(np.float64) - ref) / spacing32(ref)


def _regions(x: np.ndarray, ref: np.ndarray) -> dict[str, np.ndarray]:
    ax = np.abs(x.astype(np.float64))
    sub = np.abs(ref) < FLT_MIN
    return {"|x|<1": (ax < 1) & ~sub, "1<=|x|<10": (ax >= 1) & (ax < 10) & ~sub, "tails": (ax >= 10) & ~sub,
            "subnormal y": sub}


def judge(got: np.ndarray, ref: np.ndarray, x: np.ndarray, floor: np.ndarray | float, stats: Stats) -> Stats:
    """Fold one chunk's results into stats (ref: float64; floor: the absolute error allowed on top)."""
    stats.points += x.size
    ref32 = ref.astype(np.float32)
    g = got.astype(np.float64)
    special = ~np.isfinite(ref32)
    bad_special = special & ~((g == ref32) | (np.isnan(g) & np.isnan(ref32)))
    stats.special_miss += int(bad_special.sum())
    finite = ~special
    with np.errstate(invalid="ignore", over="ignore"):
        excess = np.where(np.isfinite(g), np.maximum(np.abs(g - ref) - floor, 0.0), np.inf)
        err = np.where(finite, excess / spacing32(np.where(finite, ref, 1.0)), 0.0)
    regions = _regions(x, ref)
    sub = regions["subnormal y"] & finite
    if sub.any():
        stats.subnormal_max = max(stats.subnormal_max, float(np.max(excess[sub] / 2.0 ** -149)))
    normal = finite & ~sub
    if normal.any():
        e = np.where(normal, err, 0.0)
        i = int(np.argmax(e))
        if e[i] > stats.max_ulp:
            stats.max_ulp, stats.worst_x = float(e[i]), float(x[i])
            stats.worst_got, stats.worst_ref = float(g[i]), float(ref[i])
        stats.over_bound += int((e > BOUND).sum())
    for r, m in regions.items():
        m = m & finite
        if m.any() and r != "subnormal y":
            stats.region_max[r] = max(stats.region_max[r], float(np.max(err[m])))
            stats.region_over[r] += int((err[m] > BOUND).sum())
        elif m.any():
            stats.region_max[r] = max(stats.region_max[r], float(np.max(excess[m] / 2.0 ** -149)))
    return stats


def cases(ops: Sequence[str] | None = None, dense: bool = False) -> list[tuple[str, dict[str, Any]]]:
    """(op, params): every op's defaults and one case per further kernel key (gelu's tanh form); with
    dense, the non-default cases of SWEEP_CASES instead. prelu runs with one weight, 0.25."""
    out = []
    for name, spec in OPS.items():
        if ops and name not in ops:
            continue
        if dense:
            out += [(name, dict(p)) for p in SWEEP_CASES.get(name, ())]
            continue
        seen = set()
        for key in spec.keys:
            for p in C.key_cases(spec, key)[:1]:
                array = spec.defn.array_param
                if array:  # one weight, on a 1-D x
                    p = {array: np.array([0.25], dtype=np.float32), "axis": 0}
                k = C.case_id({a: v for a, v in p.items() if a != array})
                if k not in seen:
                    seen.add(k)
                    out.append((name, dict(p)))
    return out


def directions(spec: OpSpec) -> list[str]:
    return ["forward", "backward"] + (["backward_y"] if spec.backward_y is not None else [])


def _outputs(spec: OpSpec, direction: str, params: dict[str, Any], backend: Backend, *ins: np.ndarray) -> Any:
    """The backend's results on ins (x; dy and x; dy and y): through the API, or a served ISA's kernel."""
    if isinstance(backend, ServedISA):
        p = spec.validate(params)  # what the API passes a kernel
        return backend.run(spec.kernel_key(p), direction, p, *ins)
    if direction == "forward":
        return api.forward(spec.name, *ins, backend=backend, **params)
    if direction == "backward":
        return api.backward(spec.name, *ins, backend=backend, **params)
    return api.backward(spec.name, ins[0], y=ins[1], backend=backend, **params)


def _call(spec: OpSpec, direction: str, params: dict[str, Any], backend: Backend, x: np.ndarray,
          dy: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray | float]:
    """(got, ref, floor) for one chunk."""
    if direction == "forward":
        got = _outputs(spec, direction, params, backend, x)
        # the op's declared cancellation (Tolerance.fwd_atol: x + c near x = -c, c a rounded constant)
        floor = spec.tol.fwd_atol * EPS32 * np.abs(x.astype(np.float64))
        return got, C.reference(spec, "forward", params, np.float32, x), floor
    if direction == "backward":
        got = _outputs(spec, direction, params, backend, dy, x)
        # the terms of f' cancel around its zero crossings: an absolute floor there only
        floor = FLOOR_ATOL * EPS32 * np.abs(dy.astype(np.float64)) * C.cancel_terms(spec, params, np.float32, x)
        return got, C.reference(spec, "backward", params, np.float32, dy, x), floor
    with np.errstate(all="ignore"):
        y = C.reference(spec, "forward", params, np.float32, x).astype(np.float32)
    got = _outputs(spec, direction, params, backend, dy, y)
    # a y-form that adds a constant to y (elu's y + alpha, selu's) cancels: eps |dy y| more, everywhere
    floor = 2.0 * EPS32 * np.abs(dy.astype(np.float64) * y)
    return got, C.reference(spec, "backward_y", params, np.float32, dy, y), floor


def measure_chunk(op: str, params: dict[str, Any], backend: Backend, x: np.ndarray,
                  dirs: Iterable[str] | None = None) -> list[Stats]:
    """Every direction (and both dy) of one op on one chunk of points."""
    spec = OPS[op]
    case = C.case_id({a: v for a, v in params.items() if a != spec.defn.array_param})
    label = backend.label if isinstance(backend, ServedISA) else backend or "auto"
    out = []
    with np.errstate(all="ignore"):
        for direction in dirs or directions(spec):
            dys = [None] if direction == "forward" else [np.float32(1.0), np.float32(DY2)]
            for dyv in dys:
                tag = direction if dyv is None else f"{direction} dy={float(dyv):.4g}"
                dy = None if dyv is None else np.full_like(x, dyv)
                # the y-form takes outputs: inputs whose forward is NaN/inf say nothing about it
                xs = x
                if direction == "backward_y":
                    y = C.reference(spec, "forward", params, np.float32, x).astype(np.float32)
                    keep = np.isfinite(y)
                    xs, dy = x[keep], dy[keep]
                got, ref, floor = _call(spec, direction, params, backend, xs, dy)
                s = Stats(op, case, tag, label)
                out.append(judge(np.asarray(got), np.asarray(ref, dtype=np.float64), xs, floor, s))
    return out


def _chunk_job(job: tuple[str, dict[str, Any], Backend, int, int, int, int]) -> list[Stats]:
    op, params, backend, start, stop, stride, offset = job
    return measure_chunk(op, params, backend, bit_points(start, stop, stride, offset))


def chunks(stride: int, offset: int, per_chunk: int = 1 << 22) -> Iterator[tuple[int, int]]:
    """[start, stop) ranges of the 2^32 patterns holding about per_chunk points each."""
    span = per_chunk * stride
    for start in range(0, 1 << 32, span):
        yield start, min(start + span, 1 << 32)


def run(ops: Sequence[str] | None = None, backend: Backend = None, *, dense: bool = False,
        stride: int | None = None, workers: int | None = None,
        progress: Callable[[Iterable, int], Iterable] | None = None) -> list[Stats]:
    """Sweep the ops on one backend: every 256th pattern (dense: the non-default parameter cases), or the
    CI subset (every SUBSET_STRIDE-th), or every stride-th; chunks in parallel over workers processes."""
    if stride is None:
        stride = 256 if dense else SUBSET_STRIDE
    offset = 0 if stride == 1 else SUBSET_OFFSET % stride
    todo = cases(ops, dense)
    if isinstance(backend, ServedISA):  # prelu's kernel takes a weight array: not served
        todo = [(op, p) for op, p in todo if op not in UNSERVED]
    jobs = [(op, p, backend, a, b, stride, offset) for op, p in todo for a, b in chunks(stride, offset)]
    workers = workers or (os.cpu_count() or 1)
    merged: dict[tuple[str, str, str], Stats] = {}
    if workers == 1:
        results: Iterable[list[Stats]] = map(_chunk_job, jobs)
    else:
        pool = ProcessPoolExecutor(workers)
        results = pool.map(_chunk_job, jobs, chunksize=1)
    if progress is not None:
        results = progress(results, len(jobs))
    try:
        for rows in results:
            for s in rows:
                k = (s.op, s.case, s.direction)
                if k in merged:
                    merged[k].merge(s)
                else:
                    merged[k] = s
    finally:
        if workers != 1:
            pool.shutdown(cancel_futures=True)
    return list(merged.values())


def render(rows: Sequence[Stats], header: str = "") -> str:
    """A table: per op, case and direction the max ULP, where, the count above the bound, per region."""
    lines = [header] if header else []
    lines.append(f"{'op':<12} {'case':<26} {'direction':<20} {'points':>11} {'max ulp':>9} {'at x':>13} "
                 f"{'>4':>6} {'miss':>5} " + " ".join(f"{r:>11}" for r in REGIONS))
    for s in rows:
        reg = " ".join(f"{s.region_max[r]:>11.3g}" for r in REGIONS)
        lines.append(f"{s.op:<12} {s.case[:26]:<26} {s.direction:<20} {s.points:>11} {s.max_ulp:>9.3g} "
                     f"{s.worst_x:>13.6g} {s.over_bound:>6} {s.special_miss:>5} {reg}")
    bad = [s for s in rows if not s.passed]
    lines.append(f"{len(rows) - len(bad)} of {len(rows)} within {BOUND:g} ULP (subnormal-output column: "
                 "error in units of 2^-149)")
    return "\n".join(lines)


def as_json(rows: Sequence[Stats]) -> list[dict[str, Any]]:
    return [{k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in asdict(s).items()}
            for s in rows]


def command(args: Any, progress: Callable[[Iterable, int], Iterable] | None = None) -> int:
    """`multiact check --dense | --subset`: one backend (default native), one ISA (--isa, native only: chosen
    before any kernel loads, so the worker processes inherit it; with --serve, an ISA this machine cannot
    run, its kernels computed by its C harness, served.py)."""
    from . import served, sysinfo

    backend = (args.backend or [["native"]])[0][0]
    target: Backend = backend
    if getattr(args, "serve", False):
        if backend != "native" or not args.isa:
            raise SystemExit("multiact check --serve: needs --isa ISA (native: the ISA's C harness serves its "
                             "kernels, e.g. --isa neon under qemu-aarch64)")
        target = served.served(args.isa)
    elif args.isa:
        if backend != "native":
            raise SystemExit("multiact check: --isa applies to the native backend only")
        os.environ["MULTIACT_NATIVE_ISA"] = args.isa
    ops = selected_ops(args)
    from ..backend import native_backend

    if isinstance(target, served.ServedISA):
        where = (f", ISA {target.isa} served by `{target.command}`"
                 + (f", HARNESS_OPT={target.opt}" if target.opt else ""))
    else:
        where = f", ISA {native_backend.info()['isa']}" if backend == "native" else ""
    stride = args.stride or (256 if args.dense else SUBSET_STRIDE)
    mode = (f"dense (every {stride}th pattern, non-default parameters)" if args.dense
            else f"subset (every {stride}th pattern)")
    header = (f"CPU: {sysinfo.describe(sysinfo.identity())}\nmultiact check {mode}: backend {backend}{where}; "
              f"bound {BOUND:g} ULP\nrule: {RULE}")
    rows = run(ops, target, dense=args.dense, stride=stride, workers=args.workers, progress=progress)
    print(render(rows, header))
    if args.json:
        write_json(args.json, header, rows)
    return 0 if all(s.passed for s in rows) else 1


def selected_ops(args: Any) -> list[str] | None:
    """The sweeps' --op list (None: every op), refused whole if it names an op the table lacks."""
    ops = [o for group in args.op for o in group] if args.op else None
    unknown = sorted(set(ops or ()) - set(OPS))
    if unknown:
        raise SystemExit(f"multiact check: unknown op(s) {', '.join(unknown)}; valid: {', '.join(OPS)}")
    return ops


def write_json(dest: str, header: str, rows: Sequence[Stats]) -> None:
    """A sweep's --json: the header and every row, to a file or ('-') to stdout."""
    import json

    text = json.dumps({"header": header, "rows": as_json(rows)}, indent=1)
    if dest == "-":
        print(text)
    else:
        with open(dest, "w") as f:
            f.write(text + "\n")
