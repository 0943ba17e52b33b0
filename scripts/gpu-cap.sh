#!/usr/bin/env bash
# The cap search (issue 10, "under a cap") on one H200, in one device-tool call: build gmlake, then
# bench/cap_search.py with a deadline, so that the whole call stays under TOTAL seconds (the device tool stops a
# command at 600).
#   TOTAL=540 WORKLOADS="vit bert t5 cnn" ALLOCATORS="expandable gmlake" STEPS=20 RESOLUTION=0.01 \
#     scripts/gpu-cap.sh [more cap_search args, e.g. --bounds-from bench/results/train/speed-.../summary.json]
#   TOTAL=540 WORKLOADS="gpt2xl-lora-ckpt opt1.3b-lora-ckpt opt1.3b-offload" ALLOCATORS="expandable gmlake" \
#     scripts/gpu-cap.sh [--bounds-from bench/results/train/call1-gpu1.json]
#   TOTAL=540 WORKLOADS=opt1.3b-fsdp-lora-ckpt scripts/gpu-cap.sh          # on nvidia-h200-x2: both GPUs
#   TOTAL=540 WORKLOADS="gpt2xl-ckpt gpt2xl-lora" scripts/gpu-cap.sh \
#     --predict gpt2xl-ckpt=bench/results/traces/gpt2xl-ckpt-gmlake.gmtrace \
#               gpt2xl-lora=bench/results/traces/gpt2xl-lora-gmlake.gmtrace   # replay's brackets probed first
#   TOTAL=540 WORKLOADS="vit bert cnn" scripts/gpu-cap.sh --capture    # a trace per workload first, then predicted
#   TOTAL=540 WORKLOADS=opt1.3b-fsdp-lora-ckpt RESOLUTION=0.002 scripts/gpu-cap.sh --capture    # on two GPUs
# WORKLOADS takes speed_suite.py's dynamic-shape workloads (dynamic.py), train_suite.py's single-GPU LLM ones
# (train_hf.py; they need transformers, and peft for LoRA) and its FSDP one (fsdp_train.py under torchrun on every
# visible GPU). The probes see GPU 0 alone unless CUDA_VISIBLE_DEVICES says otherwise, or WORKLOADS holds the FSDP
# workload (then GPUs 0 and 1): one cap search per machine.
# SKIP_BUILD=1 uses the gmlake already installed (for a smoke test of this script on a machine without CUDA).
# Returns in $OUT (8 files at most come back): machine.txt, build.log, cap.log (the search's progress and table),
# cap/cap.json (environment, every probe, every pair's outcome), cap/probes.tar.gz (the workload's summary of
# each probe, per-step times included) and, with --capture, cap/traces.tar.gz (the captured .gmtrace files).
set -uo pipefail
TOTAL=${TOTAL:-540}
. "$(dirname "$0")/gpu-common.sh"
case " ${WORKLOADS:-} " in *fsdp*) GPUS=0,1 ;; *) GPUS=0 ;; esac
# shellcheck disable=SC2086  # the word lists split on purpose
CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-$GPUS} timeout $((DEADLINE + 10)) python3 bench/cap_search.py \
  --out "$OUT/cap" --deadline "$DEADLINE" --steps "${STEPS:-20}" --resolution "${RESOLUTION:-0.01}" \
  --workloads ${WORKLOADS:-vit bert t5 cnn} --allocators ${ALLOCATORS:-expandable gmlake} "$@" \
  >"$OUT/cap.log" 2>&1
echo "search: exit $? at $((SECONDS - START)) s"
for kept in probes traces; do
  if [ -d "$OUT/cap/$kept" ]; then
    tar -czf "$OUT/cap/$kept.tar.gz" -C "$OUT/cap" "$kept" && rm -rf "${OUT:?}/cap/$kept"
  fi
done
grep -E "^(== |   (fit|OOM|ERROR|capture|[0-9]+ trace|settling)|deadline|cap search:|cap_search.py:)" "$OUT/cap.log" | tail -80 | cut -c1-200
sed -n '/smallest memory fraction/,$p' "$OUT/cap.log"
