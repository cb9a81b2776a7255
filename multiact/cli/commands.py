"""The `multiact` command: `info`, `check`, `bench` and `demo`.

    multiact info [--json]                    what this machine offers: CPU, SIMD, backends, versions
    multiact check [--backend B] [--op OP]    every backend against the float64 reference and each other
    multiact bench [--op relu,gelu] ...       backends and peers (PyTorch, ONNX Runtime, NumPy) side by side
    multiact demo                             a few ops on 1M floats with the best backend here
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import sys
import time
from collections.abc import Sequence
from typing import Any

from .. import vocab
from ._report import fmt, progress, table


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script and of `python -m multiact`; returns the exit status."""
    parser = _parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return args.func(args)
    except (ValueError, TypeError) as e:  # bad names or values on the command line
        print(f"multiact {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `multiact bench | head`: the reader left; not an error
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _csv(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def _many(values: list[list[str]] | None) -> list[str] | None:
    """`--op a,b --op c` -> [a, b, c]; None when not given."""
    return None if not values else [v for group in values for v in group]


def _dtype_names(values: list[list[str]] | None) -> list[list[str]] | None:
    """--dtype as every command reads it: each spelling (multiact.vocab: float32, f32, fp32...) as its dtype's
    name, each once; ValueError naming the valid dtypes for any other."""
    return None if not values else [vocab.dtypes(_many(values) or [])]


# What --dtype takes (every command the same), for the help.
_DTYPE_HELP = (", ".join(vocab.DTYPE_NAMES) + " (also "
               + ", ".join(s for d in vocab.DTYPES.values() for s in d.spellings[1:]) + ")")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="multiact", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", metavar="{info,check,bench,demo}")

    info = sub.add_parser("info", help="CPU, SIMD features, backends and why, library versions, threads")
    info.add_argument("--json", action="store_true", help="print JSON instead of text")
    info.set_defaults(func=cmd_info)

    check = sub.add_parser("check", help="run the consistency suite on this machine's backends")
    check.add_argument("--backend", action="append", type=_csv, metavar="B[,B]",
                       help="backends (default: all available)")
    check.add_argument("--op", action="append", type=_csv, metavar="OP[,OP]", help="ops (default: all)")
    check.add_argument("--dtype", action="append", type=_csv, metavar="D[,D]",
                       help=f"{_DTYPE_HELP}; bfloat16: every one of its 65,536 inputs for every op, case and "
                       "direction on the host backends that claim it (default: NumPy's own, "
                       f"{', '.join(vocab.NUMPY_DTYPES)})")
    check.add_argument("--json", metavar="FILE", help="write the full report as JSON to FILE ('-': stdout)")
    check.add_argument("--full", action="store_true", help="one table row per op, case, direction and dtype")
    check.add_argument("--no-progress", action="store_true", help="no progress bar")
    sweep = check.add_mutually_exclusive_group()
    sweep.add_argument("--exhaustive", action="store_true",
                       help="float32 accuracy of the native kernels over all 2^32 inputs, every ISA this machine "
                       "runs in one pass (about two hours on two Zen 3 cores for scalar and AVX2; --journal to resume)")
    sweep.add_argument("--dense", action="store_true", help="float32 sweep of the non-default parameters (2^24 points)")
    sweep.add_argument("--subset", action="store_true", help="float32 sweep of every 4096th input (the CI subset)")
    sweep.add_argument("--quant", action="store_true",
                       help="quantized outputs (quant=): every 65,536 bfloat16 and float16 input (float32: every "
                       "65,537th pattern) per op, backend, granularity and target against the float64 reference, "
                       "and bit for bit against ma.quantize of the float32 result")
    check.add_argument("--isa", help=f"with a sweep: the native ISA ({', '.join(vocab.ISAS)}; --exhaustive: a list)")
    check.add_argument("--serve", action="store_true",
                       help="with --subset/--dense --isa ISA: an ISA this machine cannot run, its kernels computed "
                       "by its C harness (neon: under qemu-aarch64 -cpu max; needs aarch64-linux-gnu-gcc, "
                       "qemu-user)")
    check.add_argument("--journal", metavar="FILE", help="with --exhaustive: append each finished job to FILE and "
                       "skip the jobs FILE already holds (resume a stopped run)")
    check.add_argument("--stride", type=int, help="with a sweep: every Nth bit pattern")
    check.add_argument("--workers", type=int, help="with a sweep: processes (default: the CPUs)")
    check.set_defaults(func=cmd_check)

    bench = sub.add_parser("bench", help="time backends and peers side by side")
    bench.add_argument("--op", action="append", type=_csv, metavar="OP[,OP]",
                       help="ops, optionally with parameters: gelu:approximate=tanh; the fused "
                       "bias_act:act=gelu[:dim=1|-1] against torch's unfused F.gelu(x + b.view(...)); the gated "
                       "swiglu, geglu, glu[:act=...], reglu along dim=-1 (default: common ops)")
    bench.add_argument("--framework", choices=("numpy", "torch"), default="numpy",
                       help="numpy: backends on NumPy arrays (default); torch: ma.<op>(tensor) and "
                       "multiact.torch.<op> on CPU tensors against torch's own functions, forward and "
                       "forward_backward (autograd)")
    bench.add_argument("--dtype", action="append", type=_csv, metavar="D[,D]",
                       help=f"{_DTYPE_HELP}; bfloat16 NumPy arrays come from ml_dtypes, torch's with --framework "
                       "torch (default float32)")
    bench.add_argument("--size", action="append", type=_csv, metavar="N[,N]", help="elements; K=1024, M=1024^2 "
                       "(default 1K,64K,1M,16M)")
    bench.add_argument("--threads", action="append", type=_csv, metavar="T[,T]",
                       help="thread counts (default: multiact.get_num_threads())")
    bench.add_argument("--direction", action="append", type=_csv, metavar="D[,D]",
                       help="forward, backward, backward_y (from the output y, as autograd saves it for "
                       "sigmoid, tanh, elu...), forward_backward (both; torch's through autograd) "
                       "(default forward,backward; with --framework torch forward,forward_backward)")
    bench.add_argument("--backend", action="append", type=_csv, metavar="B[,B]",
                       help="backends (default: every available one for NumPy arrays)")
    bench.add_argument("--peers", action="append", type=_csv, metavar="P[,P]",
                       help="torch, onnxruntime, numpy, or none (default: all three)")
    bench.add_argument("--out", action="store_true", help="also time calls into a preallocated out=")
    bench.add_argument("--samples", type=int, default=7, help="timed samples per implementation (default 7)")
    bench.add_argument("--resample", type=int, default=2, metavar="N",
                       help="time a configuration again, up to N times, while a row's IQR exceeds --max-spread "
                       "(default 2); rows still over it are flagged noisy")
    bench.add_argument("--max-spread", type=float, default=25.0, metavar="PCT",
                       help="the IQR, in percent of the median, above which a row is noisy (default 25)")
    bench.add_argument("--wide", action="store_true",
                       help="one row per case, one ns/element column per implementation (for a README)")
    bench.add_argument("--json", metavar="FILE", help="write every sample and the machine description as JSON")
    bench.add_argument("--plot", metavar="FILE.png",
                       help="plot time per call against size (log axes, with the copy line), one panel per op "
                       "and direction")
    bench.add_argument("--plot-gbps", action="store_true", help="plot GB/s instead of time per call")
    bench.add_argument("--load", metavar="FILE", help="show (and --plot) a run saved with --json instead of timing")
    bench.add_argument("--no-progress", action="store_true", help="no progress bar")
    bench.set_defaults(func=cmd_bench)

    demo = sub.add_parser("demo", help="a few ops forward and backward on 1M float32 values")
    demo.add_argument("--size", default="1M", help="elements (default 1M)")
    demo.set_defaults(func=cmd_demo)
    return p


# ---- info -----------------------------------------------------------------------

def cmd_info(args: argparse.Namespace) -> int:
    from . import sysinfo

    info = sysinfo.collect()
    print(json.dumps(info, indent=2) if args.json else sysinfo.render(info))
    return 0


# ---- check ----------------------------------------------------------------------

def cmd_check(args: argparse.Namespace) -> int:
    from . import selfcheck

    stream = sys.stderr if args.json == "-" else sys.stdout
    bar = None if args.no_progress else (lambda it, n: progress(it, n, "multiact check"))
    if args.serve and not (args.dense or args.subset):
        # a served ISA runs at emulation speed (NEON's gelu under qemu: about 1M points/s): sweeps only
        raise SystemExit("multiact check: --serve goes with --subset or --dense")
    args.dtype = _dtype_names(args.dtype)  # every spelling as its name, for the sweeps too
    if args.exhaustive:
        from . import exhaustive

        return exhaustive.command(args, progress=bar)
    if args.dense or args.subset:
        from . import accuracy

        return accuracy.command(args, progress=bar)
    if args.quant:
        from . import quant_check

        rep = quant_check.run(_many(args.backend), _many(args.op), _many(args.dtype), progress=bar)
        print(quant_check.render(rep, full=args.full), file=stream)
        if args.json:
            _write_json(args.json, rep)
        return 0 if rep["passed"] else 1
    dtypes = _many(args.dtype)
    code, data = 0, {}
    if dtypes and "bfloat16" in dtypes:
        bf = selfcheck.run_bf16(_many(args.backend), _many(args.op), progress=bar)
        print(render_bf16(bf, full=args.full), file=stream)
        code, data["bfloat16"] = (0 if bf["passed"] else 1), bf
        dtypes = [d for d in dtypes if d != "bfloat16"]
        if not dtypes:
            if args.json:
                _write_json(args.json, data["bfloat16"])
            return code
    report = selfcheck.run(_many(args.backend), _many(args.op), dtypes, progress=bar)
    print(render_check(report, full=args.full), file=stream)
    if args.json:
        _write_json(args.json, {**selfcheck.as_json(report), **data})
    return code or (0 if report["passed"] else 1)


def render_bf16(report: dict[str, Any], full: bool = False) -> str:
    """The exhaustive bfloat16 check: per backend and op, the cases run, the results one ulp from the correctly
    rounded reference (the worst case's share against the op's allowance), and failures in detail."""
    lines = [f"{name}: skipped ({why})" for name, why in report["skipped_backends"].items()]
    rows = report["rows"]
    if not report["backends"]:
        return "\n".join([*lines, "no host backend to check"])
    out: list[list[Any]] = []
    if full:
        for r in rows:
            share = 100 * r["one_ulp"] / r["n"] if r["n"] else None
            out.append([r["backend"], f"{r['op']}[{r['case']}]", r["direction"], r["n"] or "-", r["one_ulp"],
                        fmt(share, 2), fmt(100 * r["allowed"], 2), r["n_bad"], _status_text(r["status"])])
        head = ["backend", "op", "direction", "inputs", "1 ulp", "1 ulp %", "allowed %", "bad", "result"]
        lines.append(table(out, head, "llllrrrrl"))
    else:
        groups: dict[tuple[str, str], list] = {}
        for r in rows:
            groups.setdefault((r["backend"], r["op"]), []).append(r)
        for (backend, op), rs in groups.items():
            run = [r for r in rs if r["status"] != "unsupported"]
            worst = max((100 * r["one_ulp"] / r["n"] for r in run if r["n"]), default=None)
            bad = [r for r in rs if r["status"] in ("FAIL", "error")]
            status = f"FAIL ({len(bad)})" if bad else ("ok" if run else "unsupported")
            out.append([backend, op, f"{len(run)}/{len(rs)}", sum(r["n"] for r in run), sum(r["one_ulp"] for r in run),
                        fmt(worst, 2), fmt(100 * rs[0]["allowed"], 2), status])
        lines.append(table(out, ["backend", "op", "cases run", "results", "1 ulp", "worst case %", "allowed %",
                                 "result"], "lllrrrrl"))
        lines.append("1 ulp: finite results one bfloat16 ulp from the float64 reference rounded once (every other "
                     "result equal to it, NaN where it is NaN, the limits at +-inf exact); per case: --full.")
    failed = [r for r in rows if r["status"] in ("FAIL", "error")]
    if failed:
        lines += ["", f"{len(failed)} failure(s):"]
        for r in failed:
            lines.append(f"- {r['backend']} {r['op']}[{r['case']}] {r['direction']}: {r['error'] or ''}"
                         f"{r['n_bad']} bad, {r['one_ulp']} of {r['n']} one ulp off")
            lines += [f"    {b}" for b in r["bad"][:4]]
    n = {s: sum(r["status"] == s for r in rows) for s in ("pass", "FAIL", "error", "unsupported")}
    lines += ["", f"bfloat16 {'PASSED' if report['passed'] else 'FAILED'}: {n['pass']} passed, {n['FAIL']} failed, "
                  f"{n['error']} errors, {n['unsupported']} unsupported (registry falls through) on "
                  f"{', '.join(report['backends'])}"]
    return "\n".join(lines)


def _status_text(status: str) -> str:
    return {"pass": "ok"}.get(status, status)


def render_check(report: dict[str, Any], full: bool = False) -> str:
    """Summary table (worst ULP per dtype for each backend and op case), then every failure in detail."""
    rows = report["rows"]
    lines = []
    for name, why in report["skipped_backends"].items():
        lines.append(f"{name}: skipped ({why})")
    if not report["backends"]:
        lines.append("no backend to check")
        return "\n".join(lines)
    dtypes = sorted({r.dtype for r in rows}, key=lambda d: int(d[5:]))
    out: list[list[Any]] = []
    if full:
        for r in rows:
            vs = max(r.vs.values(), default=None)
            out.append([r.backend, f"{r.op}[{r.case}]", r.direction, r.dtype, _status(r), fmt(r.tol_used, 2),
                        fmt(r.max_ulp), fmt(r.max_abs), fmt(vs, 2), ",".join(r.bad_kinds)])
        lines.append(table(out, ["backend", "op", "direction", "dtype", "result", "err/tol", "max ulp", "max abs",
                                 "vs others (err/tol)", "bad values"], "lllllrrrrl"))
    else:
        groups: dict[tuple[str, str], list] = {}
        for r in rows:
            groups.setdefault((r.backend, f"{r.op}[{r.case}]"), []).append(r)
        for (backend, opcase), rs in groups.items():
            per_dt = []
            for dt in dtypes:
                got = [r.tol_used for r in rs if r.dtype == dt and r.tol_used is not None]
                per_dt.append(fmt(max(got), 2) if got else "-")
            vs = max((v for r in rs for v in r.vs.values()), default=None)
            n_fail, n_err = sum(r.status == "FAIL" for r in rs), sum(r.status == "error" for r in rs)
            status = " ".join([f"FAIL ({n_fail})"] * bool(n_fail) + [f"error ({n_err})"] * bool(n_err)) or "ok"
            if all(r.status == "unsupported" for r in rs):
                status = "unsupported"
            out.append([backend, opcase, *per_dt, fmt(vs, 2), status])
        lines.append(table(out, ["backend", "op", *(f"{d} err/tol" for d in dtypes), "vs others", "result"],
                           "ll" + "r" * len(dtypes) + "rl"))
        lines.append("err/tol: worst error over the op's tolerance (<= 1 passes) in any direction; vs others: the same "
                     "with another\nbackend's result on the same inputs as the reference. "
                     "ULP and absolute errors per row: --full or --json.")
    failed = [r for r in rows if r.failed]
    if failed:
        lines += ["", f"{len(failed)} failure(s):"]
        errors: dict[tuple[str, str], list] = {}
        for r in failed:
            if r.status == "error":  # one line per distinct error
                errors.setdefault((r.backend, r.error), []).append(r)
                continue
            lines.append(f"- {r.backend} {r.op}[{r.case}] {r.direction} {r.dtype}: {r.n_bad} bad values, "
                         f"{fmt(r.tol_used, 2)} x tolerance, max {fmt(r.max_ulp)} ulp / {fmt(r.max_abs)} abs; "
                         f"failing inputs: {', '.join(r.bad_kinds)}")
            for x, g, w in r.bad[:4]:
                lines.append(f"    x={x!r}: got {g!r}, want {w!r}")
        for (backend, err), rs in errors.items():
            where = ", ".join(f"{r.op}[{r.case}] {r.direction} {r.dtype}" for r in rs[:3])
            more = f" and {len(rs) - 3} more" if len(rs) > 3 else ""
            lines.append(f"- {backend}: error in {where}{more}: {err}")
    n = {s: sum(r.status == s for r in rows) for s in ("pass", "FAIL", "error", "unsupported")}
    lines += ["", f"{'PASSED' if report['passed'] else 'FAILED'}: {n['pass']} passed, {n['FAIL']} failed, "
                  f"{n['error']} errors, {n['unsupported']} unsupported (registry falls through) "
                  f"on {', '.join(report['backends'])}"]
    return "\n".join(lines)


def _status(r: Any) -> str:
    return {"pass": "ok"}.get(r.status, r.status)


def _write_json(dest: str, data: Any) -> None:
    text = json.dumps(data, indent=1, default=str)
    if dest == "-":
        print(text)
    else:
        with open(dest, "w", encoding="utf-8") as f:
            f.write(text + "\n")


# ---- bench ----------------------------------------------------------------------

def cmd_bench(args: argparse.Namespace) -> int:
    from . import bench, peers, sysinfo

    if args.load and args.plot and importlib.util.find_spec("matplotlib") is None:
        raise ValueError("--plot needs matplotlib: pip install 'multiact[bench]'")
    metric = "gbps" if args.plot_gbps else "time"
    if args.load:
        with open(args.load, encoding="utf-8") as f:
            saved = json.load(f)
        res = {**saved, "rows": [bench.Row.from_dict(r) for r in saved["rows"]]}
        meta = saved.get("meta", {})
        bench.relink(res["rows"], meta.get("max_spread", bench.MAX_SPREAD))  # an older file: ranges and flags
        saved_cpu = meta.get("cpu", {})
        print(bench.header(saved_cpu))  # the CPU the run was measured on, not this one
        said = meta.get("warnings")
        if said is None:  # saved before warnings were: the load it recorded says it
            said = [w for w in [bench.load_warning(saved_cpu, meta.get("load_before"))] if w]
        for w in said:
            print(f"# {w}")
        print(render_bench_wide(res) if args.wide else render_bench(res, meta.get("max_spread"), meta.get("resample")))
        print(f"\nsaved {meta.get('date', '?')} on {sysinfo.summary(saved_cpu)}, "
              f"load average before {meta.get('load_before')}")
        if args.plot:
            load = meta.get("load_before")
            bench.plot(res["rows"], args.plot, note=f", load {load[0]:.1f}" if load else "", cpu=saved_cpu,
                       metric=metric)
            print(f"plot written to {args.plot}")
        return 0
    torch_mode = args.framework == "torch"
    ops = [op for o in (_many(args.op) or bench.DEFAULT_OPS) for op in bench.parse_ops(o)]
    sizes = [bench.parse_size(s) for s in _many(args.size) or []] or list(bench.DEFAULT_SIZES)
    threads = [int(t) for t in _many(args.threads) or []] or None
    if threads and min(threads) < 1:
        raise ValueError("--threads must be positive")
    if args.resample < 0:
        raise ValueError(f"--resample must be 0 or more, got {args.resample}")
    if not 0 < args.max_spread:
        raise ValueError(f"--max-spread must be a positive percentage, got {args.max_spread}")
    dtypes = _many(_dtype_names(args.dtype)) or ["float32"]
    directions = _many(args.direction) or (["forward", "forward_backward"] if torch_mode else ["forward", "backward"])
    modes = ("alloc", "out") if args.out else ("alloc",)
    peer_names = _many(args.peers)
    if torch_mode:
        from . import tensor_bench

        tensor_bench.check(directions, dtypes, modes)
        if peer_names is not None and [p for p in peer_names if p != "torch"]:
            raise ValueError(f"--framework torch compares with torch only, got --peers {','.join(peer_names)}")
        if args.backend:
            raise ValueError("--framework torch times multiact's tensor entry points (their own backend choice); "
                             "--backend is for --framework numpy")
        peer_names = ["torch"]
        if not peers.available("torch")[0]:
            raise ValueError(f"--framework torch needs torch: {peers.available('torch')[1]}")
    else:
        for dt in dtypes:
            if vocab.DTYPES[dt].needs:
                from .. import dtypes as _dtypes

                _dtypes.bfloat16  # noqa: B018 - imports ml_dtypes (np.dtype("bfloat16") needs it), or says how
        for d in directions:
            if d not in bench.DIRECTIONS:
                raise ValueError(f"unknown direction {d!r}; valid: {', '.join(bench.DIRECTIONS)}")
        peer_names = list(peers.PEERS) if peer_names is None else [p for p in peer_names if p != "none"]
        for p in peer_names:
            peers.available(p)  # unknown names raise
    if args.plot and importlib.util.find_spec("matplotlib") is None:  # say so before the run, not after
        raise ValueError("--plot needs matplotlib: pip install 'multiact[bench]'")
    bar = None if args.no_progress else (lambda it, n: progress(it, n, "multiact bench"))
    before = sysinfo.cpu()
    load_before = before.get("load_average")
    w = bench.load_warning(before)
    if w:  # now, not after minutes of timing
        print(f"multiact bench: {w} (before the run)", file=sys.stderr, flush=True)
    spread = args.max_spread / 100
    t0 = time.perf_counter()
    if torch_mode:
        res = tensor_bench.run(ops, dtypes, sizes, threads, directions, samples=args.samples, progress=bar,
                               resample=args.resample, max_spread=spread)
    else:
        res = bench.run(ops, dtypes, sizes, threads, directions, _many(args.backend), peer_names, modes,
                        samples=args.samples, progress=bar, resample=args.resample, max_spread=spread)
    wall = time.perf_counter() - t0
    machine = sysinfo.cpu()
    warnings = [w for w in [bench.load_warning(machine, load_before)] if w]
    if warnings:
        print(f"multiact bench: {warnings[0]}", file=sys.stderr, flush=True)
    print(bench.header(machine))
    for w in warnings:
        print(f"# {w}")
    print(render_bench_wide(res) if args.wide else render_bench(res, spread, args.resample))
    print(f"\n{len(res['rows'])} timings in {wall:.0f} s; load average before {load_before}, "
          f"after {machine.get('load_average')}")
    if args.json:
        meta = {"cpu": machine, "libraries": sysinfo.library_versions(), "argv": sys.argv[1:],
                "date": time.strftime("%Y-%m-%d %H:%M:%S %z"), "wall_s": wall, "load_before": load_before,
                "load_after": machine.get("load_average"), "warnings": warnings, "framework": args.framework,
                "max_spread": spread, "resample": args.resample}
        _write_json(args.json, {"meta": meta, "rows": [r.as_dict() for r in res["rows"]],
                                "skipped": res["skipped"], "skipped_backends": res["skipped_backends"],
                                "missing_peers": res["missing_peers"]})
    if args.plot:
        bench.plot(res["rows"], args.plot, note=f", load {load_before[0]:.1f}" if load_before else "", cpu=machine,
                   metric=metric)
        print(f"plot written to {args.plot}")
    return 0


def _outward(v: float, up: bool, digits: int = 2) -> str:
    """v in `digits` significant digits rounded away from the range's inside (down for its low end, up for its
    high end), so that a printed range holds the printed ratio: 0.1005..0.1014 is [0.1, 0.11], not [0.1, 0.1]."""
    if v == 0 or v != v or v in (float("inf"), float("-inf")):
        return fmt(v, digits)
    q = 10.0 ** (math.floor(math.log10(abs(v))) - (digits - 1))
    n = v / q
    if abs(n - round(n)) <= 1e-9 * abs(n):  # already at this precision (0.3 / 0.01 is 29.999999999999996)
        n = round(n)
    return fmt((math.ceil(n) if up else math.floor(n)) * q, digits)


def _ratio(v: float | None, rng: tuple[float, float] | None, unit: str = "") -> str:
    """A ratio with the range its quartiles allow: '7.12x [6.5, 7.9]'; '' when there is none."""
    if v is None:
        return ""
    return f"{fmt(v, 3)}{unit}" + ("" if rng is None else f" [{_outward(rng[0], False)}, {_outward(rng[1], True)}]")


def _flag_lines(rows: Sequence[Any], max_spread: float | None, resample: int | None) -> list[str]:
    """What the flags mean, and each row's reason where it says more than the row does."""
    from .bench import BELOW_COPY, SHORT_DIRECTION, display_name, size_label

    lines = []
    noisy = [r for r in rows if "noisy" in r.flags]
    if noisy:
        limit = "" if max_spread is None else f" over {max_spread:.0%}"
        again = "" if not resample else f", after timing the configuration again up to {resample} times"
        lines.append(f"noisy: {len(noisy)} row(s) with an IQR{limit} of the median{again}: read their figures "
                     "(and ratios with them) as rough; rerun on an idle machine")
    below = [r for r in rows if BELOW_COPY in r.flags]
    if below:
        lines.append(f"{BELOW_COPY}: faster than the copy of the same bytes, which no elementwise pass from memory "
                     "can beat; why, per row:")
        reasons: dict[str, list[str]] = {}
        for r in below:
            reasons.setdefault(r.flags[BELOW_COPY], []).append(
                f"{r.op} {SHORT_DIRECTION[r.direction]} {r.dtype} {size_label(r.size)} {display_name(r)}")
        for why, where in reasons.items():
            more = f" and {len(where) - 3} more" if len(where) > 3 else ""
            lines.append(f"  {', '.join(where[:3])}{more}: {why}")
    return lines


def render_bench(res: dict[str, Any], max_spread: float | None = None, resample: int | None = None) -> str:
    """The results table (every ratio with the range its quartiles allow, flags), what was not timed and why."""
    from .bench import ENTRY_LABELS, SHORT_DIRECTION, display_name, size_label

    lines = []
    for p, why in res["missing_peers"].items():
        lines.append(f"peer {p}: missing, {why}")
    for b, why in res["skipped_backends"].items():
        lines.append(f"backend {b}: skipped, {why}")
    seen = set()
    for s in res["skipped"]:
        key = (s["impl"], s["why"])
        if key not in seen:
            seen.add(key)
            lines.append(f"{s['impl']}: {s['why']}")
    out = []
    for r in res["rows"]:
        impl = display_name(r) + (" *" if r.note else "")
        direction = SHORT_DIRECTION[r.direction]
        out.append([r.op, direction, r.dtype, size_label(r.size), r.threads, r.mode, impl,
                    fmt(r.median_s * 1e6), fmt(r.ns_per_element), fmt(r.gb_per_s),
                    _ratio(r.vs_copy, r.vs_copy_range) if r.kind != "baseline" else "1",
                    f"{r.spread * 100:.0f}%", _ratio(r.speedup, r.speedup_range, "x"), ", ".join(r.flags)])
    if lines:
        lines.append("")
    lines.append(table(out, ["op", "dir", "dtype", "size", "thr", "mode", "impl", "us/call", "ns/elem", "GB/s",
                             "x copy [range]", "IQR", "vs best peer [range]", "flags"], "llllrllrrrrrrl"))
    notes = sorted({f"{display_name(r)} *: {r.note}" for r in res["rows"] if r.note})
    if any(r.impl in ENTRY_LABELS for r in res["rows"]):
        lines.append("ma.f(t): ma.<op>(tensor) (fwd+bwd: ma.<op> then ma.<op>_grad); mt.f(t): multiact.torch.<op>"
                     "(tensor), through autograd for fwd+bwd; torch: torch's own function.")
    lines.append("ma:B = multiact backend B; copy = a copy of the same bytes (np.copyto; Tensor.copy_ with --framework "
                 "torch), the bandwidth limit;\nx copy: time over the copy's; IQR: interquartile range over the median;"
                 " vs best peer: the fastest peer's time over multiact's\n(same mode; above 1: multiact faster); "
                 "[range]: the ratio the quartiles allow (low: q1 over the other's q3, high: q3 over q1).")
    lines += notes
    lines += _flag_lines(res["rows"], max_spread, resample)
    return "\n".join(lines)


def render_bench_wide(res: dict[str, Any]) -> str:
    """ns/element per implementation side by side, one row per (op, direction, dtype, size, threads, mode)."""
    from .bench import SHORT_DIRECTION, display_name, size_label

    rows = res["rows"]
    impls = list(dict.fromkeys(display_name(r) for r in rows if r.kind != "baseline"))
    copies = {(r.op, r.direction, r.dtype, r.size, r.threads): r for r in rows if r.kind == "baseline"}
    cases: dict[tuple, dict[str, Any]] = {}
    for r in rows:
        if r.kind != "baseline":
            cases.setdefault((r.op, r.direction, r.dtype, r.size, r.threads, r.mode), {})[display_name(r)] = r
    out = []
    for (op, direction, dtype, size, threads, mode), d in cases.items():
        backs = [r for r in d.values() if r.kind == "backend"]
        peers_ = [r for r in d.values() if r.kind == "peer"]
        ratio = ""
        if backs and peers_:
            bp, bb = min(peers_, key=lambda r: r.median_s), min(backs, key=lambda r: r.median_s)
            ratio = _ratio(bp.median_s / bb.median_s, (bp.q1_s / bb.q3_s, bp.q3_s / bb.q1_s), "x")
        copy = copies.get((op, direction, dtype, size, threads))
        flags = sorted({_SHORT_FLAG.get(f, f) for r in d.values() for f in r.flags})
        out.append([op, SHORT_DIRECTION[direction], dtype, size_label(size), threads, mode,
                    *(fmt(d[i].ns_per_element) if i in d else "-" for i in impls),
                    fmt(copy.ns_per_element) if copy else "-", ratio, ",".join(flags)])
    head = ["op", "dir", "dtype", "size", "thr", "mode", *impls, "copy", "best ma vs best peer [range]", "flags"]
    notes = {}  # e.g. torch's sigmoid backward starts from y: say so under the table
    for r in rows:
        if r.note:
            notes.setdefault((display_name(r), r.note), []).append(r.op)
    said = "".join(f"\n{impl} {note}: {', '.join(dict.fromkeys(ops))}" for (impl, note), ops in notes.items())
    legend = ""
    if any(r.flags for r in rows):
        legend = "\nflags: noisy = a row's IQR over the limit after re-sampling; <copy = a row below the copy " \
                 "(streaming stores / cache)"
    return (table(out, head, "llllrl" + "r" * (len(impls) + 2) + "l")
            + "\nns per element, median of interleaved samples (lower is better); copy: a copy of the same bytes "
              "(np.copyto; Tensor.copy_ with --framework torch);\nratio: the best peer's time over the best multiact "
              "backend's (above 1: multiact faster); [range]: the ratio the quartiles allow."
            + legend + said)


_SHORT_FLAG = {"below copy (streaming stores / cache)": "<copy"}


# ---- demo -----------------------------------------------------------------------

DEMO_OPS = ("relu", "gelu", "silu", "sigmoid", "tanh")


def cmd_demo(args: argparse.Namespace) -> int:
    import numpy as np

    import multiact as ma

    from .. import consistency as C
    from .. import registry
    from ..optable import OPS
    from .bench import parse_size

    n = parse_size(args.size)
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(n, dtype=np.float32) * 3).astype(np.float32)
    dy = rng.standard_normal(n, dtype=np.float32)
    print(f"multiact {ma.__version__}: {len(OPS)} ops; backends here: "
          + ", ".join(b.name for b in ma.backends() if b.available))
    print(f"{n:,} float32 values in N(0, 9), threads={ma.get_num_threads()}; error against the float64 reference; "
          "best of 3 times\n")
    rows = []
    for op in DEMO_OPS:
        spec = OPS[op]
        for direction in ("forward", "backward"):
            mod, _ = registry.select(op, direction, "float32", "numpy")
            fwd, bwd = getattr(ma, op), getattr(ma, f"{op}_grad")
            call = (lambda f=fwd: f(x)) if direction == "forward" else (lambda g=bwd: g(dy, x))
            got = call()
            best = min(_timed(call) for _ in range(3))
            with np.errstate(all="ignore"):
                if direction == "forward":
                    v = C.compare(got, C.reference(spec, direction, {}, np.float32, x), x, spec, direction)
                else:
                    ref = C.reference(spec, direction, {}, np.float32, dy, x)
                    v = C.compare(got, ref, x, spec, direction, scale=dy)
            streams = 2 if direction == "forward" else 3
            rows.append([op, direction, mod.NAME, fmt(v.max_abs, 2), "ok" if v.passed else "FAIL",
                         f"{best * 1e3:.2f}", fmt(best / n * 1e9, 2), fmt(streams * 4 * n / best / 1e9, 2)])
    print(table(rows, ["op", "direction", "backend", "max abs error", "within tolerance", "ms", "ns/elem", "GB/s"],
                "lllrlrrr"))
    print("\nmultiact info: what this machine offers; multiact check: every backend held to the reference; "
          "multiact bench: against PyTorch, ONNX Runtime and NumPy")
    return 0 if all(r[4] == "ok" for r in rows) else 1


def _timed(f: Any) -> float:
    t0 = time.perf_counter()
    f()
    return time.perf_counter() - t0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
