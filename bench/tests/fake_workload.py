"""A stand-in for bench/workloads/dynamic.py in bench speed-ab's tests (no torch): takes the same options, writes
the same summary keys, with step times made up from the shape pool and the gmlake it imported (a test tree's
gmlake/__init__.py may set FAKE_SLOWDOWN)."""
from __future__ import annotations

import argparse
import json

import gmlake

parser = argparse.ArgumentParser()
for option in ("--workload", "--steps", "--warmup", "--shape-pool", "--gpu-time-steps", "--seed", "--device", "--size",
               "--json"):
    parser.add_argument(option)
parser.add_argument("--quiet-gc", action="store_true")
args = parser.parse_args()
steps, warmup, pool = int(args.steps), int(args.warmup), int(args.shape_pool)
slowdown = getattr(gmlake, "FAKE_SLOWDOWN", 1.0)
per_step = [{"batch": 1 + i % pool, "step_s": (0.5 if i < pool else 0.01 * (1 + i % pool)) * slowdown,
             "tokens": 0, "loss": 1.0} for i in range(steps)]
with open(args.json, "w") as f:
    json.dump({"allocator": "cpu", "workload": args.workload, "warmup_steps": warmup, "shape_pool": pool,
               "quiet_gc": args.quiet_gc, "gmlake_file": gmlake.__file__, "config": {}, "per_step": per_step}, f)
