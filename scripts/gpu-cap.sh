#!/usr/bin/env bash
# The cap search (issue 10, "under a cap") on one H200, in one device-tool call: build gmlake, then
# bench/cap_search.py with a deadline, so that the whole call stays under TOTAL seconds (the device tool stops a
# command at 600).
#   TOTAL=540 WORKLOADS="vit bert t5 cnn" ALLOCATORS="expandable gmlake" STEPS=20 RESOLUTION=0.01 \
#     scripts/gpu-cap.sh [more cap_search args, e.g. --bounds-from bench/results/train/speed-.../summary.json]
# SKIP_BUILD=1 uses the gmlake already installed (for a smoke test of this script on a machine without CUDA).
# Returns in $OUT (8 files at most come back): machine.txt, build.log, cap.log (the search's progress and table),
# cap/cap.json (environment, every probe, every pair's outcome) and cap/probes.tar.gz (dynamic.py's summary of
# each probe, per-step times included).
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gmlake-out}
mkdir -p "$OUT"
START=$SECONDS
TOTAL=${TOTAL:-540}                     # seconds for the whole call, build included
PACK_S=15                               # kept for packing the results after the search's deadline
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
echo "built in $BUILT s; search deadline $DEADLINE s"
# shellcheck disable=SC2086  # the word lists split on purpose
CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} timeout $((DEADLINE + 10)) python3 bench/cap_search.py \
  --out "$OUT/cap" --deadline "$DEADLINE" --steps "${STEPS:-20}" --resolution "${RESOLUTION:-0.01}" \
  --workloads ${WORKLOADS:-vit bert t5 cnn} --allocators ${ALLOCATORS:-expandable gmlake} "$@" \
  >"$OUT/cap.log" 2>&1
echo "search: exit $? at $((SECONDS - START)) s"
if [ -d "$OUT/cap/probes" ]; then
  tar -czf "$OUT/cap/probes.tar.gz" -C "$OUT/cap" probes && rm -rf "$OUT/cap/probes"
fi
grep -E "^(== |   (fit|OOM|ERROR)|deadline|cap search:|cap_search.py:)" "$OUT/cap.log" | tail -80 | cut -c1-200
sed -n '/smallest memory fraction/,$p' "$OUT/cap.log"
