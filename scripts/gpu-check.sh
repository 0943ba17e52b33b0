#!/usr/bin/env bash
# The check to run on a machine with an NVIDIA GPU after changing gmlake (the CPU tests are `.venv/bin/pytest`):
# build and install this checkout, the GPU tests, the micro benchmark on the CUDA driver, and torch.empty + del
# latency against PyTorch's allocator in four alternating rounds. About 7 minutes on one H200.
#   scripts/gpu-check.sh [pytest args...]      pytest args replace the default selection of GPU tests
#   FULL=1 scripts/gpu-check.sh                 also the 500-step soak, the threads test and the core GPU tests
#                                               through the CUDA 13.0 entry points (about 3 minutes more)
# Needs: torch with CUDA, Cython and a C++ compiler (the build is --no-build-isolation); transformers and accelerate
# for the Trainer and launcher tests (they skip without). Two GPUs for the DDP tests (they skip on one).
# Results in $OUT (default /tmp/gmlake-out): gpu-tests.log, micro-h200.json, torch-latency-rounds.json, the logs,
# machine.txt. Exit status 0 only if every stage passed. To tell whether a change made the core faster, compare two
# builds with scripts/gpu-ab.sh.
. "$(dirname "$0")/common.sh"
rc=0
if [ $# -eq 0 ]; then
  if [ "${FULL:-0}" = 1 ]; then set -- tests/; else set -- tests/ -k "not soak and not threads"; fi
fi
python3 -m pytest -m gpu -v -p no:cacheprovider "$@" >"$OUT/gpu-tests.log" 2>&1 || rc=1
stamp "GPU tests: $(tail -1 "$OUT/gpu-tests.log")"
if [ "${FULL:-0}" = 1 ]; then      # the default resolves the 12.0 entry points; a CUDA 13 driver serves both
  GMLAKE_CUDA_API_VERSION=13000 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_gpu.py \
    >"$OUT/gpu-tests-13000.log" 2>&1 || rc=1
  stamp "core GPU tests through the 13.0 entry points: $(tail -1 "$OUT/gpu-tests-13000.log")"
fi
python3 -m bench micro --driver cuda --out "$OUT/micro-h200.json" >"$OUT/micro.log" 2>&1 || { rc=1; tail -3 "$OUT/micro.log"; }
python3 -c "import json, sys; print('cache hits ns:', json.load(open(sys.argv[1]))['cache_hit_ns'])" \
  "$OUT/micro-h200.json" 2>/dev/null
stamp "micro benchmark"
python3 -m bench latency --rounds 4 --out "$OUT/torch-latency-rounds.json" >"$OUT/latency.log" 2>&1 \
  || { rc=1; tail -1 "$OUT/latency.log"; }
tail -3 "$OUT/latency.log"    # per size: the ratio, the range the runs allow and the verdict on the 1.1 goal
stamp "done, exit status $rc"
exit $rc
