#!/usr/bin/env bash
# Capture PyTorch snapshots of training runs under a memory cap, to replay what an allocator did near its limit
# (one device-tool call on one H200). Each RUN is WORKLOAD:ALLOCATOR:FRACTION (FRACTION 0: no cap), with WORKLOAD a
# bench/train_suite.py workload and ALLOCATOR native or expandable (torch's own history) or gmlake (gmlake's):
#   RUNS="gpt2xl-lora-ckpt:expandable:0.0564274 gpt2xl-lora-ckpt:expandable:0" STEPS=20 scripts/gpu-cap-trace.sh
# Returns in $OUT (8 files at most come back): machine.txt, build.log, and per run NAME.tar holding NAME.json
# (train_hf.py's summary), NAME.log and NAME.pickle.gz (the snapshot); NAME = WORKLOAD-ALLOCATOR-FRACTION.
# The batch range is the training suite's (train_suite.MIN_BATCH, MAX_BATCH), so the shapes are the suite's.
set -uo pipefail
TOTAL=${TOTAL:-540}
. "$(dirname "$0")/gpu-common.sh"
[ -n "${RUNS:-}" ] || { echo "gpu-cap-trace.sh: name the runs: RUNS=\"WORKLOAD:ALLOCATOR:FRACTION ...\"" >&2; exit 2; }
for run in $RUNS; do
  IFS=: read -r workload allocator fraction <<<"$run"
  name="$workload-$allocator-$fraction"
  flags=$(python3 -c "import sys; sys.path.insert(0, 'bench'); import train_suite as t
print(' '.join(t.WORKLOADS['$workload']), '--min-batch', t.MIN_BATCH, '--max-batch', t.MAX_BATCH)") || exit 2
  cap=(); [ "$fraction" != 0 ] && cap=(--memory-fraction "$fraction")
  case "$allocator" in
    native) env=(PYTORCH_CUDA_ALLOC_CONF=) ; launch=(python3) ;;
    expandable) env=(PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True) ; launch=(python3) ;;
    *) env=(PYTORCH_CUDA_ALLOC_CONF=) ; launch=(python3 -m gmlake run) ;;
  esac
  dir=/tmp/cap-trace/$name; mkdir -p "$dir"; snap=$dir/$name.pickle.gz
  env "${env[@]}" timeout $((DEADLINE - (SECONDS - START))) "${launch[@]}" bench/workloads/train_hf.py $flags \
    --steps "${STEPS:-20}" --seed 0 --gpu-time-steps 0 "${cap[@]}" --snapshot "$snap" --json "$dir/$name.json" \
    >"$dir/$name.log" 2>&1
  echo "$name: exit $? at $((SECONDS - START)) s"; tail -1 "$dir/$name.log" | cut -c1-300
  tar -cf "$OUT/$name.tar" -C "$dir" . && ls -la "$OUT/$name.tar"
done
