#!/usr/bin/env bash
# The core GPU tests through the CUDA 12.0 and the CUDA 13.0 driver entry points, on one GPU machine (device tool).
#   scripts/gpu-cuda-majors.sh [pytest args...]          logs in $OUT (default /tmp/gmlake-out)
#
# gmlake resolves its driver entry points from libcuda at run time, for CUDA 12000 by default, so one in-place build
# serves both majors. A CUDA 13 driver (580 and later) still serves the 12.0 entry points to CUDA 12 programs, so
# running once with GMLAKE_CUDA_API_VERSION=12000 and once with 13000 runs gmlake's CUDA 12 and CUDA 13 code paths
# against the real driver. No registry is needed: the build uses the Cython and compiler already there.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gmlake-out}
mkdir -p "$OUT"
LOG="$OUT/gpu-cuda-majors.log"
cd "$(dirname "$0")/.."
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c 'import sys, Cython; print("python", sys.version.split()[0], "Cython", Cython.__version__)'
  python3 -c 'import torch; print("torch", torch.__version__, "built for CUDA", torch.version.cuda)'
} 2>&1 | tee "$LOG"
if ! python3 setup.py build_ext --inplace >"$OUT/build.log" 2>&1; then
  tail -40 "$OUT/build.log" | tee -a "$LOG"; exit 1
fi
rc=0
# The build links nothing of CUDA's and drives the stand-in CUDA 12 and 13 drivers (as CI does).
python3 -m pytest -q -p no:cacheprovider tests/test_cuda_build.py 2>&1 | tail -3 | tee -a "$LOG"
[ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
for api in 12000 13000; do
  echo "=== GMLAKE_CUDA_API_VERSION=$api" | tee -a "$LOG"
  GMLAKE_CUDA_API_VERSION=$api python3 - <<EOF 2>&1 | tee -a "$LOG"
import gmlake
drv = gmlake.cuda_driver(0)
assert drv.api_version == $api, drv.api_version
print(f"gmlake sees CUDA driver {drv.driver_version} (CUDA {drv.driver_version // 1000}.{drv.driver_version % 1000 // 10});"
      f" entry points for {drv.api_version}; granularity {drv.granularity}; capacity {drv.capacity}")
EOF
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
  GMLAKE_CUDA_API_VERSION=$api python3 -m pytest -m gpu -q -rs -p no:cacheprovider tests/test_gpu.py "$@" 2>&1 \
    | tee "$OUT/test_gpu-$api.log" | tail -5 | tee -a "$LOG"
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
done
echo "exit status $rc" | tee -a "$LOG"
exit $rc
