"""What this machine offers multiact: CPU and SIMD features, backends, library versions, threads.

The CPU identity (vendor, family, model, stepping, microarchitecture, SIMD features; `identity()`,
one line by `describe()`) heads every benchmark output: this project's machines are not all one CPU.

Read without importing heavy libraries: versions come from package metadata,
so `multiact info` stays fast and never initialises torch or CUDA.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform
import re
import sys
import textwrap
from typing import Any

from .. import vocab

# SIMD features multiact's kernels choose between, per architecture (names as /proc/cpuinfo spells them;
# multiact.vocab's ARCHES, which hold the flags each ISA needs).
SIMD_FLAGS = {a.name: a.flags for a in vocab.ARCHES.values()}

# AMD family -> (first model, last model, microarchitecture), as Linux's arch/x86/kernel/cpu/amd.c
# (bsp_init_amd) sorts them; "Zen 1" there includes Zen+. Family 23 = 0x17, 25 = 0x19, 26 = 0x1a.
AMD_ZEN: dict[int, tuple[tuple[int, int, str], ...]] = {
    0x17: ((0x00, 0x2F, "Zen 1"), (0x50, 0x5F, "Zen 1"), (0x30, 0x4F, "Zen 2"), (0x60, 0x7F, "Zen 2"),
           (0x90, 0x91, "Zen 2"), (0xA0, 0xAF, "Zen 2")),
    0x19: ((0x00, 0x0F, "Zen 3"), (0x20, 0x5F, "Zen 3"), (0x10, 0x1F, "Zen 4"), (0x60, 0xAF, "Zen 4")),
    0x1A: ((0x00, 0x2F, "Zen 5"), (0x40, 0x4F, "Zen 5"), (0x60, 0x7F, "Zen 5")),
}
# Intel family 6 server models (Linux's arch/x86/include/asm/intel-family.h). Model 0x55 is told apart
# by its stepping: 0-4 Skylake-SP, 5-7 Cascade Lake, 10-11 Cooper Lake.
INTEL_SERVER: dict[int, str] = {
    0x2D: "Sandy Bridge-EP", 0x3E: "Ivy Bridge-EP", 0x3F: "Haswell-EP", 0x4F: "Broadwell-EP", 0x56: "Broadwell-DE",
    0x6A: "Ice Lake-SP", 0x6C: "Ice Lake-D", 0x8F: "Sapphire Rapids", 0xCF: "Emerald Rapids",
    0xAD: "Granite Rapids", 0xAE: "Granite Rapids-D", 0xAF: "Sierra Forest",
}
_INTEL_0x55 = ((0, 4, "Skylake-SP"), (5, 7, "Cascade Lake"), (10, 11, "Cooper Lake"))
# aarch64: "CPU implementer" -> vendor, and (implementer, "CPU part") -> core.
ARM_IMPLEMENTERS = {0x41: "ARM", 0x42: "Broadcom", 0x43: "Cavium", 0x48: "HiSilicon", 0x4E: "NVIDIA",
                    0x50: "APM", 0x51: "Qualcomm", 0x61: "Apple", 0xC0: "Ampere"}
ARM_PARTS = {
    (0x41, 0xD03): "Cortex-A53", (0x41, 0xD05): "Cortex-A55", (0x41, 0xD07): "Cortex-A57",
    (0x41, 0xD08): "Cortex-A72", (0x41, 0xD0B): "Cortex-A76", (0x41, 0xD0C): "Neoverse N1",
    (0x41, 0xD40): "Neoverse V1", (0x41, 0xD49): "Neoverse N2", (0x41, 0xD4F): "Neoverse V2",
    (0x48, 0xD01): "TaiShan v110 (Kunpeng 920)", (0xC0, 0xAC3): "AmpereOne",
}

# Import name -> what to report; versions are read from the distribution that provides it.
LIBRARIES = (
    "numpy", "numba", "numba_cuda", "cffi", "onnx", "onnxruntime", "torch", "torch_npu", "cupy", "dask",
    "tqdm", "matplotlib",
)


def cpu() -> dict[str, Any]:
    """CPU model, identity, core counts and the SIMD features that matter (from /proc/cpuinfo on Linux).

    `identity` is what tells this project's machines apart (see `identity()`); `summary` is its one line,
    the line every benchmark header carries.
    """
    arch = vocab.arch()
    out: dict[str, Any] = {"arch": arch, "model": platform.processor() or "unknown", "logical_cpus": os.cpu_count()}
    try:
        out["usable_cpus"] = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        out["usable_cpus"] = os.cpu_count()
    fields = _cpuinfo()
    ident = identity(fields, arch, llvm=True)
    if ident["model_name"] != "unknown":
        out["model"] = ident["model_name"]
    out["simd"] = dict(ident["simd"])
    out["identity"] = ident
    out["summary"] = describe(ident)
    try:
        out["load_average"] = [round(v, 2) for v in os.getloadavg()]
    except OSError:  # pragma: no cover
        pass
    return out


def _cpuinfo(text: str | None = None) -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo, or of `text` ({} where there is none)."""
    if text is None:
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


def _int(v: str | None) -> int | None:
    """A /proc/cpuinfo number: decimal ('25') or hexadecimal ('0xd0c'); None if absent or not a number."""
    if v is None:
        return None
    try:
        return int(v, 0) if v.lower().startswith("0x") else int(v)
    except ValueError:
        return None


def identity(fields: dict[str, str] | None = None, arch: str | None = None, llvm: bool = False) -> dict[str, Any]:
    """Vendor, family, model, stepping, model name, microarchitecture and SIMD features of the CPU.

    `fields`: /proc/cpuinfo's first processor (read from this machine when None); `arch` is worked out
    from them when not given. The microarchitecture comes from a small table of exact family/model
    matches (AMD Zen 1-5, Intel server parts, a few Arm cores) and is 'unknown' otherwise, never guessed.
    With `llvm`, `llvm_cpu` is the host CPU name LLVM (and so numba) compiles for, where llvmlite is
    installed. On aarch64, family is "CPU architecture", model the "CPU part" and stepping rNpM.
    """
    if fields is None:
        fields = _cpuinfo()
        if not fields and arch is None:
            arch = platform.machine().lower()
    if arch is None:
        arch = "aarch64" if "CPU implementer" in fields else "x86_64" if "vendor_id" in fields else "unknown"
    arch = vocab.arch(arch)
    have = set((fields.get("flags") or fields.get("Features") or "").split())
    out: dict[str, Any] = {"vendor": "unknown", "family": None, "model": None, "stepping": None,
                           "model_name": fields.get("model name") or fields.get("Hardware") or "unknown",
                           "microarchitecture": "unknown",
                           "simd": {f: f in have for f in SIMD_FLAGS.get(arch, ())} if have else {}}
    if "vendor_id" in fields:
        vendor, family, model, stepping = (fields["vendor_id"], _int(fields.get("cpu family")),
                                           _int(fields.get("model")), _int(fields.get("stepping")))
    elif "CPU implementer" in fields:
        impl, part = _int(fields.get("CPU implementer")), _int(fields.get("CPU part"))
        variant, revision = _int(fields.get("CPU variant")), _int(fields.get("CPU revision"))
        vendor = ARM_IMPLEMENTERS.get(impl, f"implementer {fields['CPU implementer']}") if impl is not None \
            else "unknown"
        family, model = _int(fields.get("CPU architecture")), part
        stepping = f"r{variant}p{revision}" if variant is not None and revision is not None else None
        out["implementer"], out["part"] = fields.get("CPU implementer"), fields.get("CPU part")
        if out["model_name"] == "unknown" and (impl, part) in ARM_PARTS:
            out["model_name"] = ARM_PARTS[(impl, part)]
    else:  # no /proc/cpuinfo: Windows spells it "Intel64 Family 6 Model 85 Stepping 7, GenuineIntel"
        m = re.match(r".*Family (\d+) Model (\d+) Stepping (\d+), (\w+)", platform.processor() if not fields else "")
        vendor, family, model, stepping = (m[4], int(m[1]), int(m[2]), int(m[3])) if m else ("unknown", None, None,
                                                                                            None)
    out.update(vendor=vendor, family=family, model=model, stepping=stepping)
    out["microarchitecture"] = microarchitecture(vendor, family, model, stepping, fields)
    if llvm:
        out["llvm_cpu"] = _llvm_cpu()
    return out


def microarchitecture(vendor: str, family: int | None, model: int | None, stepping: Any = None,
                      fields: dict[str, str] | None = None) -> str:
    """The microarchitecture of an exact (vendor, family, model[, stepping]) match; 'unknown' otherwise."""
    if family is None or model is None:
        return "unknown"
    if vendor == "AuthenticAMD":
        return next((name for lo, hi, name in AMD_ZEN.get(family, ()) if lo <= model <= hi), "unknown")
    if vendor == "GenuineIntel" and family == 6:
        if model == 0x55:
            return next((n for lo, hi, n in _INTEL_0x55 if isinstance(stepping, int) and lo <= stepping <= hi),
                        "unknown")
        return INTEL_SERVER.get(model, "unknown")
    if fields and "CPU implementer" in fields:
        return ARM_PARTS.get((_int(fields["CPU implementer"]), model), "unknown")
    return "unknown"


_LLVM_CPU: list[str | None] = []


def _llvm_cpu() -> str | None:
    """LLVM's name for the host CPU (what numba targets: 'znver3', 'skylake-avx512'); None without llvmlite."""
    if not _LLVM_CPU:
        try:
            import llvmlite.binding as llvm

            _LLVM_CPU.append(str(llvm.get_host_cpu_name()))
        except Exception:
            _LLVM_CPU.append(None)
    return _LLVM_CPU[0]


def describe(ident: dict[str, Any]) -> str:
    """One line naming the CPU: 'AMD EPYC (AuthenticAMD family 25 model 1 stepping 1: Zen 3); avx2 fma f16c,
    no avx512' -- the line benchmark headers carry, so that a figure stays next to the CPU it was measured on."""
    if "implementer" in ident:
        where = (f"{ident['vendor']} implementer {ident['implementer']} part {ident.get('part')}"
                 + (f" {ident['stepping']}" if ident["stepping"] else ""))
    elif ident["family"] is not None:
        where = (f"{ident['vendor']} family {ident['family']} model {ident['model']}"
                 + (f" stepping {ident['stepping']}" if ident["stepping"] is not None else ""))
    else:
        where = "family/model unknown"
    uarch = ident["microarchitecture"]
    line = f"{ident['model_name']} ({where}: {uarch if uarch != 'unknown' else 'microarchitecture unknown'})"
    simd = ident.get("simd") or {}
    if simd:
        keys = [k for k in simd if k != "sse4_2"]
        yes = [k for k in keys if simd[k]]
        no = [k for k in keys if not simd[k]]
        if "avx512f" in no:  # no AVX-512 at all: say it once
            no = [k for k in no if not k.startswith("avx512")] + ["avx512"]
        line += "; " + " ".join(yes or ["no SIMD listed"]) + (f", no {' '.join(no)}" if no else "")
    if ident.get("llvm_cpu"):
        line += f"; llvm {ident['llvm_cpu']}"
    return line


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
    for name, d in vocab.DTYPES.items():
        if d.needs:  # bfloat16 NumPy arrays come from ml_dtypes (multiact[bf16]), which names it to NumPy
            if importlib.util.find_spec(d.needs) is None:
                continue
            importlib.import_module(d.needs)
        try:
            out[name] = ma.explain("gelu", np.zeros(1, name)).splitlines()[0].split("->")[-1].strip()
        except Exception as e:
            out[name] = f"none ({type(e).__name__}: {e})"
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


def summary(c: dict[str, Any] | None = None) -> str:
    """The one-line CPU description of a `cpu()` dict (this machine's when None), also of one saved
    before identities were recorded: then it says that family and model were not recorded."""
    c = cpu() if c is None else c
    if c.get("summary"):
        return c["summary"]
    simd = c.get("simd") or {}
    have = " ".join(k for k, v in simd.items() if v and k != "sse4_2")
    if simd.get("avx512f") is False:
        have += ", no avx512"
    return f"{c.get('model', 'unknown')} (family/model not recorded)" + (f"; {have}" if have else "")


def render(info: dict[str, Any]) -> str:
    """The short human-readable form of `collect()`."""
    from ._report import table

    c = info["cpu"]
    ident = c.get("identity") or {}
    lines = [
        f"multiact {info['multiact']}  Python {info['python']}  {info['platform']}",
        f"CPU: {c['model']} ({c['arch']}, {c['usable_cpus']} usable of {c['logical_cpus']} logical CPUs"
        + (f", load {', '.join(str(v) for v in c['load_average'])})" if "load_average" in c else ")"),
        "CPU identity: " + ", ".join(
            f"{k} {ident.get(k)}" for k in (("vendor", "implementer", "part", "stepping") if "implementer" in ident
                                            else ("vendor", "family", "model", "stepping")))
        + f", microarchitecture {ident.get('microarchitecture', 'unknown')}"
        + (f", LLVM target {ident['llvm_cpu']}" if ident.get("llvm_cpu") else ""),
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
