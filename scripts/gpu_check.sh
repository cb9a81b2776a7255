#!/usr/bin/env bash
# The cuda backend on a real GPU, in one go (< 8 minutes), ending in one results file to commit:
#   1. environment: GPU, versions, `multiact info` (host CPU, SIMD, backends and why);
#   2. tests/cuda and the gated kernels' cuda checks (tests/test_gated_numba_cuda.py: every layout, the
#      clipped form, in place, specials, on Numba device arrays) with MULTIACT_CUDA_REAL=1; tests/cuda on
#      Numba, CuPy and torch arrays: the shared accuracy
#      suite against the float64 reference (every op x case x direction x dtype), sizes, layouts,
#      in place, prelu/swish parameter gradients, errors, and that every kernel the GPU compiled is
#      one CI compiles without a GPU (scripts/cuda_ptx_report.py);
#   3. scripts/gpu_bench.py at 2^24 and 2^28 elements (16M, 256M), float32 and float16, every op
#      forward and backward, against a device-to-device copy and torch's own CUDA ops, as ratios
#      (one process, so each kernel compiles once); then scripts/gpu_bench_bias_act.py at 16M: bias_act
#      (gelu, relu) forward and backward, the transformer's dim=-1 on the rows kernels and forced onto the
#      strided ones (their ratio), NCHW dim=1, against a copy and unfused torch; then
#      scripts/gpu_bench_quant.py at 16M: quant= (silu, swiglu; float8_e4m3fn per token, group of 128,
#      MX and tensor, int8 per token; bfloat16, float16) against a copy and the unfused torch
#      composition (activation, amax, scale, divide, clamp, cast), its codes and scales checked first against
#      ma.quantize of the float32 result;
#   4. the host CPU's AVX-512: when it has AVX-512F and the native build has an avx512 ISA, the native
#      tests forced to it and `multiact bench` avx2 against avx512; otherwise it says which is missing;
#   5. `multiact check --backend cuda` (the user's command for step 2's suite), if time is left.
# Installs nothing and needs no network: multiact runs from this source tree through PYTHONPATH (the
# native extension is built in place if absent, from this tree); numba-cuda, cupy and torch must
# already be installed.  Each step has a time limit drawn from one overall budget.
# Results: $OUT/gpu-check.md (the file to commit), logs under $OUT/gpu-check-raw/; OUT defaults to
# results.  GPU_CHECK_BUDGET (seconds, default 470) sets the budget.
set -u
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=${OUT:-$here/results}
raw=$out/gpu-check-raw
py=${PYTHON:-python3}
deadline=$((SECONDS + ${GPU_CHECK_BUDGET:-470}))
mkdir -p "$raw"
cd "$here" || exit 1
export PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}" MULTIACT_CUDA_REAL=1 PYTHONDONTWRITEBYTECODE=1
unset NUMBA_ENABLE_CUDASIM
declare -A rc
order=()

# limit MAX RESERVE: seconds for the next step, at most MAX, leaving RESERVE for the steps after it
limit() {
    local left=$((deadline - SECONDS - $2))
    ((left > $1)) && left=$1
    ((left < 0)) && left=0
    echo "$left"
}

# step NAME MAX RESERVE CMD...: run CMD under a time limit, log to raw/NAME.log, record its exit status
step() {
    local name=$1 max=$2 reserve=$3 t
    shift 3
    t=$(limit "$max" "$reserve")
    order+=("$name")
    echo "== $name (limit ${t}s) ==" >"$raw/$name.log"
    if ((t < 5)); then
        echo "skipped: out of time" >>"$raw/$name.log"
        rc[$name]=skipped
        cat "$raw/$name.log"
        return
    fi
    timeout "$t" "$@" >>"$raw/$name.log" 2>&1
    rc[$name]=$?
    tail -25 "$raw/$name.log"
}

# 1. environment
{
    date -u
    nvidia-smi -L 2>&1 || echo "nvidia-smi: not available"
    $py - <<'EOF'
import importlib, sys
print("python", sys.version.split()[0])
for m in ("numpy", "numba", "numba_cuda", "cupy", "torch"):
    try:
        print(m, importlib.import_module(m).__version__)
    except Exception as e:
        print(m, "not importable:", type(e).__name__, e)
EOF
} >"$raw/env.log" 2>&1
cat "$raw/env.log"
step info 30 400 "$py" -m multiact info

# 2. the cuda suite on device arrays
step tests 260 150 "$py" -m pytest tests/cuda tests/test_gated_numba_cuda.py -q -p no:cacheprovider -rfE --durations=5 \
    --junitxml="$raw/tests.xml"

# 3. bandwidth, 16M and 256M, in one process
step bench 150 120 "$py" - "$raw" <<'EOF'
import runpy, sys
raw, status = sys.argv[1], 0
for n, name in ((1 << 24, "16M"), (1 << 28, "256M")):
    sys.argv = ["scripts/gpu_bench.py", "--out", f"{raw}/bench-{name}", "--n", str(n)]
    try:
        runpy.run_path("scripts/gpu_bench.py", run_name="__main__")
    except SystemExit as e:
        status = status or (e.code or 0)
    except Exception as e:  # record and go on to the other size
        print(f"bench {name}: {type(e).__name__}: {e}", flush=True)
        status = 1
sys.exit(status)
EOF

step bias_bench 90 60 "$py" scripts/gpu_bench_bias_act.py --out "$raw/bench-bias_act" --n $((1 << 24))

step quant_bench 90 30 "$py" scripts/gpu_bench_quant.py --out "$raw/bench-quant" --n $((1 << 24))

# 4. AVX-512 on the host CPU
step avx512 120 0 bash -s -- "$py" "$raw" <<'EOF'
py=$1 raw=$2
if ! grep -qw avx512f /proc/cpuinfo; then
    echo "host CPU has no AVX-512F: $(grep -m1 'model name' /proc/cpuinfo)"
    exit 0
fi
echo "host CPU has AVX-512: $(grep -o 'avx512[a-z_0-9]*' /proc/cpuinfo | sort -u | tr '\n' ' ')"
if ! "$py" -c "import multiact._native" 2>/dev/null; then
    echo "building the native extension in place"
    "$py" setup.py -q build_ext --inplace || { echo "native build failed"; exit 1; }
fi
isas=$("$py" -c "from multiact import registry; print(' '.join(registry.module('native').info().get('isas') or []))" 2>&1) ||
    { echo "the native backend did not load: $isas"; exit 1; }
echo "native ISAs this CPU runs: ${isas:-none}"
case " $isas " in
    *" avx512 "*) ;;
    *) echo "this build has no avx512 ISA (issue 20): nothing more to check"; exit 0 ;;
esac
MULTIACT_NATIVE_ISA=avx512 "$py" -m pytest tests/test_native_kernels.py -q -p no:cacheprovider -x || exit 1
for isa in avx2 avx512; do
    MULTIACT_NATIVE_ISA=$isa "$py" -m multiact bench --backend native --op gelu,silu,sigmoid,tanh,mish \
        --size 64K --threads 1 --no-progress --json "$raw/bench-native-$isa.json" || exit 1
done
EOF

# 5. the user's accuracy check, with what time is left
step check 120 0 "$py" -m multiact check --backend cuda --no-progress --json "$raw/check-cuda.json"

# the one file to commit
"$py" - "$out" "$raw" "$(for k in "${order[@]}"; do printf '%s=%s ' "$k" "${rc[$k]}"; done)" <<'EOF'
import json, os, sys, xml.etree.ElementTree as ET
out, raw, rcs = sys.argv[1:4]
rc = dict(kv.split("=", 1) for kv in rcs.split())
read = lambda name: open(os.path.join(raw, name)).read() if os.path.exists(os.path.join(raw, name)) else ""
parts = ["# multiact: scripts/gpu_check.sh", "", "exit status per step: " + ", ".join(f"{k} {v}" for k, v in rc.items()),
         "", "## Environment", "", "```", read("env.log").strip(), "```", "", "## multiact info", "", "```",
         read("info.log").strip(), "```", "", "## tests/cuda on device arrays", ""]
if os.path.exists(os.path.join(raw, "tests.xml")):
    s = ET.parse(os.path.join(raw, "tests.xml")).getroot()
    s = s if s.tag == "testsuite" else s[0]
    parts.append(f"{s.get('tests')} tests: {s.get('failures')} failed, {s.get('errors')} errors, "
                 f"{s.get('skipped')} skipped, {float(s.get('time', 0)):.0f} s")
parts += ["", "```", "\n".join(read("tests.log").strip().splitlines()[-30:]), "```", "", "## Bandwidth", ""]
for name in ("16M", "256M"):
    md = read(f"bench-{name}/gpu-bench.md")
    parts += [md.replace("# multiact cuda backend", f"### {name}: multiact cuda backend") if md else
              f"### {name}: no result (see gpu-check-raw/bench.log)", ""]
parts += [read("bench-bias_act/gpu-bench-bias_act.md") or "### bias_act: no result (see gpu-check-raw/bias_bench.log)",
          "", read("bench-quant/gpu-bench-quant.md") or "### quant=: no result (see gpu-check-raw/quant_bench.log)",
          ""]
check = read("check-cuda.json")
parts += ["## AVX-512 on the host CPU", "", "```", read("avx512.log").strip(), "```", "",
          "## multiact check --backend cuda", "",
          ("passed: " + str(json.loads(check).get("passed"))) if check else "no result (see gpu-check-raw/check.log)", ""]
with open(os.path.join(out, "gpu-check.md"), "w") as f:
    f.write("\n".join(parts))
print(f"wrote {os.path.join(out, 'gpu-check.md')}")
EOF

echo "steps: $(for k in "${order[@]}"; do printf '%s=%s ' "$k" "${rc[$k]}"; done); results in $out/gpu-check.md"
for k in "${order[@]}"; do [ "${rc[$k]}" = 0 ] || exit 1; done
