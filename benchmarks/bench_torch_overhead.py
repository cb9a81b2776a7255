"""What multiact costs beside PyTorch and NumPy on small arrays: the hot path's table (issue 41 item 2).

    python benchmarks/bench_torch_overhead.py                       # the table and the DCGAN step, this tree
    python benchmarks/bench_torch_overhead.py --before /tmp/wt-old  # the same, then an older checkout's, side by side
    python benchmarks/bench_torch_overhead.py --sizes 1K,64K --no-dcgan --before DIR --out FILE   # the issue's table

float32, one thread (torch and multiact), medians of interleaved rounds: every round times each variant of a
group once, in turn, so a change of load hits them alike; a ratio is the median of the rounds' ratios (its
spread, the interquartile range of those ratios, follows in brackets, then the ratio of the fastest samples,
the figure least touched by other processes on a shared machine).  Per op and size, against torch's own:
  ma(t)    multiact.<op>(t) on a CPU tensor / torch's function (the op's definition's, OpDef.torch:
           torch.nn.functional.<op>, torch.sigmoid, torch.tanh)
  ma(np)   multiact.<op>(x) on the same values as an ndarray / torch's function on the tensor
  mt       multiact.torch.<op>(t) / torch's function
  mt mod   multiact.torch.<Module>(...)(t) / torch.nn.<Module>(...)(t)
  ma bwd   multiact.<op>_grad(g, t) / torch's backward kernel as multiact's torch peer calls it
           (torch.ops.aten.<op>_backward: its OpOverloadPacket call costs microseconds of Python that torch's
           autograd does not pay); sigmoid and tanh from the output, as torch's: multiact.<op>_grad(g, y=y)
  mt f+b   y = f(x) on an x that requires grad, then y.backward(g) with a dense g, multiact.torch / torch
and, per size, `multiact.relu(x, out=o)` / `np.maximum(x, 0, out=o)` on ndarrays.  The issue's floors (1K:
ma <= 1, mt and mt mod <= 1.2, relu out= <= 1.1 NumPy; 64K: mt and mt mod <= 1.05) are checked on the
medians at the end.  --before runs the same measurements on another checkout (a `git worktree add DIR <commit>`,
with the native extensions copied in) in a subprocess with PYTHONPATH=DIR, after this tree's own run; each
run's ratios are against torch (and NumPy) measured in that run.  The DCGAN step: a small generator and
discriminator trained one step (D on real and fake, then G) with multiact.torch's activation modules against
torch.nn's, eager and torch.compile'd.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

SIZES = {"1K": 1 << 10, "64K": 1 << 16, "4M": 1 << 22}
# label: (op, parameters).  torch's function and backward kernel are multiact's torch peer's (multiact.cli.peers,
# from the op's definition, OpDef.torch), its module multiact.torch's name for it (module_name, PyTorch's spelling).
OPS = {
    "ReLU": ("relu", {}),
    "LeakyReLU(0.2)": ("leaky_relu", {"negative_slope": 0.2}),
    "GELU": ("gelu", {}),
    "GELU(tanh)": ("gelu", {"approximate": "tanh"}),
    "SiLU": ("silu", {}),
    "Sigmoid": ("sigmoid", {}),
    "Tanh": ("tanh", {}),
}
COLUMNS = (("ma_t", "ma(t)"), ("ma_np", "ma(np)"), ("mt", "mt"), ("mod", "mt mod"), ("bwd", "ma bwd"),
           ("fb", "mt f+b"))
FLOORS = {"1K": {"ma_t": 1.0, "ma_np": 1.0, "mt": 1.2, "mod": 1.2, "np_relu": 1.1},
          "64K": {"mt": 1.05, "mod": 1.05}}


def _timer(fn, budget: float) -> int:
    """Calls per sample so that one sample takes about `budget` seconds."""
    fn()
    t0 = time.perf_counter()
    fn()
    one = max(time.perf_counter() - t0, 1e-7)
    return max(1, int(budget / one))


def interleaved(variants: dict, rounds: int, budget: float) -> dict[str, list[float]]:
    """Seconds per call of each variant, one sample per round, the variants alternated within a round."""
    reps = {k: _timer(f, budget) for k, f in variants.items()}
    times: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(rounds):
        for k, f in variants.items():
            n = reps[k]
            t0 = time.perf_counter()
            for _ in range(n):
                f()
            times[k].append((time.perf_counter() - t0) / n)
    return times


def ratio(times: dict[str, list[float]], num: str, den: str) -> tuple[float, float, float]:
    """(median of the rounds' ratios num/den, its interquartile range, the ratio of the two fastest
    samples: what an unloaded machine would show, for a machine shared with other work)."""
    r = sorted(a / b for a, b in zip(times[num], times[den], strict=True))
    q = statistics.quantiles(r, n=4) if len(r) > 1 else [r[0]] * 3
    return statistics.median(r), q[2] - q[0], min(times[num]) / min(times[den])


def _groups(torch, ma, mt, spec: tuple, n: int) -> dict[str, dict]:
    """The variants of one op and size, by group; each group is timed interleaved, against its "torch"."""
    from multiact.cli import peers

    name, params = spec
    p = {**ma.ops()[name].defaults(), **params}
    mt_f, ma_f, ma_g = getattr(mt, name), getattr(ma, name), getattr(ma, f"{name}_grad")
    t_f = peers.torch_forward(name, p)
    module = mt.module_name(name)
    nn_mod, mt_mod = getattr(torch.nn, module)(**params), getattr(mt, module)(**params)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(n, generator=gen)
    xn = x.numpy().copy()
    xg = x.clone().requires_grad_()
    g = torch.randn(n, generator=gen)
    bound = peers.make("torch", name, "backward", p, (g, x), torch.empty_like(x), 1)
    by = bound.note == "backward from y"  # torch has the backward from the output only: multiact's y= form
    y = t_f(x)

    def fb(f):
        def run():
            f(xg, **params).backward(g)
            xg.grad = None
        return run

    return {
        "fwd": {"torch": lambda: t_f(x), "ma_t": lambda: ma_f(x, **params), "ma_np": lambda: ma_f(xn, **params),
                "mt": lambda: mt_f(x, **params)},
        "mod": {"torch": lambda: nn_mod(x), "mod": lambda: mt_mod(x)},
        "bwd": {"torch": bound.alloc,
                "bwd": (lambda: ma_g(g, y=y, **params)) if by else (lambda: ma_g(g, x, **params))},
        "fb": {"torch": fb(lambda v, **_: t_f(v)), "fb": fb(mt_f)},
    }


def _budget(n: int, rounds: int) -> tuple[float, int]:
    # short samples, many rounds: on a shared machine a short sample is less often cut by another process, and
    # the variants of one round see about the same load
    return (0.0005, rounds) if n <= 1 << 16 else (0.01, max(5, rounds // 5))


def op_table(rounds: int, sizes: list[str]) -> list[dict]:
    import torch

    import multiact as ma
    import multiact.torch as mt

    rows = []
    for label, spec in OPS.items():
        for size in sizes:
            n = SIZES[size]
            budget, r = _budget(n, rounds)
            row = {"op": label, "size": size}
            for gname, variants in _groups(torch, ma, mt, spec, n).items():
                times = interleaved(variants, r, budget)
                row[f"torch_{gname}_us"] = statistics.median(times["torch"]) * 1e6
                row.update((k, ratio(times, k, "torch")) for k in variants if k != "torch")
            rows.append(row)
            print(f"  {label:15s} {size:>4s} done", file=sys.stderr, flush=True)
    return rows


def _relu_out(np, ma, n: int) -> dict:
    x = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    o = np.empty_like(x)
    return {"np": lambda: np.maximum(x, 0, out=o), "ma": lambda: ma.relu(x, out=o)}


def numpy_relu(rounds: int, sizes: list[str]) -> list[dict]:
    """ma.relu(x, out=o) against np.maximum(x, 0, out=o), float32 ndarrays."""
    import numpy as np

    import multiact as ma

    rows = []
    for size in sizes:
        n = SIZES[size]
        times = interleaved(_relu_out(np, ma, n), *_budget(n, rounds)[::-1])
        rows.append({"size": size, "np_us": statistics.median(times["np"]) * 1e6, "np_relu": ratio(times, "ma", "np")})
    return rows


def dcgan(rounds: int, compiled: bool) -> dict:
    """One DCGAN training step (D on real and fake, then G), multiact.torch modules vs torch.nn's."""
    import torch
    from torch import nn

    import multiact.torch as mt

    nz, ngf, ndf, batch = 32, 16, 16, 16

    def models(lib):
        g = nn.Sequential(
            nn.ConvTranspose2d(nz, ngf * 4, 4, 1, 0, bias=False), nn.BatchNorm2d(ngf * 4), lib.ReLU(),
            nn.ConvTranspose2d(ngf * 4, ngf * 2, 4, 2, 1, bias=False), nn.BatchNorm2d(ngf * 2), lib.ReLU(),
            nn.ConvTranspose2d(ngf * 2, ngf, 4, 2, 1, bias=False), nn.BatchNorm2d(ngf), lib.ReLU(),
            nn.ConvTranspose2d(ngf, 3, 4, 2, 1, bias=False), lib.Tanh())
        d = nn.Sequential(
            nn.Conv2d(3, ndf, 4, 2, 1, bias=False), lib.LeakyReLU(0.2),
            nn.Conv2d(ndf, ndf * 2, 4, 2, 1, bias=False), nn.BatchNorm2d(ndf * 2), lib.LeakyReLU(0.2),
            nn.Conv2d(ndf * 2, ndf * 4, 4, 2, 1, bias=False), nn.BatchNorm2d(ndf * 4), lib.LeakyReLU(0.2),
            nn.Conv2d(ndf * 4, 1, 4, 1, 0, bias=False))
        return g, d

    torch.manual_seed(0)
    real = torch.randn(batch, 3, 32, 32)
    noise = torch.randn(batch, nz, 1, 1)
    loss = nn.BCEWithLogitsLoss()
    steps = {}
    for name, lib in (("nn", nn), ("mt", mt)):
        torch.manual_seed(1)
        g, d = models(lib)
        og, od = torch.optim.Adam(g.parameters(), 2e-4), torch.optim.Adam(d.parameters(), 2e-4)
        gf, df = (torch.compile(g, dynamic=False), torch.compile(d, dynamic=False)) if compiled else (g, d)

        def step(g=g, d=d, gf=gf, df=df, og=og, od=od):
            od.zero_grad(set_to_none=True)
            fake = gf(noise)
            ld = loss(df(real).flatten(), torch.ones(batch)) + loss(df(fake.detach()).flatten(), torch.zeros(batch))
            ld.backward()
            od.step()
            og.zero_grad(set_to_none=True)
            lg = loss(df(fake).flatten(), torch.ones(batch))
            lg.backward()
            og.step()

        for _ in range(3):  # compiles (and recompiles for the detached input) happen here
            step()
        steps[name] = step
    times = interleaved(steps, max(7, rounds // 3), 0.02)
    return {"nn_ms": statistics.median(times["nn"]) * 1e3, "mt_ms": statistics.median(times["mt"]) * 1e3,
            "ratio": ratio(times, "mt", "nn")}


def measure(args) -> dict:
    import torch

    import multiact as ma

    torch.set_num_threads(1)
    ma.set_num_threads(1)
    out = {"torch": torch.__version__, "load": os.getloadavg(), "rows": op_table(args.rounds, args.sizes),
           "numpy": numpy_relu(args.rounds, args.sizes)}
    if args.dcgan:
        out["dcgan_eager"] = dcgan(args.rounds, compiled=False)
        if args.compile:
            out["dcgan_compiled"] = dcgan(args.rounds, compiled=True)
    out["load_after"] = os.getloadavg()
    return out


def _cell(r: tuple) -> str:
    return f"{r[0]:5.2f}x [{r[1]:.2f}] {r[2]:5.2f}x"


def floors(run: dict) -> list[str]:
    """The issue's floors this run misses (on the medians), as text."""
    missed = []
    for row in run["rows"]:
        for key, most in FLOORS.get(row["size"], {}).items():
            if key in row and row[key][0] > most:
                missed.append(f"{row['op']} {row['size']} {dict(COLUMNS)[key]} {row[key][0]:.2f}x > {most}")
    for row in run.get("numpy", []):
        most = FLOORS.get(row["size"], {}).get("np_relu")
        if most is not None and row["np_relu"][0] > most:
            missed.append(f"relu out= {row['size']} / np.maximum {row['np_relu'][0]:.2f}x > {most}")
    return missed


def report(runs: dict[str, dict]) -> str:
    lines = ["float32, one thread; each cell: median of interleaved rounds' ratios [their IQR], then the ratio of "
             "the fastest samples; / torch's own (ma(np): multiact on an ndarray / torch on the tensor; ma bwd: / "
             "torch.ops.aten.<op>_backward)"]
    for name, run in runs.items():
        lines.append(f"{name}: torch {run['torch']}, load {run['load'][0]:.2f} before, "
                     f"{run['load_after'][0]:.2f} after")
    for name, run in runs.items():
        head = f"{name:8s} {'op':15s} {'size':>4s} {'torch':>8s} {'nn mod':>8s} {'bwd':>8s} {'f+b':>8s}"
        head += "".join(f" | {title:>20s}" for _, title in COLUMNS)
        lines += ["", head, "-" * len(head)]
        for row in run["rows"]:
            line = (f"{name:8s} {row['op']:15s} {row['size']:>4s} {row['torch_fwd_us']:6.1f}us "
                    f"{row['torch_mod_us']:6.1f}us {row['torch_bwd_us']:6.1f}us {row['torch_fb_us']:6.1f}us")
            line += "".join(f" | {_cell(row[key]):>20s}" for key, _ in COLUMNS)
            lines.append(line)
        for row in run.get("numpy", []):
            lines.append(f"{name:8s} relu(x, out=o) {row['size']:>4s}: np.maximum(x, 0, out=o) {row['np_us']:.2f}us, "
                         f"multiact.relu / np.maximum {_cell(row['np_relu'])}")
    lines.append("")
    for name, run in runs.items():
        missed = floors(run)
        lines.append(f"floors missed ({name}): " + ("none" if not missed else "; ".join(missed)))
    for key, what in (("dcgan_eager", "eager"), ("dcgan_compiled", "torch.compile'd")):
        for name, run in runs.items():
            if key in run:
                d = run[key]
                lines.append(f"DCGAN step ({what}, {name}): mt modules / nn modules {_cell(d['ratio'])} "
                             f"(nn {d['nn_ms']:.2f} ms, mt {d['mt_ms']:.2f} ms)")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=61, help="rounds up to 64K (4M: a fifth, at least 5)")
    ap.add_argument("--sizes", type=lambda s: s.split(","), default=list(SIZES))
    ap.add_argument("--no-dcgan", dest="dcgan", action="store_false")
    ap.add_argument("--no-compile", dest="compile", action="store_false")
    ap.add_argument("--before", metavar="DIR", help="an older checkout to measure the same way (PYTHONPATH=DIR)")
    ap.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # the --before subprocess's output
    ap.add_argument("--out", help="write the report here as well")
    args = ap.parse_args()
    mine = measure(args)
    if args.json:
        print(json.dumps(mine))
        return
    runs = {"after": mine} if args.before else {"this tree": mine}
    if args.before:
        cmd = [sys.executable, os.path.abspath(__file__), "--json", "--rounds", str(args.rounds),
               "--sizes", ",".join(args.sizes)] + ([] if args.dcgan else ["--no-dcgan"]) + \
              ([] if args.compile else ["--no-compile"])
        env = {**os.environ, "PYTHONPATH": args.before}
        old = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True, cwd=args.before)
        runs = {"before": json.loads(old.stdout.strip().splitlines()[-1]), "after": mine}
    text = report(runs)
    print(text)
    if args.out:
        info = subprocess.run([sys.executable, "-m", "multiact", "info"], capture_output=True, text=True).stdout
        cpu = "\n".join(line for line in info.splitlines() if line.startswith(("CPU", "multiact")))
        with open(args.out, "w") as f:
            when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
            f.write(f"$ python benchmarks/bench_torch_overhead.py {' '.join(sys.argv[1:])}\n# run {when}\n{cpu}\n\n"
                    f"{text}\n")


if __name__ == "__main__":
    main()
