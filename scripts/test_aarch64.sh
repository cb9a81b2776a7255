#!/usr/bin/env bash
# The package and its native tests on arm64 under emulation: an arm64 Debian root made with
# debootstrap and qemu-user-static, the extension built there (the NEON build of
# multiact._native, with Debian's python3, numpy, cffi and pytest), and the native tests run by
# pytest inside it.  Needs root and a Debian mirror; about 15 minutes and 1 GB.  Cleans up its mounts and the
# binfmt entry it registered.  ROOT_DIR (default /tmp/multiact-arm64) is kept for reruns.
#   scripts/test_aarch64.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=${ROOT_DIR:-/tmp/multiact-arm64}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
command -v debootstrap >/dev/null && command -v qemu-aarch64-static >/dev/null || {
    apt-get update -qq && apt-get install -y -qq debootstrap qemu-user-static >/dev/null; }

registered_here=0; mounted_bfm=0
cleanup() {
    umount "$ROOT/proc" 2>/dev/null || true
    umount "$ROOT/work" 2>/dev/null || true
    if [ "$registered_here" = 1 ]; then echo -1 > /proc/sys/fs/binfmt_misc/qemu-aarch64 || true; fi
    if [ "$mounted_bfm" = 1 ]; then umount /proc/sys/fs/binfmt_misc || true; fi
}
trap cleanup EXIT
if [ ! -e /proc/sys/fs/binfmt_misc/register ]; then
    mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc; mounted_bfm=1
fi
if [ ! -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ]; then
    # the entry from qemu-user-static, with F (fix binary) so the chroot needs no copy of qemu
    grep -v '^#' /usr/lib/binfmt.d/qemu-aarch64.conf | head -1 > /proc/sys/fs/binfmt_misc/register
    registered_here=1
fi
if [ ! -e "$ROOT/.multiact-ready" ]; then
    [ -x "$ROOT/usr/bin/apt-get" ] || {
        debootstrap --arch=arm64 --foreign --variant=minbase bookworm "$ROOT" "$MIRROR"
        chroot "$ROOT" /debootstrap/debootstrap --second-stage; }
    mount -t proc proc "$ROOT/proc"
    chroot "$ROOT" apt-get update -qq
    chroot "$ROOT" apt-get install -y -qq python3 python3-dev python3-numpy python3-cffi python3-pytest \
        python3-setuptools gcc >/dev/null
    umount "$ROOT/proc"
    touch "$ROOT/.multiact-ready"
fi
mount -t proc proc "$ROOT/proc"
rm -rf "$ROOT/src" && mkdir -p "$ROOT/src"
git ls-files -z --cached --others --exclude-standard | tar --null -T - -cf - | tar -xf - -C "$ROOT/src"
chroot "$ROOT" /bin/sh -c "cd /src && python3 setup.py -q build_ext --inplace >/dev/null && uname -m && \
    python3 -c 'import multiact as ma; print([b for b in ma.backends() if b.name == \"native\"])' && \
    MULTIACT_TEST_BACKENDS=native python3 -m pytest -q -p no:cacheprovider tests/test_native_kernels.py \
    tests/test_consistency.py ${*:-}"
