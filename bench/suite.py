"""The interleaved run loop the suites share (bench speed, bench deepspeed): runs in a planned order, each in its own
process, under an optional deadline, with the summary rewritten after every run so that a call cut short keeps what
it finished."""
from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path


def write_summary(path: Path, record: dict) -> None:
    """The summary JSON: runs without their per-step records (those are in runs/)."""
    slim = {**record, "runs": [{k: v for k, v in r.items() if k != "per_step"} for r in record["runs"]]}
    path.write_text(json.dumps(slim, indent=1) + "\n")


def run_in_order(order: list[tuple], record: dict, out: Path, *, started: float, deadline: float, timeout: float,
                 run: Callable[[int, tuple, float], dict], expected: Callable[[tuple], float],
                 kind: Callable[[tuple], str], label: Callable[[tuple], str], name: Callable[[tuple], str],
                 rows: Callable[[list[dict]], list[dict]], shown: tuple[str, ...], error_tail: int = 800) -> None:
    """Run `order`'s items, (round, ...) tuples, one after another: `run(index, item, timeout_s)` returns the run's
    record (with "error" where it failed); `label(item)` names it in the progress lines and `kind(item)` says what
    kind of run it is. With a `deadline` (seconds from `started`; 0: none) an item whose `expected` seconds no longer
    fit is not started, nor any after it (their `name`s go to record["not_started"]), and a started run is given
    at most the time left. After each run record["rows"] is `rows(runs)` and out/summary.json is rewritten; at the
    end the suite's wall time is added."""
    for index, item in enumerate(order):
        elapsed = time.perf_counter() - started
        timeout_s = timeout
        if deadline:
            left = deadline - elapsed
            takes = expected(item)
            if left < max(takes, 1.0):
                record["not_started"] = [name(o) for o in order[index:]]
                print(f"deadline: {left:.0f} s left, a {kind(item)} run takes about {takes:.0f} s; "
                      f"not starting the last {len(order) - index} runs", flush=True)
                break
            timeout_s = min(timeout_s, left)
        print(f"== [{index + 1}/{len(order)}] round {item[0] + 1} {label(item)} at {elapsed:.0f} s", flush=True)
        result = run(index, item, timeout_s)
        record["runs"].append(result)
        if "error" in result:
            print(f"   FAILED (exit {result.get('returncode')}): {result['error'][-error_tail:]}", flush=True)
        else:
            print("   " + json.dumps({k: result.get(k) for k in shown}), flush=True)
        record["rows"] = rows(record["runs"])
        write_summary(out / "summary.json", record)
    record["suite_wall_s"] = round(time.perf_counter() - started, 1)
    write_summary(out / "summary.json", record)
    print(f"\nsuite: {len(record['runs'])} runs in {record['suite_wall_s']:.0f} s; results in {out}")


def finished_runs(runs: list[dict], field: str, value, allocators: list[str],
                  rows: list[dict]) -> Iterator[tuple[str, list[dict], int]]:
    """For a suite's table: per allocator, its runs with run[field] == value that finished and the number that
    failed. An allocator none of whose runs finished yields nothing: where some failed, its row (runs 0, failed N)
    is appended to `rows` here; where it has no run, it has no row."""
    for allocator in allocators:
        mine = [r for r in runs if r[field] == value and r["allocator"] == allocator]
        done = [r for r in mine if "error" not in r]
        failed = len(mine) - len(done)
        if done:
            yield allocator, done, failed
        elif failed:
            rows.append({field: value, "allocator": allocator, "runs": 0, "failed": failed})
