#!/usr/bin/env bash
# The checks a core change must pass on the GPU, in one device-tool call (about 7 minutes): build and install in
# editable mode (GMLAKE=1 needs the installed gmlake_autoload.pth: a build in place alone fails the launcher
# tests), the GPU tests (by default all but the soak and the threads test, ~300 s; pytest arguments replace that
# selection), the micro benchmark on the CUDA driver, and torch.empty + del latency against native in four
# alternating rounds. To tell whether a change made the core faster, scripts/gpu-ab.sh compares two builds.
# The CPU suite is CI's (.ci/run), not this call's.
#   scripts/gpu-check.sh [pytest args...]
# Results in $OUT: gpu-tests.log, micro-h200.json, torch-latency-rounds.json, build.log, machine.txt.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/gmlake-out}
mkdir -p "$OUT"
START=$SECONDS
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c 'import torch, Cython; print("torch", torch.__version__, "Cython", Cython.__version__)'
  git log --oneline -1 2>/dev/null
} 2>&1 | tee "$OUT/machine.txt"
if ! python3 -m pip install --no-build-isolation --no-deps -e . >"$OUT/build.log" 2>&1; then
  tail -40 "$OUT/build.log"; exit 1
fi
echo "built in $((SECONDS - START)) s"
rc=0
[ $# -gt 0 ] || set -- -k "not soak and not threads"
timeout 420 python3 -m pytest -m gpu -v -p no:cacheprovider tests/ "$@" >"$OUT/gpu-tests.log" 2>&1 || rc=1
tail -3 "$OUT/gpu-tests.log"
echo "GPU tests done at $((SECONDS - START)) s"
timeout 90 python3 bench/micro.py --driver cuda --out "$OUT/micro-h200.json" >"$OUT/micro.log" 2>&1 || rc=1
python3 -c "import json, sys; print('cache hits ns:', json.load(open(sys.argv[1]))['cache_hit_ns'])" \
  "$OUT/micro-h200.json" 2>/dev/null
timeout 150 python3 bench/torch_latency.py --rounds 4 --out "$OUT/torch-latency-rounds.json" >"$OUT/latency.log" 2>&1 \
  || { rc=1; tail -1 "$OUT/latency.log"; }
tail -3 "$OUT/latency.log"    # per size: the ratio, the range the runs allow and the verdict on the 1.1 goal
echo "done at $((SECONDS - START)) s"
exit $rc
