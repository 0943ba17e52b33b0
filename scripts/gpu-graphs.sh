#!/usr/bin/env bash
# CUDA graphs under gmlake (issue 11), in one device-tool call: build, the graph scenarios
# (tests/gpu_scripts/graph_capture.py), a graph program's trace captured under native and replayed, then a small transformer under torch.compile with and without
# mode="reduce-overhead", native and gmlake, interleaved (A B C D D C B A while time lasts): losses, graph replays,
# peak reserved and step time. Results in $OUT: graphs.log, compile-*.json (one JSON line per run), the trace and
# replay-graphs.jsonl.
set -uo pipefail
TOTAL=${TOTAL:-560}
. "$(dirname "$0")/gpu-common.sh"
S=tests/gpu_scripts
timeout 150 python3 -m gmlake run $S/graph_capture.py >"$OUT/graphs.log" 2>&1
echo "graph scenarios: exit $? at $((SECONDS - START)) s"; grep -E "^(ok|skip|all ok)" "$OUT/graphs.log" | cut -c1-200
tail -5 "$OUT/graphs.log" | grep -v "^ok\|^all ok" | cut -c1-400
# A trace of the reduce-overhead program under PyTorch's own allocator, replayed: does the caching model, with the
# graph pool recognised from the snapshot (Note [Pools in traces]), land within 1 % of the real peak reserved?
timeout 150 python3 -m gmlake capture -o "$OUT/reduce-overhead-native.pickle.gz" -- python3 $S/reduce_overhead.py \
  --steps 20 >>"$OUT/graphs.log" 2>&1
echo "capture: exit $? at $((SECONDS - START)) s"
timeout 120 python3 -m gmlake replay "$OUT/reduce-overhead-native.pickle.gz" --json >"$OUT/replay-graphs.jsonl" 2>>"$OUT/graphs.log"
python3 - "$OUT" <<'PY'
import json, sys
from pathlib import Path
from gmlake.trace import load
out = Path(sys.argv[1])
trace = load(out / "reduce-overhead-native.pickle.gz")
real = trace.meta.get("max_memory_reserved", 0)
pools = {k: len(v) for k, v in trace.meta.get("pools", {}).items()}
print(f"graph trace: {len(trace)} events, pools {pools}, real peak reserved {real / 2**30:.3f} GiB")
for line in (out / "replay-graphs.jsonl").read_text().splitlines():
    r = json.loads(line)
    print(f"  {r['policy']:14} replayed peak reserved {r['peak_reserved'] / 2**30:.3f} GiB "
          f"({r['peak_reserved'] / real - 1:+.2%} against the real run)" if real else r)
PY
ORDER="native:reduce-overhead gmlake:reduce-overhead gmlake:default native:default"
ORDER="$ORDER $(echo $ORDER | tr ' ' '\n' | tac | tr '\n' ' ')"
for run in $ORDER; do
  left=$((DEADLINE - (SECONDS - START)))
  [ "$left" -lt 60 ] && { echo "deadline: skipping $run"; continue; }
  alloc=${run%%:*}; mode=${run#*:}
  if [ "$alloc" = gmlake ]; then cmd=(python3 -m gmlake run $S/reduce_overhead.py); else cmd=(python3 $S/reduce_overhead.py); fi
  timeout "$left" "${cmd[@]}" --mode "$mode" 2>>"$OUT/graphs.log" | tail -1 >>"$OUT/compile-$alloc-$mode.json"
  echo "$run: exit ${PIPESTATUS[0]} at $((SECONDS - START)) s"
done
python3 - "$OUT" <<'PY'
import json, statistics, sys
from pathlib import Path
out = Path(sys.argv[1])
runs = {}
for f in sorted(out.glob("compile-*.json")):
    rows = [json.loads(l) for l in f.read_text().splitlines() if l.startswith("{")]
    if rows:
        runs[f.stem[len("compile-"):]] = rows
for name, rows in runs.items():
    print(f"{name:28} runs {len(rows)} replays {rows[0]['graph_replays']:4} peak reserved "
          f"{max(r['max_memory_reserved'] for r in rows) / 2**30:.3f} GiB, allocated "
          f"{max(r['max_memory_allocated'] for r in rows) / 2**30:.3f} GiB, timed s "
          f"{', '.join(f'{r['timed_s']:.3f}' for r in rows)}")
for mode in ("reduce-overhead", "default"):
    a, b = runs.get(f"native-{mode}"), runs.get(f"gmlake-{mode}")
    if a and b:
        worst = max(abs(x - y) / max(abs(x), 1e-6) for x, y in zip(a[0]["losses"], b[0]["losses"]))
        print(f"{mode}: losses native vs gmlake, worst relative difference {worst:.2e}; time ratio gmlake/native "
              f"{statistics.median(r['timed_s'] for r in b) / statistics.median(r['timed_s'] for r in a):.3f}")
PY
