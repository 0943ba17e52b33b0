"""The step-time-at-the-edge records' summaries, read by `bench report docs` (its `edge-time` table): gmlake against
expandable segments at 1.02x and 1.05x the peak allocated P, as a cap and as the device's free memory. The command
that measured them is gone (`bench edge-fit` measures the device as the limit); these records stay in
bench/results. B / A is resolved where it differs from 1 by more than both spreads.
"""
from __future__ import annotations

import math

from bench.cap_time import spread
from bench.harness import GIB


def kernel_ms(run: dict) -> float | None:
    """The kernels' own time of a run's profiled steps (--gpu-time-steps), in ms summed over those steps, or None
    where it profiled none or a profiled step failed (ran out of memory under the limit)."""
    profiled = run.get("gpu_time") or []
    if not profiled or any("error" in step for step in profiled):
        return None
    return sum(step["total_ms"] for step in profiled)


def allocator_summary(runs: list[dict]) -> dict:
    """One allocator's runs at one point: counts, the times of those that fit, their sum and spread, what they held."""
    fit = [r for r in runs if r["fit"]]
    times = [r["timed_s"] for r in fit if r.get("timed_s")]
    busy = [r["driver_busy_after_s"] for r in fit if r.get("driver_busy_after_s") is not None]
    kernel = [k for r in fit if (k := kernel_ms(r)) is not None]
    out = {"runs": len(runs), "fit": len(fit), "out_of_memory": sum(bool(r.get("oom")) for r in runs),
           "errors": sum(not r["fit"] and not r.get("oom") for r in runs),
           "times_s": [round(t, 4) for t in times], "sum_s": round(sum(times), 4), "spread": round(spread(times), 4)}
    out["oom_steps"] = [r.get("oom_step") for r in runs if r.get("oom")]
    if busy:
        out["driver_busy_s"] = [round(b, 4) for b in busy]
    if kernel:
        out["kernel_ms"] = [round(k, 2) for k in kernel]
    reserved = [r["max_memory_reserved"] for r in runs if r.get("max_memory_reserved")]
    if reserved:
        out["peak_reserved"] = max(reserved)
    drift = [r["outside_drift"] for r in runs if r.get("outside_drift") is not None]
    if drift:
        out["outside_drift"] = drift
        out["calibration_off"] = sum(not r.get("calibration_held", True) for r in runs)
    return out


def summarize(runs: list[dict], allocators: list[str], rounds: int) -> dict:
    """One point's comparison of B (allocators[1]) with A (allocators[0]) from its runs (those a deadline cut left
    out): per allocator allocator_summary; B / A as the ratio of their mean times where both fit every run;
    `resolved` where |ratio - 1| is over both spreads (two timed runs a side at least); `goal` (B's time <= A's): met
    where the ratio is resolved below 1 or only A ran out of memory, missed where it is resolved above 1 or only B
    ran out of memory, not resolved where the ratio is within the spreads (either side of 1: a timing that cannot
    resolve the goal is no pass), None where the runs say nothing (errors, none yet); `complete` where each
    allocator ran every round."""
    a, b = allocators
    kept = [r for r in runs if not r.get("cut")]
    sides = {x: allocator_summary([r for r in kept if r["allocator"] == x]) for x in allocators}
    out: dict = {"allocators": sides, "complete": all(s["runs"] >= rounds for s in sides.values())}
    oom = {x: sides[x]["out_of_memory"] > 0 for x in allocators}
    times = {x: sides[x]["times_s"] for x in allocators}
    if oom[a] or oom[b]:
        out["verdict"] = ("both out of memory" if oom[a] and oom[b] else f"{a if oom[a] else b} out of memory")
        out["goal"] = None if oom[a] and oom[b] else "met" if oom[a] else "missed"
    elif times[a] and times[b]:
        out["ratio"] = round((sum(times[b]) / len(times[b])) / (sum(times[a]) / len(times[a])), 4)
        enough = min(len(times[a]), len(times[b])) >= 2
        out["resolved"] = enough and abs(out["ratio"] - 1) > max(sides[a]["spread"], sides[b]["spread"])
        out["verdict"] = (("faster" if out["ratio"] < 1 else "slower") if out["resolved"]
                          else "within the spread" if enough else "one run a side")
        out["goal"] = ("met" if out["ratio"] <= 1 else "missed") if out["resolved"] else "not resolved"
    else:
        out["verdict"], out["goal"] = ("errors" if any(sides[x]["errors"] for x in allocators) else "no runs"), None
    return out


def points(record: dict) -> list[dict]:
    """Every planned point's summary, in the plan's order, from the runs so far (a point with no run: 'no runs')."""
    settings, peaks = record["settings"], record["peaks"]
    allocators, out = settings["allocators"], []
    for step in record["plan"]:
        if step["step"] != "run" or step["round"] != 0 or step["allocator"] != allocators[0]:
            continue
        key = (step["workload"], step["kind"], step["limit_p"])
        runs = [r for r in record["runs"] if (r["workload"], r["kind"], r["limit_p"]) == key]
        out.append({"workload": key[0], "kind": key[1], "limit_p": key[2],
                    "limit_bytes": math.ceil(key[2] * peaks[key[0]]["bytes"]),
                    **summarize(runs, allocators, settings["rounds"])})
    return out


def table_rows(record: dict) -> tuple[list[str], list[list[str]]]:
    """The table's columns and a row per point, as text: report docs' `edge-time`."""
    a, b = record["settings"]["allocators"]

    def side(s: dict) -> str:
        if s["out_of_memory"]:
            steps = ", ".join(str(x) for x in s["oom_steps"] if x is not None)
            return f"OOM in {s['out_of_memory']} of {s['runs']}" + (f" (step {steps})" if steps else "")
        if not s["times_s"]:
            return f"{s['errors']} errors" if s["errors"] else "-"
        return " / ".join(f"{t:.2f}" for t in s["times_s"]) + (f" ({s['errors']} errors)" if s["errors"] else "")

    def peak(s: dict) -> str:
        return f"{s['peak_reserved'] / GIB:.2f}" if s.get("peak_reserved") else "-"

    columns = ["workload", "kind", "limit", "GiB", f"{a} s", f"{a} spread", f"{b} s", f"{b} spread", f"{b} / {a}",
               "verdict", f"{b} <= {a}", f"{b} driver s", "peak reserved GiB", "outside drift MiB"]
    listed = points(record) if "plan" in record and "runs" in record else record["points"]
    profiled = any(s.get("kernel_ms") for p in listed for s in p["allocators"].values())
    if profiled:            # --gpu-time-steps: the profiled steps' kernel time, A's runs / B's runs
        columns.append("kernel ms")
    rows = []
    # summaries from the runs themselves where the record has them: a verdict is never read back from a file
    for p in listed:
        sa, sb = p["allocators"][a], p["allocators"][b]
        drift = [d for s in (sa, sb) for d in s.get("outside_drift", ())]
        off = sum(s.get("calibration_off", 0) for s in (sa, sb))
        rows.append([p["workload"], p["kind"], f"{p['limit_p']:g}x P", f"{p['limit_bytes'] / GIB:.3f}",
                     side(sa), f"{sa['spread']:.1%}" if len(sa["times_s"]) > 1 else "-",
                     side(sb), f"{sb['spread']:.1%}" if len(sb["times_s"]) > 1 else "-",
                     f"{p['ratio']:.3f}" if "ratio" in p else "-",
                     p["verdict"] + ("" if p["complete"] else " (incomplete)"), p["goal"] or "-",
                     " / ".join(f"{x:.3f}" for x in sb.get("driver_busy_s", ())) or "-",
                     f"{peak(sa)} / {peak(sb)}",
                     (f"{min(drift) / 2**20:+.0f} to {max(drift) / 2**20:+.0f}" + (f" ({off} OFF)" if off else ""))
                     if drift else "-"])
        if profiled:
            rows[-1].append(" vs ".join(" / ".join(f"{k:.0f}" for k in s.get("kernel_ms", ())) or "-" for s in (sa, sb)))
    return columns, rows
