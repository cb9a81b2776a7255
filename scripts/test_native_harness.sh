#!/usr/bin/env bash
# Build native/tests/harness.c for one ISA and run it: every kernel against the scalar path.
#   scripts/test_native_harness.sh [ISA] [CC] [RUNNER...]   (default: avx2 gcc, run directly)
# Extra compiler flags come from HARNESS_CFLAGS (e.g. -fsanitize=address,undefined).
set -euo pipefail
cd "$(dirname "$0")/.."
ISA=${1:-avx2}
CC=${2:-gcc}
shift $(( $# > 2 ? 2 : $# ))
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
case $ISA in neon) ARCH=aarch64 ;; *) ARCH=x86_64 ;; esac
mkdir -p native/_build
"$PY" - "$ARCH" > native/_build/ma_kernel_decls.h <<'PYEOF'
import importlib.util, sys
spec = importlib.util.spec_from_file_location("k", "native/kernels.py"); k = importlib.util.module_from_spec(spec)
sys.modules["k"] = k; spec.loader.exec_module(k)
print(k.declarations(sys.argv[1]))
PYEOF
"$PY" - > native/_build/ma_kernel_list.h <<'PYEOF'
import importlib.util, sys
spec = importlib.util.spec_from_file_location("k", "native/kernels.py"); k = importlib.util.module_from_spec(spec)
sys.modules["k"] = k; spec.loader.exec_module(k)
print(k.x_macro_header())
PYEOF
"$PY" native/tests/gen_harness_table.py "$ISA" "$ARCH" > /dev/null
OUT=native/_build/harness_${ISA}_$(basename "$CC")
STATIC=$([ "$ISA" = neon ] && echo -static || true)
$CC -O2 -std=gnu11 -ffp-contract=off -fno-math-errno -Wall -Wno-unknown-pragmas $STATIC ${HARNESS_CFLAGS:-} \
    -Inative/src -Inative/_build -DHARNESS_ISA="$ISA" -DHARNESS_TABLE="\"harness_$ISA.h\"" \
    native/tests/harness.c native/src/isa_scalar.c "native/src/isa_$ISA.c" native/src/ma_runtime.c native/src/ma_pool.c \
    -pthread -lm -o "$OUT"
"$@" "./$OUT"
