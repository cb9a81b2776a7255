"""torch.library.opcheck on every multiact custom op, every parameter case of the definitions, float32 and
float64 (tests/test_torch_compile.py runs one sample of each op); then torch.compile(fullgraph=True) with inductor of a
model using every multiact.torch module, against eager.  About 2-4 minutes on a 2-core VM.

    python scripts/opcheck_all.py [--no-compile]
"""

from __future__ import annotations

import sys
import time

import torch

import multiact.torch as mt


def main() -> int:
    t0 = time.time()
    bad = 0
    n = 0
    for dtype in (torch.float32, torch.float64):
        for name, op, args in mt.opcheck_samples(dtype, every_case=True):
            n += 1
            try:
                result = torch.library.opcheck(op, args)
                failed = {k: v for k, v in result.items() if v != "SUCCESS"}
            except Exception as e:  # noqa: BLE001 - reported per op
                failed = {"error": repr(e)[:500]}
            if failed:
                bad += 1
                print(f"FAIL {name} {dtype}: {failed}")
    seen = {name for name, _, _ in mt.opcheck_samples(torch.float32, every_case=True)}
    missing = sorted(set(mt.CUSTOM_OPS) - seen)
    print(f"opcheck: {n} samples over {len(seen)} of {len(mt.CUSTOM_OPS)} ops, {bad} failed, "
          f"{time.time() - t0:.0f} s; ops without a sample: {missing or 'none'}")
    if "--no-compile" not in sys.argv:
        sys.path.insert(0, "tests")
        from test_torch_compile import _compiled_matches_eager, _EveryModule

        t1 = time.time()
        torch.manual_seed(0)
        _compiled_matches_eager(_EveryModule(), torch.randn(6, 8), "inductor")
        print(f"inductor fullgraph, every module: forward and backward equal eager ({time.time() - t1:.0f} s)")
    return 1 if bad or missing else 0


if __name__ == "__main__":
    raise SystemExit(main())
