"""Time ma.gelu(d).sum().compute() on a 2-worker LocalCluster against the single-process call.

    python scripts/dask_gelu_timing.py [--n 64M] [--chunks 8] [--repeat 5] [--worker-env KEY=VALUE]

The array is generated on the workers and persisted, so the timed graph is
gelu + sum only; then it is gathered, and the same sum is computed here with
multiact and with the float64 reference formula in NumPy.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np


def _interleaved(fns: dict, repeat: int) -> dict:
    """{label: (median, min, max, last result)}, the calls interleaved so load hits them alike."""
    times: dict = {k: [] for k in fns}
    last: dict = {}
    for _ in range(repeat):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            last[k] = fn()
            times[k].append(time.perf_counter() - t0)
    return {k: (statistics.median(v), min(v), max(v), last[k]) for k, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=lambda s: int(float(s.rstrip("M")) * (1 << 20)) if s.endswith("M") else int(s),
                    default=64 << 20)
    ap.add_argument("--chunks", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--worker-env", action="append", default=[], metavar="KEY=VALUE",
                    help="extra environment for worker processes, e.g. MALLOC_MMAP_THRESHOLD_=16777216")
    args = ap.parse_args()

    import dask
    import dask.array as da
    from dask.distributed import Client, LocalCluster, wait

    import multiact as ma
    from multiact import reference

    n, chunk = args.n, args.n // args.chunks
    # distributed starts workers with MALLOC_TRIM_THRESHOLD_=65536, which switches off glibc's dynamic
    # mmap threshold: every temporary of 128 KiB or more is then a fresh mmap (page faults on each block).
    env = dict(kv.split("=", 1) for kv in args.worker_env)
    dask.config.set({f"distributed.nanny.pre-spawn-environ.{k}": v for k, v in env.items()})
    with LocalCluster(n_workers=2, processes=True, threads_per_worker=1, host="127.0.0.1",
                      dashboard_address=None) as cluster, Client(cluster) as client:
        d = da.random.default_rng(0).standard_normal(n, chunks=chunk, dtype=np.float32).persist()
        wait(d)
        ma.gelu(d[:chunk]).sum().compute()  # warm: import multiact on the workers
        backends = client.run(lambda: ma.explain("gelu", np.ones(1, np.float32)).splitlines()[0])
        x = d.compute()
        ma.gelu(x[:chunk]).sum()
        res = _interleaved({
            "LocalCluster, 2 workers x 1 thread": lambda: ma.gelu(d).sum().compute(),
            f"one process, {ma.get_num_threads()} threads": lambda: ma.gelu(x).sum(),
            "LocalCluster, d.sum() alone": lambda: d.sum().compute(),
        }, args.repeat)

    (_, _, _, s_dask), (_, _, _, s_one) = list(res.values())[:2]
    ref = float(np.sum(reference.gelu(x.astype(np.float64), approximate="none")))
    from multiact.cli import sysinfo

    print(f"CPU: {sysinfo.summary()}")  # the CPU these timings are measured on
    print(f"n = {n} float32 ({n * 4 / 2**20:.0f} MiB) in {args.chunks} chunks; workers: {set(backends.values())}"
          f"; extra worker env: {env or 'none'}")
    for label, (t, lo, hi, _) in res.items():
        print(f"{label:36s}: median {t * 1e3:8.1f} ms  (min {lo * 1e3:.1f}, max {hi * 1e3:.1f})")
    print(f"sums: dask {float(s_dask)!r}  single {float(s_one)!r}  float64 reference {ref!r}")
    rel = abs(float(s_dask) - ref) / abs(ref)
    print(f"relative difference dask vs reference: {rel:.2e}; dask vs single: "
          f"{abs(float(s_dask) - float(s_one)) / abs(float(s_one)):.2e}")
    assert rel < 1e-5, "the Dask sum does not match NumPy on the gathered array"


if __name__ == "__main__":
    main()
