#!/usr/bin/env bash
# FSDP traces for replay (issue 10: FSDP's utilization is 0.72 under the default, 0.976 under the paper's design).
# On a 2-GPU machine (the device tool's nvidia-h200-x2), in one call: the FSDP workload under PyTorch's native
# allocator, every rank's allocator events recorded from before the model is built, each converted to a .gmtrace and
# replayed under the policies that differ in how streams share blocks; all packed into $OUT/fsdp-traces.tar.
#   STEPS=24 scripts/gpu-fsdp-trace.sh          (SKIP_BUILD=1 to reuse a build)
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTORCH_CUDA_ALLOC_CONF=
export GMLAKE_CUDA_INCLUDE=${GMLAKE_CUDA_INCLUDE:-/usr/local/cuda/include}
OUT=${OUT:-/tmp/gmlake-out}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
START=$SECONDS
if [ "${SKIP_BUILD:-0}" != 1 ] && \
   ! python3 -m pip install --no-build-isolation --no-deps -e . >"$OUT/build.log" 2>&1; then
  tail -40 "$OUT/build.log"; exit 1
fi
echo "built in $((SECONDS - START)) s"
work=$(mktemp -d)
python3 -m torch.distributed.run --nproc-per-node 2 bench/workloads/fsdp_train.py --model opt-1.3b \
  --steps "${STEPS:-24}" --snapshot "$work/fsdp-native.pickle.gz" --json "$work/fsdp-native.json" \
  >"$work/fsdp.log" 2>&1 || { tail -30 "$work/fsdp.log"; exit 1; }
echo "captured at $((SECONDS - START)) s"
rc=0
for snap in "$work"/*.pickle.gz; do
  python3 -m gmlake convert "$snap" -o "${snap%.pickle.gz}.gmtrace" || rc=1
done
python3 -m gmlake compare "$work"/*.gmtrace --policy caching --policy expandable --policy gmlake \
  --policy 'gmlake[cross_stream=false]' --policy gmlake-paper --out "$work/compare" >"$work/compare.txt" 2>&1 || rc=1
tail -n 40 "$work/compare.txt"
(cd "$work" && tar -cf "$OUT/fsdp-traces.tar" ./*.gmtrace ./*.json ./*.log ./compare.txt ./compare)
echo "done at $((SECONDS - START)) s, exit $rc"
exit $rc
