"""What this machine offers multiact: CPU and SIMD features, backends, library versions, threads.

Read without importing heavy libraries: versions come from package metadata,
so `multiact info` stays fast and never initialises torch or CUDA.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform
import sys
import textwrap
from typing import Any

# SIMD features multiact's kernels choose between, per architecture (names as /proc/cpuinfo spells them).
SIMD_FLAGS = {
    "x86_64": ("sse4_2", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_fp16"),
    "aarch64": ("asimd", "asimdhp", "fphp", "sve", "sve2"),
}

# Import name -> what to report; versions are read from the distribution that provides it.
LIBRARIES = (
    "numpy", "numba", "numba_cuda", "cffi", "onnx", "onnxruntime", "torch", "torch_npu", "cupy", "dask",
    "tqdm", "matplotlib",
)


def cpu() -> dict[str, Any]:
    """CPU model, core counts and the SIMD features that matter (from /proc/cpuinfo on Linux)."""
    machine = platform.machine().lower()
    arch = {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine)
    out: dict[str, Any] = {"arch": arch, "model": platform.processor() or "unknown", "logical_cpus": os.cpu_count()}
    try:
        out["usable_cpus"] = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        out["usable_cpus"] = os.cpu_count()
    fields = _cpuinfo()
    if fields:
        model = fields.get("model name") or fields.get("Hardware") or fields.get("cpu model")
        if not model and "CPU implementer" in fields:
            model = f"implementer {fields['CPU implementer']} part {fields.get('CPU part', '?')}"
        if model:
            out["model"] = model
        have = set((fields.get("flags") or fields.get("Features") or "").split())
        wanted = SIMD_FLAGS.get(arch, ())
        out["simd"] = {f: f in have for f in wanted}
    else:
        out["simd"] = {}
    try:
        out["load_average"] = [round(v, 2) for v in os.getloadavg()]
    except OSError:  # pragma: no cover
        pass
    return out


def _cpuinfo() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo ({} where there is none)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return {}
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if fields.get("flags") or fields.get("Features"):
                break
            continue
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return fields


def library_versions() -> dict[str, str | None]:
    """Installed version of each library multiact can use (None: not installed); nothing is imported."""
    try:
        dists = importlib.metadata.packages_distributions()
    except Exception:  # pragma: no cover - broken metadata
        dists = {}
    out: dict[str, str | None] = {}
    for name in LIBRARIES:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            out[name] = None
            continue
        version = None
        for dist in dists.get(name, [name.replace("_", "-")]):
            try:
                version = importlib.metadata.version(dist)
                if len(dists.get(name, [])) > 1:
                    version = f"{version} ({dist})"
                break
            except importlib.metadata.PackageNotFoundError:
                continue
        out[name] = version or "installed (version unknown)"
    return out


def backends() -> list[dict[str, Any]]:
    """Every backend: available or not and why, its priority, array kinds, ISA and devices."""
    import multiact as ma

    return [
        {
            "name": b.name, "available": b.available, "reason": b.reason, "priority": b.priority,
            "kinds": list(b.kinds), "devices": list(b.devices), "details": _plain(b.details),
        }
        for b in ma.backends()
    ]


def _plain(v: Any) -> Any:
    """JSON-safe copy of a backend's info()."""
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    return str(v)


def threads() -> dict[str, Any]:
    """The thread budget and the environment variables that steer multiact."""
    import multiact as ma

    env = ("MULTIACT_NUM_THREADS", "MULTIACT_BACKEND", "OMP_NUM_THREADS", "NUMBA_NUM_THREADS")
    try:
        n: Any = ma.get_num_threads()
    except ValueError as e:  # a bad MULTIACT_NUM_THREADS: show it rather than fail
        n = f"error: {e}"
    return {"num_threads": n, "env": {k: os.environ.get(k) for k in env}}


def default_choice() -> dict[str, str]:
    """Which backend a plain NumPy call would use, per dtype (gelu forward as the example)."""
    import numpy as np

    import multiact as ma

    out = {}
    for dt in ("float16", "float32", "float64"):
        try:
            out[dt] = ma.explain("gelu", np.zeros(1, dt)).splitlines()[0].split("->")[-1].strip()
        except Exception as e:
            out[dt] = f"none ({type(e).__name__}: {e})"
    return out


def collect() -> dict[str, Any]:
    """Everything `multiact info` shows."""
    import multiact as ma

    return {
        "multiact": ma.__version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu": cpu(),
        "backends": backends(),
        "default_backend": default_choice(),
        "libraries": library_versions(),
        "threads": threads(),
    }


def render(info: dict[str, Any]) -> str:
    """The short human-readable form of `collect()`."""
    from ._report import table

    c = info["cpu"]
    lines = [
        f"multiact {info['multiact']}  Python {info['python']}  {info['platform']}",
        f"CPU: {c['model']} ({c['arch']}, {c['usable_cpus']} usable of {c['logical_cpus']} logical CPUs"
        + (f", load {', '.join(str(v) for v in c['load_average'])})" if "load_average" in c else ")"),
    ]
    if c["simd"]:
        lines.append("SIMD: " + "  ".join(f"{k} {'yes' if v else 'no'}" for k, v in c["simd"].items()))
    rows = []
    for b in info["backends"]:
        details = dict(b["details"])
        where = ", ".join(str(details.pop(k)) for k in ("isa",) if k in details)
        where = ", ".join(x for x in (where, *b["devices"]) if x)
        reason = b["reason"] if len(b["reason"]) <= 60 else b["reason"][:57].rstrip() + "... (*)"
        rows.append([b["name"], "yes" if b["available"] else "no", b["priority"], ",".join(b["kinds"]) or "-",
                     where or "-", reason])
    lines += ["", table(rows, ["backend", "available", "priority", "arrays", "isa/devices", "reason"], "llrlll")]
    for b in info["backends"]:
        if len(b["reason"]) > 60:
            lines += textwrap.wrap(f"(*) {b['name']}: {b['reason']}", 110, subsequent_indent="    ")
    lines += ["", "NumPy arrays run on: " + ", ".join(f"{k} -> {v}" for k, v in info["default_backend"].items())]
    libs = info["libraries"]
    lines.append("Libraries: " + ", ".join(f"{k} {v or '-'}" for k, v in libs.items()))
    t = info["threads"]
    env = ", ".join(f"{k}={v}" for k, v in t["env"].items() if v is not None) or "none set"
    lines.append(f"Threads: {t['num_threads']} (environment: {env})")
    return "\n".join(lines)
