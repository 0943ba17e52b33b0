"""table.txt from compare.jsonl: per trace and policy, peak reserved, utilization, priced driver time against the
expandable model's, and stitches.

    python bench/results/sim-2026-12-01-fine-pages/table.py bench/results/sim-2026-12-01-fine-pages/compare.jsonl
"""
import json
import sys
from collections import defaultdict

with open(sys.argv[1]) as f:
    rows = [json.loads(line) for line in f]
by_trace = defaultdict(dict)
for row in rows:
    by_trace[row["trace"]][row["policy_spec"]] = row
for trace, policies in by_trace.items():
    expandable = policies.get("expandable")
    print(trace)
    for spec, r in policies.items():
        ratio = r["driver_seconds"] / expandable["driver_seconds"] if expandable else float("nan")
        print(f"   {spec:32} reserved {r['peak_reserved'] / 2**30:7.3f} GiB  util {r['utilization']:.4f}  "
              f"driver {r['driver_seconds']:.3f} s ({ratio:4.1f}x exp)  stitches {r['stitches']}")
