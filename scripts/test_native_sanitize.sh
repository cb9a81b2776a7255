#!/usr/bin/env bash
# The C harness (every kernel of the host's SIMD ISA and the scalar path) built with
# AddressSanitizer and UndefinedBehaviorSanitizer; any report fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."
case "$(uname -m)" in aarch64|arm64) ISA=neon ;; *) ISA=avx2 ;; esac
export HARNESS_CFLAGS="-O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=all"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
scripts/test_native_harness.sh "$ISA" gcc
