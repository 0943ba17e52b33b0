#!/usr/bin/env bash
# The training benchmark on a 2-GPU machine (the device tool), in one call: the GPU 0 suite, then the GPU 1 suite,
# then the FSDP workload over both GPUs. One suite at a time: two suites sharing a host's CPUs and PCIe disturb each
# other's step times (native's repeats differed by up to 47 % when they ran side by side, 2026-11-30).
#   GPU0="opt1.3b-lora ..." GPU1="gpt2xl-lora ..." FSDP=1 CHECK=1 scripts/gpu-train.sh [train_suite args...]
# GPU0/GPU1 take workload names (each runs under --allocators) or WORKLOAD:ALLOCATOR pairs; FSDP=1 runs the FSDP
# workload under --allocators, FSDP="alloc ..." under those.
# CHECK=1 first runs the GPU tests and (unless MICRO=0) the micro benchmark on GPU 0.
# Results land in $OUT: train-gpu0.json, train-gpu1.json, train-fsdp.json, and the logs.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gmlake-out}
mkdir -p "$OUT"
START=$SECONDS
DEADLINE=${DEADLINE:-570}               # seconds: the device tool stops a command at 600
left() { echo $((DEADLINE - (SECONDS - START))); }
export GMLAKE_CUDA_INCLUDE=${GMLAKE_CUDA_INCLUDE:-/usr/local/cuda/include}
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader | tee "$OUT/machine.txt"
if ! python3 -m pip install --no-build-isolation --no-deps -e . >"$OUT/build.log" 2>&1; then
  tail -40 "$OUT/build.log"; exit 1
fi
echo "built in $((SECONDS - START)) s"

LOGS=$(mktemp -d)                       # logs come back as one file: the device tool returns 8 files at most
suite() {  # suite GPUS OUTNAME WORKLOADS-or-PAIRS... -- runs until the deadline
  local gpus=$1 name=$2 what=--workloads; shift 2
  case "$1" in *:*) what=--runs ;; esac
  timeout "$(left)" python3 bench/train_suite.py --gpus "$gpus" --out "$OUT/$name.json" "${SUITE_ARGS[@]}" \
    $what "$@" >"$LOGS/$name.log" 2>&1
  echo "$name: exit $? at $((SECONDS - START)) s"
}
SUITE_ARGS=("$@")
if [ -n "${GPU0:-}" ] || [ "${CHECK:-0}" = 1 ]; then
  if [ "${CHECK:-0}" = 1 ]; then
      CUDA_VISIBLE_DEVICES=0 timeout "$(left)" python3 -m pytest -m gpu -p no:cacheprovider -q tests/ \
        -k "${CHECK_K:-not soak and not threads}" >"$LOGS/gpu-tests.log" 2>&1
      echo "gpu tests: exit $? at $((SECONDS - START)) s"; tail -3 "$LOGS/gpu-tests.log"
      if [ "${MICRO:-1}" = 1 ]; then
        CUDA_VISIBLE_DEVICES=0 timeout "$(left)" python3 bench/micro.py --driver cuda --out "$OUT/micro-h200.json" \
          >"$LOGS/micro.log" 2>&1
        echo "micro: exit $? at $((SECONDS - START)) s"
      fi
  fi
  [ -n "${GPU0:-}" ] && suite 0 train-gpu0 $GPU0
fi
if [ -n "${GPU1:-}" ]; then suite 1 train-gpu1 $GPU1; fi
case "${FSDP:-0}" in
  0) ;;
  1) suite 0,1 train-fsdp opt1.3b-fsdp-lora-ckpt ;;
  *) suite 0,1 train-fsdp $(for a in $FSDP; do echo "opt1.3b-fsdp-lora-ckpt:$a"; done) ;;
esac
tail -n +1 "$LOGS"/*.log >"$OUT/logs.txt"
grep -h -A1 "^== " "$LOGS"/train-*.log 2>/dev/null | grep -v "^--" | cut -c1-220
