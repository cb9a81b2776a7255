"""bias_act on a real GPU (issue 16): the cuda backend's two layouts and unfused torch, as bandwidth.

Shapes of n elements: the transformer's (n // 4096, 4096) with dim=-1, on the "rows" kernels the backend
picks there and forced onto the "strided" ones (what dim=-1 ran on before them: a warp's threads C elements
apart) for their ratio; and NCHW (n // 2^18, 64, 64, 64) with dim=1 (strided).  Forward `bias_act(x, b, act,
out=)` and backward `bias_act_grad(dy, x, b, act, out=(dx, db))` against a device-to-device copy's bandwidth
and torch's unfused `F.<act>(x + b)` and its autograd backward (db's sum included).  CUDA-event medians (one
process: each kernel compiles once).  Writes gpu-bench-bias_act.json and gpu-bench-bias_act.md to --out.

    python scripts/gpu_bench_bias_act.py --out DIR [--n 16777216] [--acts gelu,relu] [--dtypes float32,float16]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_bench import _time_ms  # noqa: E402

HIDDEN, NCHW_C, NCHW_HW = 4096, 64, 64 * 64


@contextlib.contextmanager
def _layout(cb, forced: str | None):
    """The cuda backend's bias_act layout choice, forced to `forced` ("strided" runs any layout) or left."""
    orig = cb._bias_layout
    if forced:
        cb._bias_layout = lambda *a: forced
    try:
        yield
    finally:
        cb._bias_layout = orig


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT") or "results")
    ap.add_argument("--n", type=int, default=1 << 24)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--acts", default="gelu,relu")
    ap.add_argument("--dtypes", default="float32,float16")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)

    import torch

    import multiact as ma
    from multiact import registry, vocab

    cb = registry.module("cuda")
    dev, F = torch.device("cuda"), torch.nn.functional
    env = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "n": args.n}
    rows, copy_bw, failures, t_start = [], {}, [], time.time()
    for dname in vocab.dtypes(args.dtypes.split(",")):  # any spelling multiact's commands take
        dtype = getattr(torch, dname)
        shapes = [("transformer", (max(1, args.n // HIDDEN), HIDDEN), -1),
                  ("NCHW", (max(1, args.n // (NCHW_C * NCHW_HW)), NCHW_C, 64, 64), 1)]
        for sname, shape, dim in shapes:
            x = (torch.randn(shape, device=dev) * 3).to(dtype)
            dy, out, dx = torch.randn(shape, device=dev).to(dtype), torch.empty_like(x), torch.empty_like(x)
            c = shape[dim]
            b, db = torch.randn(c, device=dev).to(dtype), torch.empty(c, device=dev, dtype=dtype)
            view = [1] * len(shape)
            view[dim] = c
            n, item = x.numel(), x.element_size()
            ms = _time_ms(torch, lambda out=out, x=x: out.copy_(x), args.reps)
            copy_bw[f"{dname} {sname}"] = copy = 2 * n * item / ms / 1e6
            for act in args.acts.split(","):
                tf = getattr(F, act)
                xr, br = x.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()
                theirs = {"forward": lambda tf=tf, x=x, b=b, v=view: tf(x + b.view(v)),
                          "backward": lambda tf=tf, xr=xr, br=br, v=view, dy=dy:
                          torch.autograd.grad(tf(xr + br.view(v)), (xr, br), dy)}
                tms, fwd_ms = {}, None
                for layout in (("rows", "strided") if dim == -1 else ("strided",)):
                    forced = "strided" if layout == "strided" and dim == -1 else None
                    ours = {"forward": lambda x=x, b=b, a=act, d=dim, o=out: ma.bias_act(x, b, a, dim=d, out=o),
                            "backward": lambda x=x, b=b, a=act, d=dim, dy=dy, dx=dx, db=db:
                            ma.bias_act_grad(dy, x, b, a, dim=d, out=(dx, db))}
                    for direction, arrays in (("forward", 2), ("backward", 3)):
                        row = {"dtype": dname, "shape": sname, "dims": list(shape), "dim": dim, "act": act,
                               "direction": direction, "layout": layout}
                        try:
                            with _layout(cb, forced):
                                row["ms"] = _time_ms(torch, ours[direction], args.reps)
                            row["GBps"] = arrays * n * item / row["ms"] / 1e6
                            row["pct_copy"] = 100 * row["GBps"] / copy
                            if direction not in tms:  # torch's unfused time, once per direction
                                tms[direction] = _time_ms(torch, theirs[direction], args.reps)
                            row["torch_ms"] = tms[direction]
                            if direction == "forward":
                                fwd_ms = row["ms"]
                                row["vs_torch"] = tms[direction] / row["ms"]
                            elif fwd_ms is not None:  # torch's autograd runs the forward too
                                row["vs_torch"] = tms[direction] / (fwd_ms + row["ms"])
                        except Exception as e:  # record and go on
                            row["error"] = f"{type(e).__name__}: {e}"
                            failures.append(f"{sname} {act} {direction} {layout} {dname}: "
                                            f"{traceback.format_exc(limit=3)}")
                        rows.append(row)
                        print(json.dumps(row), flush=True)
            x = dy = out = dx = None
            torch.cuda.empty_cache()
    for r in rows:  # rows against strided on the same dim=-1 case
        if r["layout"] == "rows" and "ms" in r:
            twin = next((s for s in rows if s["layout"] == "strided" and s["dim"] == -1 and "ms" in s and
                         all(s[k] == r[k] for k in ("dtype", "shape", "act", "direction"))), None)
            if twin:
                r["vs_strided"] = twin["ms"] / r["ms"]
    result = {"env": env, "copy_GBps": copy_bw, "rows": rows, "failures": failures,
              "wall_s": round(time.time() - t_start, 1)}
    with open(os.path.join(args.out, "gpu-bench-bias_act.json"), "w") as f:
        json.dump(result, f, indent=1)
    md = _markdown(result)
    with open(os.path.join(args.out, "gpu-bench-bias_act.md"), "w") as f:
        f.write(md)
    print(md)
    return 1 if failures else 0


def _markdown(r: dict) -> str:
    env = r["env"]
    lines = [f"### bias_act on {env['gpu']}: n = {env['n']}, torch {env['torch']}", "",
             "copy: " + ", ".join(f"{k} {v:.0f} GB/s" for k, v in r["copy_GBps"].items()), "",
             "GB/s counts x and out (forward), dy, x and dx (backward); vs torch: torch's unfused time / ours "
             "(forward: F.act(x + b) / bias_act; backward: F.act(x + b) and its autograd backward, db's sum "
             "included / bias_act + bias_act_grad); vs strided: the dim=-1 strided kernels' time / the rows "
             "kernels'.", "",
             "| dtype | shape | act | direction | layout | ms | GB/s | % copy | vs torch | vs strided |",
             "| --- | --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for row in r["rows"]:
        head = f"| {row['dtype']} | {row['shape']} {tuple(row['dims'])} dim={row['dim']} | {row['act']} | " \
               f"{row['direction']} | {row['layout']} |"
        if "error" in row:
            lines.append(f"{head} error: {row['error'][:80]} |||||")
            continue
        vs = f"{row['vs_strided']:.2f}" if "vs_strided" in row else ""
        vt = f"{row['vs_torch']:.2f}" if "vs_torch" in row else "n/a"
        lines.append(f"{head} {row['ms']:.3f} | {row['GBps']:.0f} | {row['pct_copy']:.0f} | {vt} | {vs} |")
    lines += ["", f"wall time {r['wall_s']} s; failures: {len(r['failures'])}", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
