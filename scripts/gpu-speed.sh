#!/usr/bin/env bash
# The speed suite (issue 10) on one H200, in one device-tool call: build gmlake, then bench/speed_suite.py with a
# deadline, so that the whole call stays under TOTAL seconds (the device tool stops a command at 600).
#   TOTAL=530 WORKLOADS="vit bert t5 cnn" ALLOCATORS="native expandable gmlake gmlake-paper" ROUNDS=2 STEPS=60 \
#     scripts/gpu-speed.sh [more speed_suite args...]
# SKIP_BUILD=1 uses the gmlake already installed (for a smoke test of this script on a machine without CUDA).
# Returns in $OUT (8 files at most come back): machine.txt, build.log, speed.log (the suite's progress and table),
# speed/summary.json (every run without per-step records, and the table's rows) and speed/runs.tar.gz (one JSON per
# run, per-step times included).
set -uo pipefail
TOTAL=${TOTAL:-530}
. "$(dirname "$0")/gpu-common.sh"
# shellcheck disable=SC2086  # the word lists split on purpose
CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} timeout $((DEADLINE + 10)) python3 bench/speed_suite.py \
  --out "$OUT/speed" --deadline "$DEADLINE" --rounds "${ROUNDS:-2}" --steps "${STEPS:-60}" \
  --workloads ${WORKLOADS:-vit bert t5 cnn} --allocators ${ALLOCATORS:-native expandable gmlake gmlake-paper} "$@" \
  >"$OUT/speed.log" 2>&1
echo "suite: exit $? at $((SECONDS - START)) s"
if [ -d "$OUT/speed/runs" ]; then
  tar -czf "$OUT/speed/runs.tar.gz" -C "$OUT/speed" runs && rm -rf "$OUT/speed/runs"
fi
grep -E "^(== |   FAILED|deadline|skipping|suite:)" "$OUT/speed.log" | tail -50 | cut -c1-200
sed -n '/^time = sum/,$p' "$OUT/speed.log"
