# Sourced by the device-tool scripts that build gmlake and then run a suite against a deadline (gpu-speed.sh,
# gpu-cap.sh): sets OUT, START, DEADLINE (seconds left for the suite, out of TOTAL) and writes machine.txt.
#   TOTAL=530 PACK_S=15 . scripts/gpu-common.sh
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gmlake-out}
mkdir -p "$OUT"
START=$SECONDS
TOTAL=${TOTAL:-530}                     # seconds for the whole call, build included (the device tool stops at 600)
PACK_S=${PACK_S:-15}                    # kept for packing the results after the suite's deadline
export GMLAKE_CUDA_INCLUDE=${GMLAKE_CUDA_INCLUDE:-/usr/local/cuda/include}
export NCCL_NVLS_ENABLE=0               # nothing here uses NCCL, but leave NVLink multicast off all the same
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader | tee "$OUT/machine.txt"
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" \
  | tee -a "$OUT/machine.txt"
if [ "${SKIP_BUILD:-0}" != 1 ] && ! python3 -m pip install --no-build-isolation --no-deps -e . >"$OUT/build.log" 2>&1; then
  tail -40 "$OUT/build.log"; exit 1
fi
BUILT=$((SECONDS - START))
DEADLINE=$((TOTAL - BUILT - PACK_S))
echo "built in $BUILT s; suite deadline $DEADLINE s"
if [ "$DEADLINE" -lt 30 ]; then    # a negative `timeout` would fail at once, and the call's device time is spent
  echo "TOTAL=$TOTAL leaves $DEADLINE s after the build ($BUILT s) and packing ($PACK_S s): give a larger TOTAL" >&2
  exit 2
fi
