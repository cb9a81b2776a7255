"""The Python extension multiact._native under AddressSanitizer and UBSan, run inside CPython.

    python scripts/native_sanitized.py [BUILD_DIR]

Builds the extension with native/build_native.py's debug flags (MULTIACT_NATIVE_DEBUG=1: -O1 -g
-fsanitize=address,undefined) into BUILD_DIR (a temporary folder if none; a build whose sources
and flags are unchanged is reused), compiling the sources in parallel; checks that a deliberate
overflow is caught, so a quiet run means something; then calls every kernel of every ISA this
CPU runs through the public API in a child Python with libasan preloaded: both directions, the
output forms and the parameter gradients, float16 and float32, sizes around the vector widths
and past the thread pool's threshold, out=, in place, strided, Fortran-ordered, misaligned.
Any sanitizer report fails the run.  Leaks are not checked (detect_leaks=0): CPython does not
free everything at exit, so every report would be noise; the C harness runs LeakSanitizer.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import importlib.util
import os
import runpy
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REPORTS = ("ERROR: AddressSanitizer", "runtime error:", "UndefinedBehaviorSanitizer")


# ---- build ------------------------------------------------------------------------------------------


def _gcc_file(name: str) -> str:
    """gcc's path to one of its runtime libraries, or '' where it has none."""
    path = subprocess.run(["gcc", f"-print-file-name={name}"], capture_output=True, text=True).stdout.strip()
    return path if os.path.isabs(path) and os.path.exists(path) else ""


def build(build_dir: Path) -> Path:
    """The sanitized extension in build_dir, built by build_native.py's own recipe and flags."""
    os.environ["MULTIACT_NATIVE_DEBUG"] = "1"
    os.chdir(ROOT)  # the builder's paths are relative to the project root
    ext = runpy.run_path("native/build_native.py")["ffibuilder"].distutils_extension(tmpdir=str(build_dir),
                                                                                     verbose=False)
    inc = [f"-I{d}" for d in [*ext.include_dirs, sysconfig.get_paths()["include"]]]
    inc += [f"-D{k}" if v is None else f"-D{k}={v}" for k, v in ext.define_macros]
    cflags = ["-fPIC", *inc, *ext.extra_compile_args]
    so = build_dir / "multiact" / f"_native{sysconfig.get_config_var('EXT_SUFFIX')}"
    stamp = hashlib.sha1(repr((cflags, ext.extra_link_args, sys.version, _gcc_file("libasan.so"))).encode())
    for src in sorted({*ext.sources, *ext.depends}):
        stamp.update(Path(src).read_bytes())
    stamp_file = build_dir / "stamp"
    if so.exists() and stamp_file.exists() and stamp_file.read_text() == stamp.hexdigest():
        return so

    def compile_one(src: str) -> str:
        obj = str(build_dir / (Path(src).name + ".o"))
        subprocess.run(["gcc", *cflags, "-c", src, "-o", obj], check=True)
        return obj

    workers = max(1, min(len(ext.sources), os.cpu_count() or 1))
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:  # one source per core: the build is the cost
        objs = list(pool.map(compile_one, ext.sources))
    libs = [f"-l{lib}" for lib in ext.libraries]
    subprocess.run(["gcc", "-shared", *objs, "-o", str(so), *ext.extra_link_args, *libs], check=True)
    stamp_file.write_text(stamp.hexdigest())
    return so


def _child(mode: str, so: Path) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "LD_PRELOAD": " ".join(p for p in (_gcc_file("libasan.so"), _gcc_file("libubsan.so")) if p),
        "ASAN_OPTIONS": "detect_leaks=0:halt_on_error=1:abort_on_error=0:print_summary=1",
        "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1",
        "PYTHONMALLOC": "malloc",  # Python's own objects under ASan's allocator too
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    env.pop("MULTIACT_NATIVE_ISA", None)
    return subprocess.run([sys.executable, __file__, mode, str(so)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)


def main(argv: list[str]) -> int:
    import tempfile

    if not _gcc_file("libasan.so"):
        print("gcc has no libasan.so (apt-get install gcc libasan8 libubsan1)")
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        build_dir = Path(argv[0]).resolve() if argv else Path(tmp)
        (build_dir / "multiact").mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        so = build(build_dir)
        t1 = time.monotonic()
        canary = _child("--canary", so)
        if "heap-buffer-overflow" not in canary.stderr or canary.returncode == 0:
            print(canary.stdout, canary.stderr[-4000:])
            print("FAIL: a deliberate overflow went unreported: the sanitizers are not active")
            return 1
        run = _child("--exercise", so)
        t2 = time.monotonic()
        print(run.stdout[-4000:], run.stderr[-8000:])
        print(f"build {t1 - t0:.1f} s, canary and exercise {t2 - t1:.1f} s")
        if run.returncode != 0 or any(r in run.stderr for r in REPORTS):
            print(f"FAIL: exit status {run.returncode}")
            return 1
    return 0


# ---- in the child, with the sanitizers loaded ---------------------------------------------------------


def _load(so: str):
    """The sanitized build as multiact._native, before the native backend first imports it."""
    import multiact

    spec = importlib.util.spec_from_file_location("multiact._native", so)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    sys.modules["multiact._native"] = mod
    multiact._native = mod
    return mod


def canary(so: str) -> None:
    """Read 64 halves past the end of h with the extension's own conversion loop: ASan must stop this."""
    import numpy as np

    mod = _load(so)
    lib, ffi = mod.lib, mod.ffi
    h = np.ones(1000, np.uint16)
    f = np.empty(2000, np.float32)
    lib.ma_f16_to_f32(ffi.from_buffer("uint16_t[]", h), ffi.from_buffer("float[]", f), h.size + 64)


def _layouts(dtype):
    """Makers of an array in one memory layout from a 1-D base: what each call gets for x, dy and out."""
    import numpy as np

    def strided(a):
        s = np.zeros((a.size, 2), dtype)[:, 1]
        s[...] = a
        return s

    def misaligned(a):
        m = np.frombuffer(np.zeros(a.nbytes + 1, np.uint8).data, dtype, a.size, offset=1)
        m[...] = a
        return m

    return {
        "contiguous": lambda a: a.copy(),
        "strided": strided,
        "reversed": lambda a: a.copy()[::-1],
        "fortran": lambda a: np.asfortranarray(a.reshape(-1, 3)) if a.size % 3 == 0 else None,
        "misaligned": misaligned,
    }


def exercise(so: str) -> None:
    import numpy as np

    import multiact as ma
    from multiact import consistency as C
    from multiact import registry
    from multiact.optable import FAMILY_KEYS, KEYS

    mod = _load(so)
    nb = registry.module("native")
    mod.lib.ma_set_parallel_min(1024)  # the thread pool at small sizes
    ma.set_num_threads(3)
    sizes = (0, 1, 7, 8, 9, 15, 17, 33, 3 * 1031)
    calls = 0
    for isa in nb._load()["isas"]:
        os.environ["MULTIACT_NATIVE_ISA"] = isa
        nb._state.clear()
        registry.clear_cache()
        state = nb._load()
        assert state["ok"] and state["lib"] is mod.lib and state["isa"] == isa, state
        for key, direction, dtype in sorted(state["table"]):
            if key in FAMILY_KEYS:
                calls += _gated_calls(ma, key, direction, dtype)
                continue
            spec = KEYS[key]
            for p in C.key_cases(spec, key):
                if direction == "backward_y" and not spec.supports_y(spec.validate(p)):
                    continue
                for n in sizes:
                    xb = C.sample_x(spec, spec.validate(p), dtype, n=max(n, 1))[:n].astype(dtype)
                    dyb = np.linspace(-2, 2, n).astype(dtype)
                    for make in _layouts(dtype).values():
                        x = make(xb)
                        if x is not None:
                            calls += _calls(ma, spec, direction, p, x, make(dyb), make(np.zeros_like(xb)))
    print(f"{calls} calls on {', '.join(nb._load()['isas'])}")


def _gated_calls(ma, key, direction, dtype) -> int:
    """A gated kernel through ma.glu / ma.glu_grad: halves along the last dim and dim 0, interleaved (the
    register de-interleave), a strided view (gathered), the two-input form, clipped, in place, sizes
    around the vector widths and past the pool's threshold."""
    import numpy as np

    from multiact import consistency as C
    from multiact.optable import FAMILY_KEYS

    _, spec, act_key = FAMILY_KEYS[key]
    case = dict(C.key_cases(spec, act_key)[0])
    kw = {"act": spec.name, "activate": "first", "backend": "native", **case}
    calls = 0
    for n in (1, 7, 8, 9, 17, 33, 1031):
        pool = C.sample_x(spec, spec.validate(case), dtype, n=2 * n)
        x = np.resize(pool, (3, 2 * n)).astype(dtype)
        strided = np.resize(pool, (3, 4 * n)).astype(dtype)[:, ::2]
        for dim, layout, xv in ((-1, "halves", x), (0, "halves", np.resize(pool, (4, n)).astype(dtype)),
                                (-1, "interleaved", x), (-1, "halves", strided)):
            y = ma.glu(xv, dim, layout=layout, **kw)
            if direction == "backward":
                dy = np.linspace(-2, 2, y.size).reshape(y.shape).astype(dtype)
                ma.glu_grad(dy, xv, dim, layout=layout, **kw)
                buf = xv.copy()
                ma.glu_grad(dy, buf, dim, layout=layout, out=buf, **kw)
            calls += 1
        gate, up = x[:, :n].copy(), x[:, n:].copy()
        if direction == "forward":
            ma.glu(gate, up=up, **kw)
            if key == "gated:swish":
                ma.swiglu(x, alpha=1.702, limit=7.0, layout="interleaved", backend="native")
        else:
            ma.glu_grad(gate.copy(), gate, up=up, out=(gate, up), **kw)
            if key == "gated:swish":
                ma.swiglu_grad(gate, x, alpha=1.702, limit=7.0, layout="interleaved", backend="native")
        calls += 1
    return calls


def _calls(ma, spec, direction, p, x, dy, out) -> int:
    """The call allocating its result, then into out, then in place (out=x forward, out=dy backward)."""
    import numpy as np

    op, kw = spec.name, {**p, "backend": "native"}
    if spec.defn.array_param:  # a weight per channel of a 2-D x, a single one otherwise
        w = np.linspace(0.05, 0.3, x.shape[1] if x.ndim == 2 else 1).astype(x.dtype)
        kw = {spec.defn.array_param: w, "axis": x.ndim - 1, "backend": "native"}
    if direction == "param_grad":
        ma.param_grad(op, spec.param_grad[0], dy, x, **kw)
        return 1
    if direction == "forward":
        ma.forward(op, x, **kw)
        ma.forward(op, x, out=out, **kw)
        ma.forward(op, x, out=x, **kw)
    else:
        xy = {"x": x} if direction == "backward" else {"y": x}
        ma.backward(op, dy, **xy, **kw)
        ma.backward(op, dy, **xy, out=out, **kw)
        ma.backward(op, dy, **xy, out=dy, **kw)
    return 3


if __name__ == "__main__":
    if sys.argv[1:2] == ["--canary"]:
        canary(sys.argv[2])
    elif sys.argv[1:2] == ["--exercise"]:
        exercise(sys.argv[2])
    else:
        sys.exit(main(sys.argv[1:]))
