#!/usr/bin/env bash
# The cuda backend on a real GPU, in one go (< 8 minutes): environment, the consistency suite on
# Numba, CuPy and torch arrays (tests/cuda with MULTIACT_CUDA_REAL=1), then scripts/gpu_bench.py.
# Installs nothing and needs no network: multiact runs from this source tree through PYTHONPATH
# (no native extension needed); numba-cuda, cupy and torch must already be installed.
# Results go to $OUT when set (the device runner), else benchmarks/results/.
set -u
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=${OUT:-$here/benchmarks/results}
py=${PYTHON:-python3}
mkdir -p "$out"
cd "$here" || exit 1
export PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}" MULTIACT_CUDA_REAL=1 PYTHONDONTWRITEBYTECODE=1
unset NUMBA_ENABLE_CUDASIM

{
    date -u
    nvidia-smi -L 2>&1 || true
    $py - <<'EOF'
import importlib, sys
print("python", sys.version.split()[0])
for m in ("numpy", "numba", "numba_cuda", "cupy", "torch"):
    try:
        print(m, importlib.import_module(m).__version__)
    except Exception as e:
        print(m, "not importable:", type(e).__name__, e)
import multiact as ma
for b in ma.backends():
    print(f"backend {b.name}: available={b.available} ({b.reason}) {b.devices}")
EOF
} 2>&1 | tee "$out/gpu-env.txt"

echo "== consistency suite on device arrays ==" | tee "$out/gpu-tests.log"
timeout 330 "$py" -m pytest tests/cuda -q -p no:cacheprovider -rfE --durations=5 \
    --junitxml="$out/gpu-tests.xml" 2>&1 | tee -a "$out/gpu-tests.log" | tail -40
tests_rc=${PIPESTATUS[0]}

echo "== benchmark ==" | tee "$out/gpu-bench.log"
timeout 300 "$py" scripts/gpu_bench.py --out "$out" 2>&1 | tee -a "$out/gpu-bench.log" | tail -70
bench_rc=${PIPESTATUS[0]}

echo "tests exit $tests_rc, bench exit $bench_rc; results in $out" | tee -a "$out/gpu-env.txt"
[ "$tests_rc" = 0 ] && [ "$bench_rc" = 0 ]
