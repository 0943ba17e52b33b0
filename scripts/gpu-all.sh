#!/usr/bin/env bash
# Every GPU check in one device-tool call: build, the core GPU tests through the CUDA 12.0 and 13.0 entry points,
# every other GPU test (torch bridge, memory API, GMLAKE=1 launchers, HF Trainer), then the micro benchmark.
#   scripts/gpu-all.sh [pytest -k expression]          logs in $OUT (default /tmp/gmlake-out)
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gmlake-out}
mkdir -p "$OUT"
LOG="$OUT/gpu-all.log"
cd "$(dirname "$0")/.."
START=$SECONDS
stamp() { echo "[$((SECONDS - START)) s] $*" | tee -a "$LOG"; }
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c 'import sys, Cython, torch; print("python", sys.version.split()[0], "Cython", Cython.__version__, "torch", torch.__version__)'
  git log --oneline -1 2>/dev/null
} 2>&1 | tee "$LOG"
if ! python3 -m pip install --no-build-isolation --no-deps -e . >"$OUT/build.log" 2>&1; then
  tail -40 "$OUT/build.log" | tee -a "$LOG"; exit 1
fi
stamp "built"
rc=0
python3 -m pytest -q -rf -p no:cacheprovider tests/test_cuda_build.py 2>&1 | tee "$OUT/cuda-build.log" | tail -4 | tee -a "$LOG"
[ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
for api in 13000 12000; do
  GMLAKE_CUDA_API_VERSION=$api python3 -m pytest -m gpu -q -rs -p no:cacheprovider tests/test_gpu.py 2>&1 \
    | tee "$OUT/test_gpu-$api.log" | tail -3 | sed "s/^/api $api: /" | tee -a "$LOG"
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
  stamp "core GPU tests, entry points for $api"
done
timeout 420 python3 -m pytest -m gpu -q -rs -p no:cacheprovider tests/ --ignore=tests/test_gpu.py \
  -k "${1:-not soak and not threads}" 2>&1 | tee "$OUT/gpu-tests.log" | tail -25 | tee -a "$LOG"
[ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
stamp "other GPU tests"
timeout $((570 - (SECONDS - START))) python3 bench/micro.py --driver cuda --iterations 200000 \
  --out "$OUT/micro-h200.json" >"$OUT/micro.log" 2>&1
stamp "micro benchmark: exit $?"; tail -30 "$OUT/micro.log" | tee -a "$LOG"
stamp "exit status $rc"
exit $rc
