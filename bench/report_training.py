"""Turn bench/results/train*.json into README's table (markdown, on stdout) and a PNG.

    python bench/report_training.py bench/results/train.json [--png docs/training.png]
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

GOALS = "goals: utilization >= 0.97 and >= expandable's; median step <= 1.02x native; max batch >= both"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+")
    parser.add_argument("--png", default="docs/training.png")
    args = parser.parse_args()
    runs, env = [], None
    for path in args.results:
        data = json.loads(Path(path).read_text())
        env = env or data["environment"]
        runs += [r for r in data["runs"] if r.get("returncode") == 0]
    by = {(r["workload"], r["allocator"]): r for r in runs}
    workloads = sorted({r["workload"] for r in runs})
    print(f"Measured on {env['gpu']} (driver {env['nvidia_driver']}), torch {env['torch']}, gmlake {env['gmlake']}, "
          f"{env['date']}; {GOALS}.\n")
    print("| workload | allocator | peak allocated GiB | peak reserved GiB | utilization | median step s | "
          "step vs native | tokens/s | max batch under cap |")
    print("|---|---|---|---|---|---|---|---|---|")
    for w in workloads:
        native = by.get((w, "native"))
        for a in ("native", "expandable", "gmlake"):
            r = by.get((w, a))
            if not r:
                continue
            ratio = r["median_step_s"] / native["median_step_s"] if native else float("nan")
            print(f"| {w} | {a} | {r['max_memory_allocated'] / 2**30:.2f} | {r['max_memory_reserved'] / 2**30:.2f} | "
                  f"{r['utilization']:.3f} | {r['median_step_s']:.3f} | {ratio:.3f} | {r['tokens_per_s']:.0f} | "
                  f"{r.get('max_batch_under_cap')} |")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    colors = {"native": "tab:red", "expandable": "tab:blue", "gmlake": "tab:green"}
    width = 0.27
    for i, a in enumerate(("native", "expandable", "gmlake")):
        xs = [j + (i - 1) * width for j in range(len(workloads))]
        util = [by[(w, a)]["utilization"] if (w, a) in by else 0 for w in workloads]
        step = [by[(w, a)]["median_step_s"] / by[(w, "native")]["median_step_s"]
                if (w, a) in by and (w, "native") in by else 0 for w in workloads]
        axes[0].bar(xs, util, width, label=a, color=colors[a])
        axes[1].bar(xs, step, width, label=a, color=colors[a])
    for ax, title in zip(axes, ("utilization (peak allocated / peak reserved)", "median step time / native")):
        ax.set_xticks(range(len(workloads)), workloads, rotation=30, ha="right", fontsize=8)
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=8)
    axes[0].axhline(0.97, color="black", linewidth=0.8, linestyle="--")
    axes[1].axhline(1.02, color="black", linewidth=0.8, linestyle="--")
    fig.tight_layout()
    Path(args.png).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.png, dpi=110)
    print(f"\n![training benchmark]({args.png})")


if __name__ == "__main__":
    main()
