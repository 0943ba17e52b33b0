import json, sys
from collections import defaultdict
rows = [json.loads(l) for l in open(sys.argv[1])]
by = defaultdict(dict)
for r in rows:
    by[r["trace"]][r["policy_spec"]] = r
for trace, pols in by.items():
    exp = pols.get("expandable")
    print(trace)
    for spec, r in pols.items():
        ratio = r["driver_seconds"] / exp["driver_seconds"] if exp and exp["driver_seconds"] else float("nan")
        print(f"   {spec:32} reserved {r['peak_reserved']/2**30:7.3f} GiB  util {r['utilization']:.4f}  "
              f"driver {r['driver_seconds']:.3f} s ({ratio:4.1f}x exp)  stitches {r['stitches']}")
