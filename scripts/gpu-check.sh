#!/usr/bin/env bash
# Build, test and benchmark on the GPU machine in one call (the device tool): results land in $OUT.
#   scripts/gpu-check.sh [pytest args...]
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gmlake-out}
mkdir -p "$OUT"
LOG="$OUT/gpu-check.log"
# The GPU machine has no registry: build with the Cython there (the build needs nothing of CUDA).
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c 'import torch, Cython; print("torch", torch.__version__, "Cython", Cython.__version__)'
} 2>&1 | tee "$LOG"
if ! python3 -m pip install --no-build-isolation --no-deps -e . >"$OUT/build.log" 2>&1; then
  tail -40 "$OUT/build.log"; exit 1
fi
rc=0
if ! python3 -m pytest -m gpu -v -p no:cacheprovider tests/ "$@" 2>&1 | tee -a "$LOG" | tail -25; then
  rc=1
fi
python3 -m pytest -q -p no:cacheprovider tests/ 2>&1 | tail -4 | tee -a "$LOG"
python3 bench/micro.py --driver cuda --out "$OUT/micro-h200.json" 2>&1 | tee -a "$LOG"
exit $rc
