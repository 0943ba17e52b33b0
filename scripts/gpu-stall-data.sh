#!/usr/bin/env bash
# Data for the replay stall model (issue 10): the dynamic workloads' traces captured under native (`gmlake capture`),
# the paper design's timed runs of two of them, and the micro benchmark at 1,000,000 iterations. One device call.
# The device tool returns at most 8 files, so everything is packed into $OUT/stall.tar.gz at the end.
#   PAPER="bert cnn vit t5" CAPTURE="vit t5 bert cnn" scripts/gpu-stall-data.sh   (native timings: a speed-suite run)
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=
FINAL=${OUT:-/tmp/gmlake-out}
OUT=$(mktemp -d)
mkdir -p "$FINAL"
trap 'tar -czf "$FINAL/stall.tar.gz" -C "$OUT" . && echo "packed $(ls "$OUT" | wc -l) files into stall.tar.gz"' EXIT
cd "$(dirname "$0")/.."
if ! python3 -c "import gmlake._allocator" 2>/dev/null; then
  python3 -m pip install --no-build-isolation --no-deps -e . >"$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
fi
echo "built at $SECONDS s"
timeout 90 python3 bench/micro.py --driver cuda --iterations 1000000 --out "$OUT/micro-h200.json" >"$OUT/micro.log" 2>&1
echo "micro: exit $? at $SECONDS s"; head -7 "$OUT/micro.log"
W=bench/workloads/dynamic.py
for w in ${PAPER:-bert cnn vit t5}; do
  timeout 90 python3 -m gmlake run --policy gmlake-paper $W --workload "$w" --steps 60 --json "$OUT/$w-paper.json" \
    >"$OUT/$w-paper.log" 2>&1
  echo "paper $w: exit $? at $SECONDS s"
done
for w in ${CAPTURE:-vit t5 bert cnn}; do
  timeout 90 python3 -m gmlake capture -o "$OUT/$w-native.pickle.gz" -- python3 $W --workload "$w" --steps 60 \
    --json "$OUT/$w-capture.json" >"$OUT/$w-capture.log" 2>&1
  echo "capture $w: exit $? at $SECONDS s"
done
