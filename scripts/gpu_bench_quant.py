"""quant= on a real GPU (issue 46 item 1): the cuda backend's quantizing kernels against a device copy and the
unfused torch composition, as bandwidth.

The transformer's (n // 4096, 4096) activations (swiglu: (n // 4096, 8192) in, (n // 4096, 4096) out) in
bfloat16 and float16 (--dtypes float32 too), silu and swiglu (--ops: any op of the table; the gated kernels take
no bfloat16: swiglu skips it); float8_e4m3fn per token, per group of 128, MX (E8M0, ceil
rule) and per tensor (dynamic: the amax kernel and the apply pass), int8 per token.  `ma.<op>(x, quant=Q)`
against torch's unfused composition (the activation in float32, amax, the scale, the division, clamp and the cast:
`(F.silu(x.float()) / s).clamp(-448, 448).to(torch.float8_e4m3fn)`, and its kin) and against a device-to-device
copy of x's bytes.  GB/s counts x read and the codes and scales written.  CUDA-event medians, one process (each
kernel compiles once); before timing, each case's codes and scales are compared with `ma.quantize` of the
backend's float32 result (copied to the host) and the mismatches counted.  Writes gpu-bench-quant.json and
gpu-bench-quant.md to --out.

    python scripts/gpu_bench_quant.py --out DIR [--n 16777216] [--ops silu,swiglu] [--dtypes bfloat16,float16]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_bench import _time_ms  # noqa: E402

from multiact.cli.quant_bench import torch_composition  # noqa: E402

HIDDEN = 4096
QUANTS = {"e4m3 token": ("float8_e4m3fn", "token", None), "e4m3 group128": ("float8_e4m3fn", "group", 128),
          "e4m3 mx": ("float8_e4m3fn", "mx", None), "e4m3 tensor": ("float8_e4m3fn", "tensor", None),
          "int8 token": ("int8", "token", None)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT") or "results")
    ap.add_argument("--n", type=int, default=1 << 24)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--ops", default="silu,swiglu")
    ap.add_argument("--dtypes", default="bfloat16,float16")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)

    import torch

    import multiact as ma
    from multiact import registry, vocab

    cb = registry.module("cuda")

    dev, F = torch.device("cuda"), torch.nn.functional
    env = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "n": args.n}
    rows, copy_bw, failures, t_start = [], {}, [], time.time()
    t = max(1, args.n // HIDDEN)
    for dname in vocab.dtypes(args.dtypes.split(",")):
        dtype = getattr(torch, dname)
        for op in args.ops.split(","):
            gated = op == "swiglu"
            if gated and not cb.supports("gated:silu", "forward", dname):  # the gated kernels take no bfloat16
                print(f"swiglu {dname}: not a cuda kernel (skipped)", flush=True)
                continue
            x = (torch.randn((t, 2 * HIDDEN if gated else HIDDEN), device=dev) * 3).to(dtype)
            out = torch.empty_like(x)
            n, item = x.numel(), x.element_size()
            ms = _time_ms(torch, lambda out=out, x=x: out.copy_(x), args.reps)
            copy_bw[f"{dname} {op}"] = copy = 2 * n * item / ms / 1e6
            if gated:
                fwd = lambda x=x: F.silu(x[:, :HIDDEN].float()) * x[:, HIDDEN:].float()  # noqa: E731
            else:
                tf = getattr(F, op)
                fwd = lambda x=x, tf=tf: tf(x.float())  # noqa: E731
            for qname, (target, gran, block) in QUANTS.items():
                q = ma.Quant(target, gran, group_size=block if gran == "group" else None)
                row = {"dtype": dname, "op": op, "quant": qname, "shape": list(x.shape)}
                mf = ma.swiglu if gated else getattr(ma, op)
                call = lambda x=x, q=q, mf=mf: mf(x, quant=q)  # noqa: E731
                try:
                    codes, scales = call()
                    y32 = (ma.swiglu(x.float()) if gated else getattr(ma, op)(x.float())).cpu().numpy()
                    wc, ws = ma.quantize(y32, q)
                    gc = codes.view(torch.uint8).cpu().numpy() if target != "int8" else codes.cpu().numpy()
                    gs = scales.view(torch.uint8).cpu().numpy() if gran == "mx" else scales.cpu().numpy()
                    row["code_mismatches"] = int(np.count_nonzero(gc.view(np.uint8) != wc.view(np.uint8)))
                    row["scale_mismatches"] = int(np.count_nonzero(
                        np.asarray(gs).reshape(-1).view(np.uint8) != np.asarray(ws).reshape(-1).view(np.uint8)))
                    row["ms"] = _time_ms(torch, call, args.reps)
                    written = codes.numel() + scales.numel() * scales.element_size()
                    row["GBps"] = (n * item + written) / row["ms"] / 1e6
                    row["pct_copy"] = 100 * row["GBps"] / copy
                    row["torch_ms"] = _time_ms(torch, lambda fwd=fwd, q=q: torch_composition(torch, fwd(), q),
                                               args.reps)
                    row["vs_torch"] = row["torch_ms"] / row["ms"]
                except Exception as e:  # record and go on
                    row["error"] = f"{type(e).__name__}: {e}"
                    failures.append(f"{op} {qname} {dname}: {traceback.format_exc(limit=3)}")
                rows.append(row)
                print(json.dumps(row), flush=True)
            x = out = None
            torch.cuda.empty_cache()
    result = {"env": env, "copy_GBps": copy_bw, "rows": rows, "failures": failures,
              "wall_s": round(time.time() - t_start, 1)}
    with open(os.path.join(args.out, "gpu-bench-quant.json"), "w") as f:
        json.dump(result, f, indent=1)
    md = _markdown(result)
    with open(os.path.join(args.out, "gpu-bench-quant.md"), "w") as f:
        f.write(md)
    print(md)
    bad = failures or any(r.get("code_mismatches") or r.get("scale_mismatches") for r in rows)
    return 1 if bad else 0


def _markdown(r: dict) -> str:
    env = r["env"]
    lines = [f"### quant= on {env['gpu']}: n = {env['n']}, torch {env['torch']}", "",
             "copy: " + ", ".join(f"{k} {v:.0f} GB/s" for k, v in r["copy_GBps"].items()), "",
             "GB/s counts x read and the codes and scales written; % copy: of a device copy's GB/s (x read and "
             "written); vs torch: the unfused torch composition's time / ours; mismatches: codes and scales "
             "against ma.quantize of the backend's float32 result.", "",
             "| dtype | op | quant | ms | GB/s | % copy | vs torch | mismatches (codes, scales) |",
             "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for row in r["rows"]:
        head = f"| {row['dtype']} | {row['op']} {tuple(row['shape'])} | {row['quant']} |"
        if "error" in row:
            lines.append(f"{head} error: {row['error'][:80]} |||||")
            continue
        lines.append(f"{head} {row['ms']:.3f} | {row['GBps']:.0f} | {row['pct_copy']:.0f} | {row['vs_torch']:.2f} | "
                     f"{row['code_mismatches']}, {row['scale_mismatches']} |")
    lines += ["", f"wall time {r['wall_s']} s; failures: {len(r['failures'])}", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
