"""What multiact costs inside PyTorch: `mt.<op>` and `ma.<op>` on CPU tensors against torch's own function.

    python benchmarks/bench_torch_overhead.py                       # the table and the DCGAN step, this tree
    python benchmarks/bench_torch_overhead.py --before /tmp/wt-old  # the same, then an older checkout's, side by side

One thread (torch and multiact), medians of interleaved rounds: every round times each variant once, in
turn, so a change of load hits them alike; the ratio is the median of the rounds' ratios (its spread, the
interquartile range of those ratios, follows in brackets, then the ratio of the fastest samples, the figure
least touched by other processes on a shared machine).  Forward: f(x).  Forward+backward: y = f(x) on an x
that requires grad, then y.backward(g) with a dense g (what a layer above hands back).  --before runs the same
measurements on another checkout (a `git worktree add DIR <commit>`, with the native extension copied in) in
a subprocess with PYTHONPATH=DIR, after this tree's own run; each run's ratios are against torch measured in
that run.  The DCGAN step: a small generator and discriminator trained one step (D on real and fake, then G)
with multiact.torch's activation modules against torch.nn's, eager and torch.compile'd.
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
OPS = {  # label: (multiact.torch function, multiact function, torch's own, the parameters)
    "LeakyReLU(0.2)": ("leaky_relu", {"negative_slope": 0.2}, "leaky_relu"),
    "GELU(tanh)": ("gelu", {"approximate": "tanh"}, "gelu"),
    "SiLU": ("silu", {}, "silu"),
    "GELU": ("gelu", {}, "gelu"),
}


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


def _variants(x, xg, g, params, mt_f, ma_f, t_f) -> tuple[dict, dict]:
    """(forward variants, forward+backward variants) of one op and size."""
    def fb(f):
        def run():
            f(xg, **params).backward(g)
            xg.grad = None
        return run

    fwd = {"torch": lambda: t_f(x, **params), "mt": lambda: mt_f(x, **params), "ma": lambda: ma_f(x, **params)}
    return fwd, {"torch": fb(t_f), "mt": fb(mt_f)}


def op_table(rounds: int, sizes: list[str]) -> list[dict]:
    import torch
    import torch.nn.functional as F

    import multiact as ma
    import multiact.torch as mt

    rows = []
    for label, (name, params, tname) in OPS.items():
        mt_f, ma_f, t_f = getattr(mt, name), getattr(ma, name), getattr(F, tname)
        for size in sizes:
            n = SIZES[size]
            gen = torch.Generator().manual_seed(0)
            x = torch.randn(n, generator=gen)
            xg = x.clone().requires_grad_()
            g = torch.randn(n, generator=gen)
            # short samples, many rounds: on a shared machine a short sample is less often cut by another
            # process, and the variants of one round see about the same load
            budget, r = (0.0005, rounds) if n <= 1 << 16 else (0.01, max(5, rounds // 5))

            fwd, both = _variants(x, xg, g, params, mt_f, ma_f, t_f)
            fwd = interleaved(fwd, r, budget)
            both = interleaved(both, r, budget)
            rows.append({
                "op": label, "size": size,
                "torch_fwd_us": statistics.median(fwd["torch"]) * 1e6,
                "mt_fwd": ratio(fwd, "mt", "torch"), "ma_fwd": ratio(fwd, "ma", "torch"),
                "torch_fb_us": statistics.median(both["torch"]) * 1e6, "mt_fb": ratio(both, "mt", "torch"),
            })
            print(f"  {label:15s} {size:>4s} done", file=sys.stderr, flush=True)
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
    out = {"torch": torch.__version__, "load": os.getloadavg(), "rows": op_table(args.rounds, args.sizes)}
    if args.dcgan:
        out["dcgan_eager"] = dcgan(args.rounds, compiled=False)
        if args.compile:
            out["dcgan_compiled"] = dcgan(args.rounds, compiled=True)
    out["load_after"] = os.getloadavg()
    return out


def _cell(r: tuple) -> str:
    return f"{r[0]:5.2f}x [{r[1]:.2f}] {r[2]:5.2f}x"


def report(runs: dict[str, dict]) -> str:
    names = list(runs)
    lines = ["mt = multiact.torch.<op>(t), ma = multiact.<op>(t), each / torch.nn.functional's own, one thread; "
             "median of interleaved rounds' ratios [their IQR], then the ratio of the fastest samples"]
    for name, run in runs.items():
        lines.append(f"{name}: torch {run['torch']}, load {run['load'][0]:.2f} before, "
                     f"{run['load_after'][0]:.2f} after")
    head = f"{'op':15s} {'size':>4s} {'torch fwd':>10s} {'torch f+b':>10s}"
    for name in names:
        head += f" | {name + ' mt fwd':>22s} {name + ' ma fwd':>22s} {name + ' mt f+b':>22s}"
    lines += ["", head, "-" * len(head)]
    first = runs[names[0]]["rows"]
    for i, row in enumerate(first):
        line = f"{row['op']:15s} {row['size']:>4s} {row['torch_fwd_us']:8.1f}us {row['torch_fb_us']:8.1f}us"
        for name in names:
            r = runs[name]["rows"][i]
            line += f" | {_cell(r['mt_fwd']):>22s} {_cell(r['ma_fwd']):>22s} {_cell(r['mt_fb']):>22s}"
        lines.append(line)
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
            f.write(f"$ python benchmarks/bench_torch_overhead.py {' '.join(sys.argv[1:])}\n{cpu}\n\n{text}\n")


if __name__ == "__main__":
    main()
