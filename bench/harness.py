"""What every bench command that runs workloads shares: how each allocator starts, one run in a fresh process, the
interleaved rounds, the deadline, and result files rewritten after every run."""
from __future__ import annotations

import datetime
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TypeVar

from bench import ROOT, child_env

T = TypeVar("T")
GIB = 1 << 30

# Candidates for the default (`gmlake run` flags), each with the measurement that made it one (docs/benchmarks.md).
CANDIDATES = {
    # bench kernels copied 1.2-4.7 % slower on 20 MiB handles than on cudaMalloc memory, and as fast on 64 MiB;
    "gmlake-64m": ["--policy", "gmlake[expandable_page_large=64MiB]"],
    # blocks kept on their stream (FSDP: 8.21 GiB a rank, shared 7.14-7.29).
    "gmlake-perstream": ["--policy", "gmlake[cross_stream=false]"],
    # replayed on the real FSDP traces, 4 and 8 MiB pages fit caps below expandable's at 5-10x its driver time.
    "gmlake-page8m": ["--policy", "gmlake[expandable_page_large=8MiB]"],
    "gmlake-page4m": ["--policy", "gmlake[expandable_page_large=4MiB]"],
    # replayed over every trace, 2 MiB pages fit within 0.2 % of P of the better of expandable and gmlake-paper on
    # all but one, at about ten times the default's priced driver time (docs/benchmarks.md, "Fine pages from the start")
    "gmlake-page2m": ["--policy", "gmlake[expandable_page_large=2MiB]"],
    # replayed over every trace, 2 MiB slots at a block's tail only fit within 0.2 % of P of the better of expandable
    # and gmlake-paper on 17 of 22, at 2-4x the default's priced driver time (Note [Fine pages at a block's tail])
    "gmlake-tail2m": ["--policy", "gmlake[tail_page=2MiB]"],
    # replayed over every trace, tail pages that reuse cuts too while memory grows fit within 0.2 % of P on 20 of
    # 22, a synchronize per cut (Note [Fine pages at reuse])
    "gmlake-cut25": ["--policy", "gmlake[tail_page=2MiB,cut_at_reuse=25]"],
    # Note [Waiting for another stream's free block]: the default now; kept by name for the records that carry it
    "gmlake-wait": ["--policy", "gmlake[cross_stream_wait=true]"],
    "gmlake-noipc": [],       # the default, its chunks not exportable (Note [Exporting a chunk]; GMLAKE_ENV below)
    "gmlake-nowait": ["--policy", "gmlake[cross_stream_wait=false]"],
}
# allocator name -> how a run starts it: torch's environment setting (a dict), or `python -m gmlake run` flags
ALLOCATORS: dict[str, dict[str, str] | list[str]] = {
    "native": {},
    "expandable": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
    "gmlake": [],                                          # the default policy (an expandable base that stitches)
    # the paper's design, which was the default (and ran as "gmlake") in the results of 2026-11-30 10:00 and before
    "gmlake-paper": ["--policy", "gmlake-paper"],
    "gmlake-paper-8m": ["--policy", "gmlake-paper", "--chunk-size", str(8 << 20)],   # fewer, larger handles
    **CANDIDATES,
}
# allocator name -> the environment its gmlake run adds; GMLAKE_IPC is set only here, so "gmlake" runs as its default
GMLAKE_ENV: dict[str, dict[str, str]] = {"gmlake-noipc": {"GMLAKE_IPC": "0"}}
# no NVLink multicast for NCCL or symmetric memory: it is off on the machines the results were measured on
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def launch(allocator: str, launcher: list[str], script: list[str]) -> tuple[list[str], dict[str, str]]:
    """The command line and environment that run `launcher + script` under `allocator`: torch's allocators by
    PYTORCH_CUDA_ALLOC_CONF, gmlake's by `python -m gmlake run FLAGS` between the launcher and the script (a name
    not in ALLOCATORS is a gmlake policy: `--policy NAME`)."""
    env = {**child_env(), "PYTHONUNBUFFERED": "1", "PYTORCH_CUDA_ALLOC_CONF": "", **NO_MULTICAST}
    env = {k: v for k, v in env.items() if k not in ("GMLAKE", "GMLAKE_IPC")} | GMLAKE_ENV.get(allocator, {})
    how = ALLOCATORS.get(allocator, ["--policy", allocator])
    if isinstance(how, dict):
        env.update(how)
        return [*launcher, *script], env
    return [*launcher, "-m", "gmlake", "run", *how, *script], env


def run_process(cmd: list[str], env: dict[str, str], timeout_s: float) -> tuple[subprocess.CompletedProcess, bool]:
    """Run `cmd` from the repository root in a process group of its own; at `timeout_s` kill the whole group (a
    launcher's children too, which would otherwise hold the GPU). Returns the finished process (exit status -9 when
    killed) and whether it was killed."""
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            errors="replace", start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
        return subprocess.CompletedProcess(cmd, proc.returncode, out, err), False
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out, err = proc.communicate()
        why = f"killed after {timeout_s:.0f} s (timeout or deadline)"
        return subprocess.CompletedProcess(cmd, -9, out or "", f"{err or ''}\n{why}".lstrip()), True


def output_tail(proc: subprocess.CompletedProcess, chars: int) -> str:
    """What a failed run said last: its stderr, else its stdout."""
    return (proc.stderr or proc.stdout or "no output")[-chars:]


def measured_run(cmd: list[str], env: dict[str, str], json_path: Path, timeout_s: float, run: dict,
                 error_chars: int = 3000, log: Path | None = None) -> dict:
    """Run a workload that writes its summary to `json_path`; `run` (its names) with the command, exit status and
    wall time, then the summary's figures, or "error" with the output's tail. The allocator the process saw is kept
    as "allocator_seen" ("gmlake" for every gmlake policy). `log`: where its whole output goes."""
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.unlink(missing_ok=True)
    started = time.perf_counter()
    proc, _ = run_process(cmd, env, timeout_s)
    if log is not None:
        log.write_text(proc.stdout + proc.stderr)
    run.update(command=" ".join(cmd), returncode=proc.returncode, wall_s=round(time.perf_counter() - started, 1))
    if proc.returncode == 0 and json_path.exists() and json_path.stat().st_size:
        measured = json.loads(json_path.read_text())
        run["allocator_seen"] = measured.pop("allocator", None)
        run.update(measured)
        if run.get("max_memory_reserved"):
            run["utilization"] = run["max_memory_allocated"] / run["max_memory_reserved"]
    else:
        run["error"] = output_tail(proc, error_chars)
    return run


def alternate(items: Sequence[T], round_: int) -> list[T]:
    """`items` forward in even rounds and backward in odd ones (A B C, then C B A): a drift in the machine's speed
    falls on every item alike."""
    return list(items) if round_ % 2 == 0 else list(items)[::-1]


def run_order(groups: Sequence[str], items: Sequence[str], rounds: int) -> list[tuple[int, str, str]]:
    """(round, group, item) in the order they run: rounds outermost, each group's items alternating by round, so
    that a deadline that cuts a suite short leaves every group with at least its first round."""
    return [(round_, group, item) for round_ in range(rounds) for group in groups for item in alternate(items, round_)]


def expected_duration(workload: str, finished: list[dict]) -> float:
    """How long a run of `workload` will likely take: the longest finished run of it, else of any workload, else 0."""
    same = [r["wall_s"] for r in finished if r["workload"] == workload and "error" not in r]
    anything = [r["wall_s"] for r in finished if "error" not in r]
    return max(same or anything or [0.0])


def outcome_line(run: dict) -> str:
    """A probe's or capped run's outcome in a progress line: fit, OOM or ERROR, its time and what it measured."""
    return ("fit" if run["fit"] else f"OOM at step {run.get('oom_step')}" if run.get("oom") else "ERROR") \
        + (f" in {run['wall_s']:.0f} s" if "wall_s" in run else "") + (f", timed {run['timed_s']:.2f} s" if run.get("timed_s") else "") \
        + (f", driver {run['driver_busy_after_s']:.3f} s" if run.get("driver_busy_after_s") is not None else "") \
        + (f": {run['error'][-300:]}" if "error" in run else "")


class Results:
    """One command's result file, `out/name`, and its clock: `save()` rewrites the record (with the wall time so far,
    and without per-step records where `slim`), `left()` is the time to the deadline (None: none)."""

    def __init__(self, out: Path, name: str, record: dict, deadline: float = 0, slim: bool = False):
        self.out, self.path, self.record, self.deadline, self.slim = out, out / name, record, deadline, slim
        self.started = time.perf_counter()
        out.mkdir(parents=True, exist_ok=True)

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def left(self) -> float | None:
        return self.deadline - self.elapsed() if self.deadline else None

    def no_time_for(self, expected: float) -> str | None:
        """Why a step expected to take `expected` s should not start: the deadline is nearer; else None."""
        left = self.left()
        if left is not None and left < max(expected, 1.0):
            return f"deadline: {left:.0f} s left, the next run takes about {expected:.0f} s"
        return None

    def stop(self, why: str, not_started: list[str] | None = None) -> None:
        """Note why the runs stopped early, and which were not started."""
        self.record["stopped"] = why
        if not_started is not None:
            self.record["not_started"] = not_started
        print(f"{why}; not starting more runs", flush=True)
        self.save()

    def save(self) -> None:
        self.record["wall_s"] = round(self.elapsed(), 1)
        record = self.record
        if self.slim:           # the per-step records are in each run's own file
            record = {**record, "runs": [{k: v for k, v in r.items() if k != "per_step"} for r in record["runs"]]}
        self.path.write_text(json.dumps(record, indent=1, default=str) + "\n")


def run_in_order(order: list[tuple], results: Results, *, timeout: float,
                 run: Callable[[int, tuple, float], dict], expected: Callable[[tuple], float],
                 label: Callable[[tuple], str], rows: Callable[[list[dict]], list[dict]], shown: tuple[str, ...],
                 error_tail: int = 800) -> None:
    """Run `order`'s items, (round, ...) tuples, one after another: `run(index, item, timeout_s)` returns the run's
    record (with "error" where it failed); `label(item)` names it. An item whose `expected` seconds no longer fit
    before the deadline is not started, nor any after it. After each run record["rows"] is `rows(runs)` and the
    results are saved."""
    record = results.record
    for index, item in enumerate(order):
        why = results.no_time_for(expected(item))
        if why:
            results.stop(why, [f"{label(o)} r{o[0]}" for o in order[index:]])
            break
        left = results.left()
        print(f"== [{index + 1}/{len(order)}] round {item[0] + 1} {label(item)} at {results.elapsed():.0f} s",
              flush=True)
        result = run(index, item, timeout if left is None else min(timeout, left))
        record["runs"].append(result)
        if "error" in result:
            print(f"   FAILED (exit {result.get('returncode')}): {result['error'][-error_tail:]}", flush=True)
        else:
            print("   " + json.dumps({k: result.get(k) for k in shown}), flush=True)
        record["rows"] = rows(record["runs"])
        results.save()
    results.save()
    print(f"\nsuite: {len(record['runs'])} runs in {record['wall_s']:.0f} s; results in {results.out}")


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


def source_digest(root: Path = ROOT) -> str:
    """A digest of the gmlake package's sources under `root` (default: this checkout): names the code measured even
    where no git history travels."""
    import hashlib

    digest = hashlib.sha256()
    for path in sorted((root / "gmlake").rglob("*")):
        if path.suffix in (".py", ".pyx", ".pxd", ".h") and path.is_file():
            digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def environment(**extra) -> dict:
    """The machine and versions a result was measured with (torch None where it is not installed), and `extra`."""
    import importlib.util
    import platform

    import gmlake

    torch_version = None
    if importlib.util.find_spec("torch") is not None:
        import torch

        torch_version = torch.__version__
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                             capture_output=True, check=False, text=True).stdout.strip().splitlines()
    except FileNotFoundError:
        smi = []
    gpu, driver = (smi[0].split(", ") + ["?"])[:2] if smi else ("?", "?")
    return {"gpu": gpu, "nvidia_driver": driver, "torch": torch_version, "gmlake": gmlake.__version__,
            "gmlake_source_sha256": source_digest(), "python": platform.python_version(),
            "cpu": platform.processor() or platform.machine(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": " ".join(sys.argv), **extra}


def device_total_memory() -> int:
    """torch.cuda.get_device_properties(0).total_memory, read in a child process: a CUDA context here would take
    memory on the very device the runs measure."""
    proc = subprocess.run([sys.executable, "-c",
                           "import torch; print(torch.cuda.get_device_properties(0).total_memory)"],
                          capture_output=True, check=False, text=True, timeout=180)
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout or "no output").strip().splitlines()
        raise RuntimeError(lines[-1] if lines else "no output")
    return int(proc.stdout.split()[-1])
