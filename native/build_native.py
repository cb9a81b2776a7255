"""cffi builder for multiact._native (API mode; setup.py lists `native/build_native.py:ffibuilder`).

The C kernel list and the cdef are generated from native/kernels.py, the one kernel table.
Paths are relative to the project root, where setuptools runs this.  Set MULTIACT_NATIVE_DEBUG=1
for -O1 -g with AddressSanitizer and UBSan, Threads: native/src/ma_pool.c (pthreads).
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys

from cffi import FFI

_HERE = os.path.relpath(os.path.dirname(os.path.abspath(__file__)))
_SRC = os.path.join(_HERE, "src")
_GEN = os.path.join(_HERE, "_build")


def _kernels():
    spec = importlib.util.spec_from_file_location("_multiact_kernels", os.path.join(_HERE, "kernels.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def _write_if_changed(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if not os.path.exists(path) or open(path).read() != text:
        with open(path, "w") as f:
            f.write(text)


K = _kernels()
_write_if_changed(os.path.join(_GEN, "ma_kernel_list.h"), K.x_macro_header())
_DECLS = "/* Generated from native/kernels.py */\n" + K.declarations()
_write_if_changed(os.path.join(_GEN, "ma_kernel_decls.h"), _DECLS)

_TABLE_C = "/* Generated from native/kernels.py */\nconst char *ma_kernel_table(void) {\n    return\n" + "".join(
    f'        "{line}\\n"\n' for line in K.table_text().splitlines()
) + "        ;\n}\n"
_write_if_changed(os.path.join(_GEN, "ma_kernel_table.h"), _TABLE_C)



def _cdef_of(header: str) -> str:
    """The header's declarations as cffi reads them: no comments, no preprocessor lines."""
    text = re.sub(r"/\*.*?\*/", "", open(header).read(), flags=re.S)
    return "\n".join(line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#"))


# The cdef is ma_native.h itself plus the generated kernel prototypes: the two cannot drift.
_CDEF = _cdef_of(os.path.join(_SRC, "ma_native.h")) + "\n"

_debug = os.environ.get("MULTIACT_NATIVE_DEBUG", "") not in ("", "0")
_cflags = ["-std=gnu11", "-ffp-contract=off", "-fno-math-errno"]
_cflags += ["-O1", "-g", "-fno-omit-frame-pointer", "-fsanitize=address,undefined"] if _debug else ["-O3"]
_ldflags = ["-fsanitize=address,undefined"] if _debug else []
if os.name == "posix":
    _cflags.append("-pthread")
    _ldflags.append("-pthread")

ffibuilder = FFI()
ffibuilder.cdef(_CDEF + K.declarations())
ffibuilder.set_source(
    "multiact._native",
    '#include "ma_native.h"\n#include "ma_kernel_decls.h"\n#include "ma_kernel_table.h"\n',
    sources=[os.path.join(_SRC, f) for f in [f"isa_{isa}.c" for isa in K.isas()] + ["ma_runtime.c", "ma_pool.c"]],
    include_dirs=[_SRC, _GEN],
    depends=sorted(os.path.join(_SRC, f) for f in os.listdir(_SRC) if f.endswith((".h", ".inc")))
    + [os.path.join(_GEN, f) for f in ("ma_kernel_list.h", "ma_kernel_decls.h", "ma_kernel_table.h")],
    extra_compile_args=_cflags,
    extra_link_args=_ldflags,
    libraries=["m"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
