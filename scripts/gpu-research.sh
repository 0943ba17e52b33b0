#!/usr/bin/env bash
# Two GPU checks that replay predicted on the CPU, in one device-tool call (about 3 minutes after the build):
#  1. issue 13's worked example on the GPU: `gmlake run --policy examples/research/tlsf.py:TLSFPlacement` on the
#     BERT dynamic-padding workload; replay of its trace (bench/results/train/stall-2026-11-30/bert-native.pickle.gz)
#     predicts a peak reserved of 27.227 GiB (docs/research.md);
#  2. issue 10's long run: 1,000 steps of the ViT workload (image size drawn per step) under the default policy; the
#     goal is a bounded sBlock cache, no eviction storm, and driver time after warm-up <= 0.5 % of step time.
# Results in $OUT: tlsf-bert.json, vit-1000.json (dynamic.py's summaries) and research.log.
set -uo pipefail
TOTAL=${TOTAL:-560}
. "$(dirname "$0")/gpu-common.sh"
W=bench/workloads/dynamic.py
python3 -m gmlake run --policy examples/research/tlsf.py:TLSFPlacement $W --workload bert --steps 60 \
  --json "$OUT/tlsf-bert.json" >"$OUT/research.log" 2>&1
echo "tlsf on bert: exit $? at $((SECONDS - START)) s"
timeout $((DEADLINE - (SECONDS - START))) python3 -m gmlake run $W --workload vit --steps 1000 \
  --json "$OUT/vit-1000.json" >>"$OUT/research.log" 2>&1
echo "vit 1000 steps: exit $? at $((SECONDS - START)) s"
python3 - "$OUT" <<'PY'
import json, sys
from pathlib import Path
from gmlake.replay import driver_seconds
out = Path(sys.argv[1])
if (out / "tlsf-bert.json").exists():
    r = json.loads((out / "tlsf-bert.json").read_text())
    print(f"TLSF on BERT: GPU peak reserved {r['max_memory_reserved'] / 2**30:.3f} GiB, replay predicted 27.227")
if (out / "vit-1000.json").exists():
    r = json.loads((out / "vit-1000.json").read_text())
    after = r["gmlake_after_warmup"]
    share = driver_seconds(after) / r["timed_s"]
    print(f"ViT 1000 steps: {after['stitches']} stitches, {after['driver_calls']} driver calls, "
          f"{after['sblock_evictions']} evictions after warm-up; {after['cached_sblocks']} cached sBlocks; "
          f"priced driver time {share:.3%} of step time")
PY
