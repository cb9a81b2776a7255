#!/usr/bin/env bash
# The one pass of native/src/ma_quant.inc on one ISA against the scalar ISA's (native/tests/quant_harness.c).
#   scripts/test_quant_harness.sh [ISA] [STEP]   ISA: avx2 (default), avx512, neon (aarch64-linux-gnu-gcc, run
#   under qemu-aarch64; apt-get install -y gcc-aarch64-linux-gnu qemu-user); STEP: every STEP-th float32 pattern
#   of the conversion check (default 65537; 1: all 2^32).
set -euo pipefail
cd "$(dirname "$0")/.."
ISA=${1:-avx2}
STEP=${2:-65537}
OUT=native/_build/quant_harness_$ISA
mkdir -p native/_build
CC=gcc
RUN=()
EXTRA=()
if [ "$ISA" = neon ]; then
    CC=aarch64-linux-gnu-gcc
    RUN=(qemu-aarch64 -cpu max)
    EXTRA=(-static)
fi
U=$(echo "$ISA" | tr a-z A-Z)
# the same flags as the extension's units (native/build_native.py)
FLAGS=(-std=gnu11 -ffp-contract=off -fno-math-errno -O3 -Inative/src "${EXTRA[@]}")
printf '#define MA_ISA_%s 1\n#include "ma_quant.inc"\n' "$U" > "$OUT.isa.c"
$CC "${FLAGS[@]}" -c "$OUT.isa.c" -o "$OUT.isa.o"
$CC "${FLAGS[@]}" -c native/src/quant_scalar.c -o "$OUT.scalar.o"
$CC "${FLAGS[@]}" -DISA="$ISA" native/tests/quant_harness.c "$OUT.isa.o" "$OUT.scalar.o" -o "$OUT" -lm
"${RUN[@]}" "./$OUT" "$STEP"
