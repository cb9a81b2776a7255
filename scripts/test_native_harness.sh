#!/usr/bin/env bash
# Build native/tests/harness.c for one ISA and run it: every kernel against the scalar path.
#   scripts/test_native_harness.sh [ISA] [CC] [RUNNER...]   (default: avx2 gcc, run directly)
# Extra compiler flags come from HARNESS_CFLAGS (e.g. -fsanitize=address,undefined).
# Each (ISA, compiler, flags) builds in a directory of its own under native/_build, under a lock, and
# is not rebuilt while its binary is newer than every source (the build takes 20-50 s, a run well
# under a second natively): running it under several runners (qemu CPUs, valgrind) builds it once.
set -euo pipefail
cd "$(dirname "$0")/.."
ISA=${1:-avx2}
CC=${2:-gcc}
shift $(( $# > 2 ? 2 : $# ))
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
case $ISA in neon) ARCH=aarch64 ;; *) ARCH=x86_64 ;; esac
STATIC=$([ "$ISA" = neon ] && echo -static || true)
# -O1: the same IEEE semantics as the extension's -O3 (no fast-math, no contraction) at about half -O2's
# compile time (the kernel table is large: ~65 s instead of ~110 s of CPU on Zen 3)
FLAGS="-O1 -std=gnu11 -ffp-contract=off -fno-math-errno -Wall -Wno-unknown-pragmas $STATIC ${HARNESS_CFLAGS:-}"
KEY=$(printf '%s' "$CC $FLAGS" | cksum | cut -d' ' -f1)
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
import importlib.util, sys
spec = importlib.util.spec_from_file_location("k", "native/kernels.py"); k = importlib.util.module_from_spec(spec)
sys.modules["k"] = k; spec.loader.exec_module(k)
print(k.x_macro_header())
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
    [ -x "$OUT" ] && [ -z "$(find native/src native/tests native/kernels.py multiact/ops.py scripts/test_native_harness.sh -newer "$OUT" \
        -type f -print -quit)" ]
}
(
    if command -v flock >/dev/null; then flock 9; fi
    if up_to_date; then echo "harness $ISA: $OUT is up to date"; else build; fi
) 9> "$DIR/lock"
"$@" "./$OUT"
