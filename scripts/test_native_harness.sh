#!/usr/bin/env bash
# Build native/tests/harness.c for one ISA and run it: every kernel against the scalar path.
#   scripts/test_native_harness.sh [ISA] [CC] [RUNNER...]   (default: avx2 gcc, run directly)
# Extra compiler flags come from HARNESS_CFLAGS (e.g. -fsanitize=address,undefined).
# bfloat16: every kernel with HARNESS_BF16=all (the default for neon, which only this harness runs), else one
# kernel per list and kinds of bodies (native/kernels.py's bf16_representatives: the bfloat16 code is the same
# macro text for every kernel of a list; tests/test_native_bf16.py runs all of them on the host's ISAs).
# Each (ISA, compiler, flags) builds in a directory of its own under native/_build, under a lock, and
# is not rebuilt while its binary is newer than every source (the build takes 40-80 s of CPU, a run
# about a second natively): running it under several runners (qemu CPUs, valgrind) builds it once.
set -euo pipefail
cd "$(dirname "$0")/.."
ISA=${1:-avx2}
CC=${2:-gcc}
shift $(( $# > 2 ? 2 : $# ))
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
case $ISA in neon) ARCH=aarch64 ;; *) ARCH=x86_64 ;; esac
STATIC=$([ "$ISA" = neon ] && echo -static || true)
export HARNESS_BF16=${HARNESS_BF16:-$([ "$ISA" = neon ] && echo all || echo some)}
# HARNESS_OPT (default -O0): the same IEEE semantics as the extension's -O3 at any level (no fast-math, no
# contraction, SSE/NEON arithmetic without excess precision; the always_inline op bodies inline at -O0 too, so
# a step's fast-path test and lanes are the extension's).  avx2 build + run, CPU seconds on Zen 3 under load
# 2-5: -O1 before bfloat16 69 s; -O0 with every bfloat16 kernel 73 s; -O0 with the representatives 44 s (the
# run itself ~1.2 s at -O0).
FLAGS="${HARNESS_OPT:--O0} -std=gnu11 -ffp-contract=off -fno-math-errno -Wall -Wno-unknown-pragmas $STATIC ${HARNESS_CFLAGS:-}"
KEY=$(printf '%s' "$CC $FLAGS $HARNESS_BF16" | cksum | cut -d' ' -f1)
DIR=native/_build/harness_${ISA}_$(basename "$CC")_$KEY
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
    "$PY" - > "$gen/ma_kernel_list.h" <<'PYEOF'
import importlib.util, os, sys
spec = importlib.util.spec_from_file_location("k", "native/kernels.py"); k = importlib.util.module_from_spec(spec)
sys.modules["k"] = k; spec.loader.exec_module(k)
print(k.x_macro_header(None if os.environ["HARNESS_BF16"] == "all" else k.bf16_representatives()))
PYEOF
    "$PY" native/tests/gen_harness_table.py "$ISA" "$ARCH" "$gen/harness_$ISA.h" > /dev/null
    # shellcheck disable=SC2086
    $CC $FLAGS -I"$gen" -Inative/src -DHARNESS_ISA="$ISA" -DHARNESS_TABLE="\"harness_$ISA.h\"" \
        native/tests/harness.c native/src/isa_scalar.c "native/src/isa_$ISA.c" native/src/ma_runtime.c \
        native/src/ma_pool.c -pthread -lm -o "$gen/harness"
    mv "$gen/harness" "$OUT"
    rm -rf "$gen"
}

up_to_date() {
    [ -x "$OUT" ] && [ -z "$(find native/src native/tests native/kernels.py multiact/_opdefs.py multiact/optable.py scripts/test_native_harness.sh -newer "$OUT" \
        -type f -print -quit)" ]
}
(
    if command -v flock >/dev/null; then flock 9; fi
    if up_to_date; then echo "harness $ISA: $OUT is up to date"; else build; fi
) 9> "$DIR/lock"
"$@" "./$OUT"
