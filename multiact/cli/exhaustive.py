"""`multiact check --exhaustive`: every float32 input of every op, on every native ISA this machine runs.

accuracy.py's sweep (NumPy judge, reference.py's float64 reference) costs about 0.5 us per point and
direction (gelu's float64 erfc goes through libm element by element): all 2^32 patterns for the 93
(op, case, direction) rows would take days on two cores.  This engine keeps accuracy.py's rules and changes
how they are computed:

- the float64 reference is the numba backend's float64 kernels: the same formulas as reference.py,
  compiled against libm; `crosscheck` holds them to reference.py within `REF_AGREE` float32 ulp (the
  reference's own accuracy against mpmath is tests/test_accuracy.py's), tests/test_exhaustive.py on a stride;
- the judge is one compiled loop with accuracy.judge's rules (the same test compares the two);
- each chunk's reference serves every ISA, so scalar and AVX2 cost one reference.

Jobs (2^24 patterns each) append their statistics to a journal as they finish; a stopped run started
again with the same journal skips the jobs it holds.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict
from functools import cache
from typing import Any

import numpy as np

from .. import consistency as C
from ..optable import OPS
from . import _report
from . import accuracy as A

CHUNK = 1 << 16  # points per kernel call: the float64 arrays of one chunk stay in L2
JOB = 1 << 24  # bit patterns per job (256 jobs for 2^32)
REF_AGREE = 1e-2  # float32 ulp: how far the compiled reference may stand from reference.py

# The judge's absolute floor is fx |x| + fdy |dy| tc + fy |dy y|, accuracy.py's rules, tc the terms of f' where
# they cancel around its zero crossings (consistency.cancel_terms; 0 elsewhere); _E2 is 2 eps.
_E2 = 2.0 * A.EPS32


def _judge_loop():
    """The compiled judge (built on first use; numba is an optional dependency)."""
    import numba

    flt_min, bound, tiny = A.FLT_MIN, A.BOUND, 2.0 ** -149
    # 1 / float32's spacing at |r| = 2^(23 - e), by r's float64 exponent field (normal float32 |r| only)
    inv_spacing = np.ldexp(1.0, np.clip(1023 + 23 - np.arange(2048), -1074, 1023))

    @numba.njit(cache=True, nogil=True, error_model="numpy")
    def judge(x, got, ref, y, dy, tc, fx, fdy, fy, sf, si):  # pragma: no cover - compiled
        # sf: max_ulp, worst_x, worst_got, worst_ref, subnormal_max, region_max[4]
        # si: points, over_bound, special_miss, region_over[4]; kept in locals inside the loop
        bits = ref.view(np.int64)
        top, wx, wg, wr, sub = sf[0], sf[1], sf[2], sf[3], sf[4]
        m0, m1, m2 = sf[5], sf[6], sf[7]
        over, miss, o0, o1, o2 = si[1], si[2], si[3], si[4], si[5]
        ady = abs(dy)
        for i in range(x.shape[0]):
            xi = np.float64(x[i])
            g = np.float64(got[i])
            r = ref[i]
            r32 = np.float64(np.float32(r))
            if not np.isfinite(r32):
                if not (g == r32 or (np.isnan(g) and np.isnan(r32))):
                    miss += 1
                continue
            ax = abs(xi)
            floor = fx * ax + fy * abs(dy * np.float64(y[i])) + fdy * ady * tc[i]
            excess = max(abs(g - r) - floor, 0.0) if np.isfinite(g) else np.inf
            if abs(r) < flt_min:
                sub = max(sub, excess / tiny)
                continue
            e = excess * inv_spacing[(bits[i] >> 52) & 0x7FF]
            if e > top:
                top, wx, wg, wr = e, xi, g, r
            if ax < 1.0:
                m0 = max(m0, e)
                if e > bound:
                    over += 1
                    o0 += 1
            elif ax < 10.0:
                m1 = max(m1, e)
                if e > bound:
                    over += 1
                    o1 += 1
            else:
                m2 = max(m2, e)
                if e > bound:
                    over += 1
                    o2 += 1
        sf[0], sf[1], sf[2], sf[3], sf[4] = top, wx, wg, wr, sub
        sf[5], sf[6], sf[7], sf[8] = m0, m1, m2, sub
        si[0] += x.shape[0]
        si[1], si[2], si[3], si[4], si[5] = over, miss, o0, o1, o2

    return judge


@cache
def _judge() -> Callable:
    return _judge_loop()


def _stats(op: str, case: str, tag: str, isa: str, sf: np.ndarray, si: np.ndarray) -> A.Stats:
    s = A.Stats(op, case, tag, f"native/{isa}", points=int(si[0]), max_ulp=float(sf[0]), worst_x=float(sf[1]),
                worst_got=float(sf[2]), worst_ref=float(sf[3]), over_bound=int(si[1]), special_miss=int(si[2]),
                subnormal_max=float(sf[4]))
    for k, r in enumerate(A.REGIONS):
        s.region_max[r] = float(sf[5 + k])
        s.region_over[r] = int(si[3 + k]) if k < 3 else 0
    return s


class _Row:
    """One (op, case, direction, dy) with its kernels: the reference's and each ISA's."""

    def __init__(self, op: str, params: dict[str, Any], direction: str, dy: float | None, isas: Sequence[str]):
        from ..backend import native_backend, numba_backend

        spec = OPS[op]
        self.op, self.direction, self.dy = op, direction, dy
        array = spec.defn.array_param  # prelu's weight: its parameters as given
        self.case = C.case_id({a: v for a, v in params.items() if a != array})
        self.tag = direction if dy is None else f"{direction} dy={dy:.4g}"
        self.p = params if array else spec.validate(params)  # what api passes a kernel
        self.p_ref = params if array else C._rounded(spec, params, np.float32)  # the float32 kernels' values
        key = spec.kernel_key(self.p)
        self.ref = numba_backend.kernel(key, direction, "float64")
        self.kernels = {isa: native_backend.kernel(key, direction, "float32", isa=isa) for isa in isas}
        self.fx = spec.tol.fwd_atol * A.EPS32 if direction == "forward" else 0.0
        self.fdy = A.FLOOR_ATOL * A.EPS32 if direction == "backward" else 0.0
        # the crossings' neighbourhoods (where the floor applies), and the op and parameters to size it
        self.spec, self.params = spec, params
        self.near = C.crossings(spec, params) if direction == "backward" else ()
        self.fy = _E2 if direction == "backward_y" else 0.0
        self.sf = {isa: np.zeros(9) for isa in isas}
        self.si = {isa: np.zeros(7, dtype=np.int64) for isa in isas}

    def stats(self) -> list[A.Stats]:
        return [_stats(self.op, self.case, self.tag, isa, self.sf[isa], self.si[isa]) for isa in self.kernels]


def rows(ops: Sequence[str] | None, isas: Sequence[str]) -> list[_Row]:
    """Every (op, case, direction, dy) of accuracy.cases (the defaults and each kernel key)."""
    out = []
    for op, params in A.cases(ops):
        for direction in A.directions(OPS[op]):
            for dy in ([None] if direction == "forward" else [1.0, A.DY2]):
                out.append(_Row(op, params, direction, dy, isas))
    return out


def _fold(sf: np.ndarray, si: np.ndarray, tf: np.ndarray, ti: np.ndarray) -> None:
    """Add one chunk's statistics (tf, ti, from zero) to a row's (sf, si): the judge's own rules."""
    if tf[0] > sf[0]:
        sf[:4] = tf[:4]
    np.maximum(sf[4:], tf[4:], out=sf[4:])
    si += ti


def _run_chunk(table: list[_Row], x: np.ndarray) -> None:
    """Judge every row on one chunk; the forward reference of an (op, case) feeds its y-form rows.  ISAs
    whose results are bit for bit those of an ISA judged before take its statistics (most chunks)."""
    judge = _judge()
    with np.errstate(invalid="ignore"):  # NaN patterns
        x64 = x.astype(np.float64)
    ref = np.empty_like(x64)
    gots = [np.empty_like(x), np.empty_like(x)]
    zeros = np.zeros(x.size)
    first_f, first_i = np.zeros(9), np.zeros(7, dtype=np.int64)
    other_f, other_i = np.zeros(9), np.zeros(7, dtype=np.int64)
    y32: dict[tuple[str, str], np.ndarray] = {}
    units: dict[tuple[str, str, str], np.ndarray] = {}
    with np.errstate(all="ignore"):
        for row in table:
            if row.direction == "forward":
                row.ref(x64, ref, row.p_ref)
                y32[(row.op, row.case)] = ref.astype(np.float32)
                xs, r, arg, dy, args = x, ref, x, 0.0, (x,)
            else:
                if row.direction == "backward":
                    xs, ins = x, x64
                else:  # the y-form takes outputs: inputs whose forward is NaN/inf say nothing about it
                    y = y32[(row.op, row.case)]
                    keep = np.isfinite(y)
                    xs, ins = x[keep], y[keep].astype(np.float64)
                dyv = np.full(xs.shape, np.float32(row.dy), dtype=np.float32)
                r = ref[: xs.size]
                unit = units.get((row.op, row.case, row.direction))
                if unit is None:  # every backward is linear in dy: the dy = 1 reference serves the others
                    row.ref(dyv.astype(np.float64), ins, r, row.p_ref)
                    if row.dy == 1.0:
                        units[(row.op, row.case, row.direction)] = r.copy()
                else:
                    np.multiply(unit, np.float64(np.float32(row.dy)), out=r)
                arg = xs if row.direction == "backward" else ins.astype(np.float32)
                dy = float(np.float32(row.dy))
                args = (dyv, arg)
            n = xs.size
            tc = zeros[:n]
            if row.near:
                tc = C.cancel_terms(row.spec, row.params, np.float32, xs)
            first: np.ndarray | None = None  # the first ISA's results; its statistics in first_f, first_i
            for isa, k in row.kernels.items():
                g = gots[0 if first is None else 1][:n]
                k(*args, g, row.p)
                if first is not None and np.array_equal(g.view(np.uint32), first.view(np.uint32)):
                    _fold(row.sf[isa], row.si[isa], first_f, first_i)
                    continue
                tf, ti = (first_f, first_i) if first is None else (other_f, other_i)
                tf[:], ti[:] = 0.0, 0
                judge(xs, g, r, arg, dy, tc, row.fx, row.fdy, row.fy, tf, ti)
                _fold(row.sf[isa], row.si[isa], tf, ti)
                first = g if first is None else first


def measure(ops: Sequence[str] | None, isas: Sequence[str], start: int, stop: int, stride: int = 1,
            offset: int = 0) -> list[A.Stats]:
    """Every row on the bit patterns start + offset, ... (step stride) below stop."""
    table = rows(ops, isas)
    span = CHUNK * stride
    for a in range(start, stop, span):
        x = A.bit_points(a, min(a + span, stop), stride, offset)
        if x.size:
            _run_chunk(table, x)
    return [s for row in table for s in row.stats()]


def _job(args: tuple) -> tuple[int, list[dict[str, Any]]]:
    ops, isas, start, stop, stride, offset = args
    from .. import set_num_threads

    set_num_threads(1)
    return start, [asdict(s) for s in measure(ops, isas, start, stop, stride, offset)]


def _merge(merged: dict[tuple, A.Stats], rows_: Iterable[dict[str, Any]]) -> None:
    for d in rows_:
        s = A.Stats(**d)
        k = (s.op, s.case, s.direction, s.backend)
        if k in merged:
            merged[k].merge(s)
        else:
            merged[k] = s


def run(ops: Sequence[str] | None = None, isas: Sequence[str] | None = None, *, stride: int = 1,
        workers: int | None = None, journal: str | None = None,
        progress: Callable[[Iterable, int], Iterable] | None = None) -> list[A.Stats]:
    """The sweep over every ISA at once (default: all this machine runs), jobs over worker processes."""
    from ..backend import native_backend

    isas = list(isas or native_backend.info()["isas"])
    offset = 0 if stride == 1 else A.SUBSET_OFFSET % stride
    span = max(JOB, CHUNK * stride)
    jobs = [(tuple(ops) if ops else None, tuple(isas), a, min(a + span, 1 << 32), stride, offset)
            for a in range(0, 1 << 32, span)]
    merged: dict[tuple, A.Stats] = {}
    head = {"ops": list(ops) if ops else None, "isas": isas, "stride": stride}
    if journal and os.path.exists(journal):
        with open(journal) as f:
            lines = [json.loads(line) for line in f if line.strip()]
        if lines and lines[0].get("head") != head:
            raise SystemExit(f"multiact check: journal {journal} is of another run ({lines[0].get('head')}); "
                             "give a new file")
        done = {d["job"] for d in lines[1:]}
        for d in lines[1:]:
            _merge(merged, d["rows"])
        jobs = [j for j in jobs if j[2] not in done]
    elif journal:
        with open(journal, "w") as f:
            f.write(json.dumps({"head": head}) + "\n")
    workers = workers or (os.cpu_count() or 1)
    pool = ProcessPoolExecutor(workers) if workers > 1 and len(jobs) > 1 else None
    results: Iterable = pool.map(_job, jobs, chunksize=1) if pool else map(_job, jobs)
    if progress is not None:
        results = progress(results, len(jobs))
    try:
        for start, found in results:
            _merge(merged, found)
            if journal:
                with open(journal, "a") as f:
                    f.write(json.dumps({"job": start, "rows": found}) + "\n")
    finally:
        if pool:
            pool.shutdown(cancel_futures=True)
    order = {(r.op, r.case, r.tag): i for i, r in enumerate(rows(ops, isas))}
    return sorted(merged.values(), key=lambda s: (order.get((s.op, s.case, s.direction), 0), s.backend))


def crosscheck(ops: Sequence[str] | None = None, stride: int = 1 << 16) -> list[tuple[str, str, str, float]]:
    """(op, case, direction, largest distance in float32 ulp) of the compiled reference from reference.py on
    every stride-th pattern, where the float32 result is normal: what lets it stand in for reference.py."""
    from ..backend import numba_backend

    x = A.bit_points(0, 1 << 32, stride, A.SUBSET_OFFSET % stride)
    out = []
    with np.errstate(all="ignore"):
        for op, params in A.cases(ops):
            spec = OPS[op]
            array = spec.defn.array_param  # prelu's weight: its parameters as given
            p_ref = params if array else C._rounded(spec, params, np.float32)
            key = spec.kernel_key(params if array else spec.validate(params))
            case = C.case_id({a: v for a, v in params.items() if a != array})
            for direction in A.directions(spec):
                dy = np.full_like(x, np.float32(A.DY2))
                ins = (x,)
                if direction == "backward":
                    ins = (dy, x)
                elif direction == "backward_y":
                    y = C.reference(spec, "forward", params, np.float32, x).astype(np.float32)
                    keep = np.isfinite(y)
                    ins = (dy[keep], y[keep])
                want = np.asarray(C.reference(spec, direction, params, np.float32, *ins), dtype=np.float64)
                got = np.empty(ins[-1].shape)
                numba_backend.kernel(key, direction, "float64")(*(a.astype(np.float64) for a in ins), got, p_ref)
                normal = np.isfinite(want) & (np.abs(want) >= A.FLT_MIN)
                far = float(np.max(A.ulps(got[normal], want[normal]), initial=0.0))
                small = np.isfinite(want) & ~normal  # below float32's normal range: absolute, in 2^-149
                far = max(far, float(np.max(np.abs(got[small] - want[small]), initial=0.0)) / 2.0 ** -149)
                special = ~np.isfinite(want)
                if not ((got[special] == want[special]) | (np.isnan(got[special]) & np.isnan(want[special]))).all():
                    far = np.inf
                out.append((op, case, direction, far))
    return out


def summary(rows_: Sequence[A.Stats]) -> str:
    """The README's table: the largest error in float32 ulp, with the x where it was found from 3 ulp up."""
    return _report.worst_table(rows_, lambda s: (s.op, s.case, s.direction, s.max_ulp),
                       lambda s: f"{s.max_ulp:.3g}" + (f" (x = {s.worst_x:.4g})" if s.max_ulp >= 3 else "")
                       + ("" if s.passed else " FAILS"))


def command(args: Any, progress: Callable[[Iterable, int], Iterable] | None = None) -> int:
    """`multiact check --exhaustive [--isa A,B] [--journal FILE]`: one table per ISA (default: every ISA
    this machine runs), with the compiled reference's distance from reference.py first."""
    from ..backend import native_backend
    from . import sysinfo

    if args.backend and args.backend != [["native"]]:
        raise SystemExit("multiact check --exhaustive: the native backend only (--subset/--dense take others)")
    ok, why = native_backend.available()
    if not ok:
        raise SystemExit(f"multiact check --exhaustive: {why}")
    runs = native_backend.info()["isas"]
    isas = [i.strip() for i in args.isa.split(",")] if args.isa else runs
    bad = [i for i in isas if i not in runs]
    if bad:
        raise SystemExit(f"multiact check --exhaustive: ISA {', '.join(bad)} does not run here; this machine "
                         f"runs: {', '.join(runs)}")
    ops = A.selected_ops(args)
    dtypes = [d for g in (args.dtype or []) for d in g]
    if dtypes and dtypes != ["float16"] and dtypes != ["float32"]:
        raise SystemExit("multiact check --exhaustive: --dtype float32 (every 2^32 input) or float16 (every 65,536; "
                         "bfloat16's own exhaustive check is `multiact check --dtype bfloat16`)")
    if dtypes == ["float16"]:
        return _half(ops, isas, args)
    stride = args.stride or 1
    agree = crosscheck(ops)
    far = max(agree, key=lambda t: t[3])
    cpu = sysinfo.describe(sysinfo.identity())
    what = "every bit pattern" if stride == 1 else f"every {stride}th bit pattern"
    header = (f"CPU: {cpu}\nmultiact check --exhaustive ({what}; NaN patterns every 65536th): native, ISA "
              f"{', '.join(isas)}; bound {A.BOUND:g} ULP\nrule: {A.RULE}\nreference: numba float64 kernels, within "
              f"{far[3]:.2g} float32 ulp of reference.py on every 65536th pattern (largest: {far[0]} {far[1]} "
              f"{far[2]})")
    if far[3] > REF_AGREE:
        raise SystemExit(f"{header}\nmultiact check --exhaustive: the compiled reference is more than {REF_AGREE} "
                         "ulp from reference.py; not run")
    rows_ = run(ops, isas, stride=stride, workers=args.workers, journal=args.journal, progress=progress)
    parts = [header]
    for isa in isas:
        parts.append(f"\n## ISA {isa}\n" + A.render([s for s in rows_ if s.backend == f"native/{isa}"]))
    parts.append("\n## Largest error over every ISA, dy and input (float32 ulp)\n" + summary(rows_))
    print("\n".join(parts))
    if args.json:
        A.write_json(args.json, header, rows_)
    return 0 if all(s.passed for s in rows_) else 1


def _half(ops: Sequence[str] | None, isas: Sequence[str], args: Any) -> int:
    """--dtype float16: half_table over all 65,536 inputs, every ISA; the table and (--json) every row."""
    from . import half_table, sysinfo

    table = half_table.rows(ops, isas)
    header = (f"CPU: {sysinfo.describe(sysinfo.identity())}\nmultiact check --exhaustive --dtype float16 (all 65,536 "
              f"inputs): native, ISA {', '.join(isas)}; largest error in float16 ulps over every ISA, dy and input")
    print(header + "\n\n" + half_table.render(table))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"header": header, "rows": table}, f, indent=1)
            f.write("\n")
    return 0 if not any(r["special_miss"] or r["max_ulp"] > OPS[r["op"]].tol.ulp16 for r in table) else 1
