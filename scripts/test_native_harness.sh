#!/usr/bin/env bash
# Build native/tests/harness.c for one ISA and run it: every kernel against the scalar path.
#   scripts/test_native_harness.sh [ISA] [CC] [RUNNER...]   (default: avx2 gcc, run directly)
# ISA avx512-simde: the avx512 kernels built against SIMDe's AVX-512 emulation (MA_SIMDE) and run on a CPU
# with AVX2 only; the headers come from PyPI's cmeel-simde (pip install cmeel-simde) or SIMDE_INCLUDE.
# HARNESS_SAMPLE=1: only native/kernels.py's sample() (plus prelu and the parameter gradients), which runs
# every loop and vector-layer macro at a fraction of the compile time (SIMDe builds are slow: measured in
# results/native-harness-full.txt).
# HARNESS_TWIN=ISA (e.g. avx2 for avx512 or avx512-simde): that ISA's kernels built in too, and every kernel's
# outputs compared with its twin's bit for bit (the bias_act sums within their bound).
# HARNESS_ARGS=--serve: the harness serves kernel requests on stdin/stdout instead (multiact/cli/served.py, the
# accuracy sweeps of NEON under qemu); the build's messages then go to stderr.
# Extra compiler flags come from HARNESS_CFLAGS (e.g. -fsanitize=address,undefined).
# bfloat16: every kernel with HARNESS_BF16=all (the default for neon, which only this harness runs), else one
# kernel per list and kinds of bodies (native/kernels.py's bf16_representatives: the bfloat16 code is the same
# macro text for every kernel of a list; tests/test_native_bf16.py runs all of them on the host's ISAs).
# Each (ISA, compiler, flags) builds in a directory of its own under native/_build, under a lock, and
# is not rebuilt while its binary is newer than every source (the build takes 40-80 s of CPU, a run
# about a second natively): running it under several runners (qemu CPUs, valgrind) builds it once.
set -euo pipefail
cd "$(dirname "$0")/.."
ISA_ARG=${1:-avx2}
ISA=${ISA_ARG%-simde}
CC=${2:-gcc}
shift $(( $# > 2 ? 2 : $# ))
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
# the ISA's architecture (multiact/vocab.py; the portable scalar ISA: this machine's); an unknown ISA stops here
ARCH=$("$PY" - "$ISA" <<'PYEOF'
import importlib.util, sys
spec = importlib.util.spec_from_file_location("v", "multiact/vocab.py"); v = importlib.util.module_from_spec(spec)
sys.modules["v"] = v; spec.loader.exec_module(v)
print(v.isa(sys.argv[1]).arch or v.arch())
PYEOF
)
STATIC=$([ "$ISA" = neon ] && echo -static || true)
export HARNESS_BF16=${HARNESS_BF16:-$([ "$ISA" = neon ] && echo all || echo some)}
SIMDE=""
OPT=-O0
if [ "$ISA_ARG" != "$ISA" ]; then
    INC=${SIMDE_INCLUDE:-$("$PY" - <<'PYEOF'
import os, site, sys
for d in [*site.getsitepackages(), site.getusersitepackages(), *sys.path]:
    inc = os.path.join(d, "cmeel.prefix", "include")
    if os.path.exists(os.path.join(inc, "simde", "x86", "avx512.h")):
        print(inc)
        break
PYEOF
)}
    if [ -z "$INC" ] || [ ! -f "$INC/simde/x86/avx512.h" ]; then
        echo "harness $ISA_ARG: no SIMDe headers (pip install cmeel-simde, or set SIMDE_INCLUDE)" >&2
        exit 3
    fi
    # SIMDE_NO_INLINE: SIMDe's always-inline helpers inlined into every kernel body made one part of the
    # table compile for over 10 minutes; out of line it is about 1.5 minutes of CPU (same results).  -O1
    # compiles SIMDe's code faster than -O0 (the sample: 15 s against 18 s of CPU on Zen 3)
    SIMDE="-DMA_SIMDE -DSIMDE_NO_INLINE -Wno-psabi -I$INC"
    OPT=-O1
fi
SAMPLE=$([ "${HARNESS_SAMPLE:-0}" = 1 ] && echo --sample || true)
# HARNESS_OPT (default -O0; -O1 under SIMDe): the same IEEE semantics as the extension's -O3 at any level (no
# fast-math, no contraction, SSE/NEON arithmetic without excess precision; the always_inline op bodies inline
# at -O0 too, so a step's fast-path test and lanes are the extension's).  avx2 build + run, CPU seconds on Zen 3
# under load 2-5: -O1 before bfloat16 69 s; -O0 with every bfloat16 kernel 73 s; -O0 with the representatives
# 44 s (the run itself ~1.2 s at -O0).
FLAGS="${HARNESS_OPT:-$OPT} -std=gnu11 -ffp-contract=off -fno-math-errno -Wall -Wno-unknown-pragmas $STATIC $SIMDE ${HARNESS_CFLAGS:-}"
LOG=$([ "${HARNESS_ARGS:-}" = --serve ] && echo 2 || echo 1)
KEY=$(printf '%s' "$CC $FLAGS $HARNESS_BF16 $SAMPLE ${HARNESS_TWIN:-}" | cksum | cut -d' ' -f1)
DIR=native/_build/harness_${ISA_ARG}_$(basename "$CC")${SAMPLE:+_sample}_$KEY
OUT=$DIR/harness
mkdir -p "$DIR"

build() {
    local gen
    gen=$(mktemp -d "$DIR/gen.XXXXXX")
    "$PY" - "$ARCH" > "$gen/ma_kernel_decls.h" <<'PYEOF'
import importlib.util, sys
spec = importlib.util.spec_from_file_location("k", "native/kernels.py"); k = importlib.util.module_from_spec(spec)
sys.modules["k"] = k; spec.loader.exec_module(k)
print(k.declarations(sys.argv[1]))
PYEOF
    "$PY" - $SAMPLE > "$gen/ma_kernel_list.h" <<'PYEOF'
import importlib.util, os, sys
spec = importlib.util.spec_from_file_location("k", "native/kernels.py"); k = importlib.util.module_from_spec(spec)
sys.modules["k"] = k; spec.loader.exec_module(k)
print(k.x_macro_header(*k.harness_selection("--sample" in sys.argv, os.environ["HARNESS_BF16"] == "all")))
PYEOF
    "$PY" native/kernels.py --isa-header > "$gen/ma_isa_list.h"  # the C runtime's ISA table (multiact/vocab.py)
    "$PY" native/tests/gen_harness_table.py "$ISA" "$ARCH" "$gen/harness_$ISA.h" $SAMPLE > /dev/null
    # one object per source, the ISA's kernels in the extension's parts (kernels.py PARTS; one unit for the
    # sample), compiled HARNESS_JOBS (default: the CPUs) at a time
    local srcs="native/tests/harness.c native/src/isa_scalar.c native/src/ma_runtime.c native/src/ma_pool.c"
    local unit
    for unit in "$ISA" ${HARNESS_TWIN:-}; do
        if [ -n "$SAMPLE" ]; then
            srcs="$srcs native/src/isa_$unit.c"
        else
            for part in $(seq 0 $(( $("$PY" -c 'import re; print(re.search(r"^PARTS = (\d+)", open("native/kernels.py").read(), re.M)[1])') - 1 ))); do
                printf '#define MA_PART %d\n#include "isa_%s.c"\n' "$part" "$unit" > "$gen/isa_${unit}_p$part.c"
                srcs="$srcs $gen/isa_${unit}_p$part.c"
            done
        fi
    done
    export CC FLAGS gen ISA
    # shellcheck disable=SC2016,SC2086
    printf '%s\n' $srcs | xargs -P "${HARNESS_JOBS:-$(nproc 2>/dev/null || echo 2)}" -I{} sh -c \
        '$CC $FLAGS -I"$gen" -Inative/src -DHARNESS_ISA="$ISA" -DHARNESS_TABLE="\"harness_$ISA.h\"" -c "$1" \
         -o "$gen/$(basename "$1" .c).o"' sh {}
    # shellcheck disable=SC2086
    $CC $FLAGS "$gen"/*.o -pthread -lm -o "$gen/harness"
    mv "$gen/harness" "$OUT"
    rm -rf "$gen"
}

up_to_date() {
    [ -x "$OUT" ] && [ -z "$(find native/src native/tests native/kernels.py multiact/_opdefs.py multiact/vocab.py multiact/optable.py scripts/test_native_harness.sh -newer "$OUT" \
        -type f -print -quit)" ]
}
(
    if command -v flock >/dev/null; then flock 9; fi
    if up_to_date; then echo "harness $ISA: $OUT is up to date"; else build; fi
) 9> "$DIR/lock" >&"$LOG"
exec "$@" "./$OUT" ${HARNESS_ARGS:-}
