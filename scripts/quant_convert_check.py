"""The float32 -> code conversion of the native one pass (native/src/ma_quant.inc, through `ma_q_convert__<isa>`:
the kernels' sequence, q_fast8 with the general one where it says so, and the general sequence q_code alone) on
every float32 bit pattern, against multiact.quant's scalar reference (`_codes`: clip to
+-qmax, then ml_dtypes' round-to-nearest-even cast, or rint for int8), for float8_e4m3fn, float8_e5m2 and int8 and
every ISA this machine runs.  Bit for bit, NaN patterns included (float8 NaN codes, int8 0).

    python scripts/quant_convert_check.py [--step K] [--out results/quant-convert-exhaustive.txt]

--step K takes every K-th pattern (1: all 2^32; tests/test_quant_fused.py runs K = 65537 plus the specials).
About 3 minutes for all 2^32 on one Zen 4 core (the reference's ml_dtypes casts are most of it).
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from multiact import quant as Q
from multiact.backend import native_backend as nb

FMTS = ("float8_e4m3fn", "float8_e5m2", "int8")
CHUNK = 1 << 24


SEQUENCES = {"kernels": 0, "general": 4}  # ma_q_convert's fmt bits: q_codes' sequence, or q_code alone


def check(step: int = 1, isas: list[str] | None = None, log=print) -> dict[tuple[str, str, str], tuple[int, int, int]]:
    """{(format, sequence, isa): (patterns, mismatches, first mismatching pattern or -1)}."""
    s = nb._load()
    lib, ffi = s["lib"], s["ffi"]
    isas = isas or list(s["isas"])
    res = {(f, q, i): [0, 0, -1] for f in FMTS for q in SEQUENCES for i in isas}
    t0 = time.time()
    for lo in range(0, 1 << 32, CHUNK * step):
        bits = np.arange(lo, min(lo + CHUNK * step, 1 << 32), step, dtype=np.uint64).astype(np.uint32)
        r = bits.view(np.float32)
        out = np.empty(r.size, np.uint8)
        for fi, f in enumerate(FMTS):
            with np.errstate(all="ignore"):
                ref = Q._codes(Q.Quant(f, "token"), r).view(np.uint8)
            for (seq, bits_), isa in ((sq, i) for sq in SEQUENCES.items() for i in isas):
                getattr(lib, f"ma_q_convert__{isa}")(ffi.from_buffer("float[]", r), r.size, fi | bits_,
                                                     ffi.from_buffer("uint8_t[]", out))
                bad = np.flatnonzero(out != ref)
                row = res[(f, seq, isa)]
                row[0] += r.size
                if bad.size:
                    if row[1] == 0:
                        row[2] = int(bits[bad[0]])
                    row[1] += int(bad.size)
        if lo and (lo // (CHUNK * step)) % 32 == 0:
            log(f"  ... {lo / 2**32:.0%} ({time.time() - t0:.0f} s)")
    return {k: tuple(v) for k, v in res.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--step", type=int, default=1)
    ap.add_argument("--out")
    a = ap.parse_args()
    from multiact.cli.sysinfo import cpu

    t0 = time.time()
    res = check(a.step, log=lambda m: print(m, file=sys.stderr, flush=True))
    lines = ["# native quant conversion (ma_quant.inc q_code) vs multiact.quant._codes, every "
             + ("float32 pattern (2^32)" if a.step == 1 else f"{a.step}th float32 pattern"),
             f"# CPU: {cpu()['summary']}",
             f"# {time.time() - t0:.0f} s", "format          sequence isa      patterns     mismatches  first"]
    ok = True
    for (f, seq, isa), (n, bad, first) in res.items():
        ok &= bad == 0
        lines.append(f"{f:15s} {seq:8s} {isa:8s} {n:12d} {bad:10d}  {'-' if first < 0 else hex(first)}")
    lines.append("all equal" if ok else "MISMATCHES")
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if a.out:
        with open(a.out, "w") as fh:
            fh.write(text)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
