#!/usr/bin/env bash
# At the edge of memory on one GPU: the core's GPU tests (EDGE_TESTS, a pytest -k expression; "all" for every GPU
# test, "none" for none), the price of re-backing's copies (bench._bench.time_driver_calls over 512 MiB of 2 MiB
# handles, three times), then `python -m bench cap edge-time` with the arguments given (step time at 1.02x and 1.05x
# the peak allocated, gmlake against expandable segments, interleaved).
#   SKIP_BUILD=1 EDGE_TESTS=reback scripts/gpu-edge.sh --workloads opt1.3b-lora-ckpt --kinds cap --deadline 300
# Results in $OUT: machine.txt, gpu-tests.log, copy-price.json, edge-time/ (edge-time.json, probes/), edge-time.log;
# with PACK_OUT=1, all of it in $OUT/results.tgz (scripts/common.sh).
. "$(dirname "$0")/common.sh"
TESTS=${EDGE_TESTS:-all}
if [ "$TESTS" != none ]; then
  K=(); [ "$TESTS" != all ] && K=(-k "$TESTS")
  timeout "${TEST_BUDGET:-240}" python3 -m pytest -q -m gpu "${K[@]}" tests >"$OUT/gpu-tests.log" 2>&1
  stamp "GPU tests: $(tail -1 "$OUT/gpu-tests.log")"
fi
python3 - >"$OUT/copy-price.json" 2>&1 <<'PY'
import json
from bench.native import load; time_driver_calls = load().time_driver_calls
from gmlake.drivers._cuda_driver import CudaDriver
runs = [time_driver_calls(CudaDriver(0), 2 << 20, 256) for _ in range(3)]
print(json.dumps({"runs": runs}, indent=1))
PY
stamp "copy price: $(grep -o '"copy_[a-z]*_per_mib": [0-9.]*' "$OUT/copy-price.json" | tr '\n' ' ')"
[ $# -eq 0 ] && exit 0
python3 -m bench cap edge-time --out "$OUT/edge-time" "$@" 2>&1 | tee "$OUT/edge-time.log"
rc=${PIPESTATUS[0]}
stamp "edge-time done, exit status $rc"
exit "$rc"
