#!/usr/bin/env bash
# Build and run bench.c: the avx2 kernels of this checkout ("new") and of git revision OLD (default main) under
# renamed symbols ("old").   benchmarks/bias_act_c/run.sh [ROUNDS] [ACTS]   (env: HALF=1, SHORT=1, ROWS, REPS)
set -euo pipefail
cd "$(dirname "$0")/../.."
OLD=${OLD:-main}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
ACTS="relu leaky_relu gelu gelu_tanh silu sigmoid"
python3 - "$T" $ACTS <<'PYEOF'
import importlib.util, sys
spec = importlib.util.spec_from_file_location("k", "native/kernels.py"); k = importlib.util.module_from_spec(spec)
sys.modules["k"] = k; spec.loader.exec_module(k)
t, acts = sys.argv[1], sys.argv[2:]
bias = ["bias_act_" + a for a in acts] + ["bias_act_" + a + "_grad" for a in acts]
open(f"{t}/ma_kernel_list.h", "w").write(k.x_macro_header(frozenset(acts + bias), frozenset(acts + bias)))
open(f"{t}/ma_kernel_decls.h", "w").write(k.declarations())
open(f"{t}/ma_isa_list.h", "w").write(k.isa_header())
with open(f"{t}/syms", "w") as f:
    for dt in ("f32", "f16"):
        for a in acts:
            f.write(f"ma_{dt}_bias_act_{a}__avx2 old_ma_{dt}_bias_act_{a}__avx2\n")
PYEOF
F="-O3 -std=gnu11 -ffp-contract=off -fno-math-errno -pthread -I$T"
mkdir -p "$T/old"
git archive "$OLD" native/src | tar -x -C "$T/old"
gcc $F -Inative/src -c native/src/isa_avx2.c -o "$T/new.o" &
gcc $F -I"$T/old/native/src" -c "$T/old/native/src/isa_avx2.c" -o "$T/old.o"
wait
objcopy --redefine-syms="$T/syms" "$T/old.o"
objcopy $(nm "$T/old.o" | awk '$2=="T" && $3 !~ /^old_/ {print "--localize-symbol=" $3}') "$T/old.o"
for f in isa_scalar ma_runtime ma_pool; do gcc $F -Inative/src -c native/src/$f.c -o "$T/$f.o"; done
gcc $F -Inative/src -c benchmarks/bias_act_c/bench.c -o "$T/bench.o"
gcc -pthread "$T"/*.o -o "$T/bench" -lm
uptime
"$T/bench" "${1:-9}" ${2:-}
