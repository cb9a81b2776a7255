#!/usr/bin/env bash
# The NEON kernels verified under emulation: build native/tests/harness.c for aarch64 and run it
# under qemu-aarch64 with -cpu max (FP16 arithmetic) and -cpu cortex-a53 (without); every NEON
# kernel is compared with the scalar path and the op's tolerance.  Installs the cross compiler
# and qemu-user with apt-get when they are missing (needs root).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v aarch64-linux-gnu-gcc >/dev/null || ! command -v qemu-aarch64 >/dev/null; then
    SUDO=$([ "$(id -u)" = 0 ] && echo "" || echo sudo)
    $SUDO apt-get update -qq && $SUDO apt-get install -y -qq gcc-aarch64-linux-gnu qemu-user >/dev/null
fi
for cpu in max cortex-a53; do
    echo "qemu-aarch64 -cpu $cpu"
    scripts/test_native_harness.sh neon aarch64-linux-gnu-gcc qemu-aarch64 -cpu "$cpu"
done
