#!/usr/bin/env bash
# DeepSpeed ZeRO-2 and ZeRO-3, optimizer offloaded to the CPU, on one GPU under native, expandable segments and
# gmlake, interleaved (`python -m bench deepspeed`), inside one device command (BUDGET seconds, default 560).
#   scripts/gpu-deepspeed.sh [bench deepspeed args...]
# Needs .whl/ at the root (carried; never committed): DeepSpeed's sdist (deepspeed-*.tar.gz: PyPI has no wheel of
# it) and the wheels of what it imports that the image lacks (hjson, pydantic, pydantic-core, annotated-types,
# typing-inspection, typing-extensions), all installed into /tmp/site. DeepSpeed, then its CPU Adam (a JIT build:
# ninja, a C++ compiler, Python's headers), are installed and built in the background while gmlake builds.
# Results in $OUT: machine.txt, build.log (gmlake), install.log (deepspeed, CPU Adam), suite.log, summary.json,
# runs.tgz (each run's JSON and output). Exit status: the suite's (0: every run passed).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-/tmp/gmlake-out}
BUDGET=${BUDGET:-560}        # the device's 10-minute limit on a command, less the copy-out and a margin
RESULTS=/tmp/gmlake-deepspeed
mkdir -p "$OUT"
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} PATH=/tmp/site/bin:$PATH DS_BUILD_OPS=0
export TORCH_EXTENSIONS_DIR=/tmp/torch_extensions MAX_JOBS=${MAX_JOBS:-16}
ls .whl/deepspeed-*.tar.gz >/dev/null 2>&1 || { echo "gpu-deepspeed.sh: no .whl/deepspeed-*.tar.gz (carry .whl)" >&2; exit 2; }
(
  set -e
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  # --upgrade: replace /tmp/site/bin, so that DeepSpeed's launcher script lands there
  python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir --upgrade --target /tmp/site \
    .whl/deepspeed-*.tar.gz
  echo "deepspeed $(python3 -c 'import deepspeed; print(deepspeed.__version__)' 2>/dev/null | tail -1) installed at $SECONDS s"
  python3 -m bench.workloads.deepspeed_train --preflight       # builds CPU Adam into TORCH_EXTENSIONS_DIR
  echo "CPU Adam ready at $SECONDS s"
) >"$OUT/install.log" 2>&1 &
INSTALL=$!
. scripts/common.sh              # machine.txt; gmlake built and installed (build.log), in parallel with the above
wait "$INSTALL" || { tail -25 "$OUT/install.log"; echo "gpu-deepspeed.sh: deepspeed's install or CPU Adam build failed (install.log)"; }
stamp "$(tail -1 "$OUT/install.log")"
LEFT=$((BUDGET - SECONDS)); [ "$LEFT" -gt 60 ] || LEFT=60
python3 -m bench deepspeed --deadline "$LEFT" --out "$RESULTS" "$@" 2>&1 | tee "$OUT/suite.log"
rc=${PIPESTATUS[0]}
cp "$RESULTS/summary.json" "$OUT/" 2>/dev/null
[ -d "$RESULTS/runs" ] && tar czf "$OUT/runs.tgz" -C "$RESULTS" runs
stamp "done, exit status $rc"
exit "$rc"
