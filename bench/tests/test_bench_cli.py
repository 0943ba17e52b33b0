"""Every bench command refuses a bad command line as `gmlake` does: one line on stderr and exit status 2, never
argparse's usage block or a traceback (bench.cli.OneLineParser); and `python -m bench` is the one entry point."""
from __future__ import annotations

import importlib
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench import ROOT
from bench.__main__ import COMMANDS
from tests.conftest import one_line_exit_2

# command words -> module, for every command and subcommand of `python -m bench`
LEAVES = {(name, *([sub] if sub else [])): entry[0]
          for name, group in COMMANDS.items()
          for sub, entry in (group.items() if isinstance(group, dict) else [("", group)])}
# the workloads, run by the suites as modules of their own (`python -m bench.workloads.dynamic`)
WORKLOADS = ["bench.workloads.dynamic", "bench.workloads.fsdp_train", "bench.workloads.train_hf"]
NEEDS_TORCH = {"bench.train_suite", "bench.cap_search", "bench.cap_time", *WORKLOADS}


def test_every_bench_module_is_a_command():
    """No bench script lives outside the entry point: each module with a main() is a command."""
    files = [*(ROOT / "bench").glob("*.py"), *(ROOT / "bench").glob("*/__init__.py")]
    modules = {f"bench.{p.parent.name if p.name == '__init__.py' else p.stem}" for p in files
               if "\ndef main(" in p.read_text()}
    assert modules - {"bench.__main__"} == set(LEAVES.values())


@pytest.mark.parametrize("words", sorted(LEAVES), ids=" ".join)
def test_an_unknown_option_is_one_line_and_exit_2(words):
    if LEAVES[words] in NEEDS_TORCH and importlib.util.find_spec("torch") is None:
        pytest.skip("needs torch: it imports the workloads' helpers, which import torch")
    err = one_line_exit_2(["-m", "bench", *words, "--no-such-option"])
    assert err.startswith("bench " + " ".join(words) + ": "), err


@pytest.mark.parametrize("module", WORKLOADS)
def test_a_workload_refuses_an_unknown_option_in_one_line(module):
    if importlib.util.find_spec("torch") is None:
        pytest.skip("needs torch: the workloads import it before they parse their arguments")
    one_line_exit_2(["-m", module, "--no-such-option"])


@pytest.mark.parametrize("words", [["no-such-command"], ["cap", "no-such-search"], ["report", "nothing"]])
def test_an_unknown_command_is_one_line_and_exit_2(words):
    assert "no command" in one_line_exit_2(["-m", "bench", *words])


def test_the_entry_point_lists_its_commands():
    proc = subprocess.run([sys.executable, "-m", "bench"], capture_output=True, text=True, check=False, cwd=ROOT,
                          timeout=120)
    assert proc.returncode == 0 and all(name in proc.stdout for name in COMMANDS), proc.stdout + proc.stderr


def _torch_latency():
    return importlib.import_module("bench.torch_latency")


def test_torch_latency_alternates_the_order_and_compares_medians():
    module = _torch_latency()
    assert module.run_order(3) == ["native", "gmlake", "gmlake", "native", "native", "gmlake"]

    def run(name, us):
        return {"allocator": name, "us_per_empty_del": {label: us for label in module.SIZES}}

    summary = module.summarize([run("native", 2.0), run("gmlake", 2.2), run("gmlake", 2.0), run("native", 1.9),
                                run("native", 2.1)])
    row = summary["4KiB"]
    assert row["native"] == {"median_us": 2.0, "spread": pytest.approx(0.1)}
    assert row["gmlake"]["median_us"] == pytest.approx(2.1) and row["ratio"] == pytest.approx(1.05)
    # the runs allow 2.0 / 2.1 to 2.2 / 1.9: the ratio of medians is under 1.1, but the goal is not resolved
    assert row["ratio_range"] == [pytest.approx(2.0 / 2.1), pytest.approx(2.2 / 1.9)]
    assert row["verdict"] == "not resolved"
    assert module.summarize([run("native", 2.0), run("gmlake", 2.1)], goal=1.1)["1MiB"]["verdict"] == "met"
    assert module.summarize([run("native", 2.0), run("gmlake", 2.3)], goal=1.1)["1MiB"]["verdict"] == "missed"
    assert module.verdict_lines(summary, 1.1)[0] == ("4KiB: gmlake / native 1.050 (runs allow 0.952-1.158): "
                                                     "not resolved (goal <= 1.1)")


@pytest.mark.parametrize("args", [["--rounds", "0"], ["--iterations", "-5"], ["--repeats", "0"]])
def test_torch_latency_refuses_a_count_below_one(args):
    assert "must be at least 1" in one_line_exit_2(["-m", "bench", "latency", *args])


GPU_AB = ROOT / "scripts" / "gpu-ab.sh"


@pytest.mark.parametrize("args", [[], ["HEAD"], ["no-such-revision", "HEAD"]])
def test_gpu_ab_refuses_bad_revisions_in_one_line(args, tmp_path):
    proc = subprocess.run(["bash", str(GPU_AB), *args], capture_output=True, text=True, check=False, timeout=60,
                          cwd=ROOT, env={"PATH": "/usr/bin:/bin", "OUT": str(tmp_path)})
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith(("usage:", "gpu-ab.sh: ")), proc.stderr


@pytest.mark.slow
def test_gpu_ab_compares_two_builds_on_the_sim_driver(tmp_path):
    """Builds HEAD twice in worktrees and alternates them: a B / A row per cache-hit case, every run recorded."""
    if subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, check=False).returncode != 0:
        pytest.skip("needs the git history")
    proc = subprocess.run(["bash", str(GPU_AB), "HEAD", "HEAD"], capture_output=True, text=True, check=False,
                          timeout=600, cwd=ROOT,
                          env={"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "OUT": str(tmp_path),
                               "DRIVER": "sim", "LATENCY": "0", "ROUNDS": "2"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    rows = [line for line in (tmp_path / "ab.txt").read_text().splitlines() if line.startswith("micro")]
    assert {row.split()[1] for row in rows} >= {"exact_4KiB", "split_4KiB", "stitched_128MiB"}
    assert all(" B/A " in row for row in rows)
    runs = [json.loads(line) for line in (tmp_path / "runs.jsonl").read_text().splitlines()]
    assert [r["side"] for r in runs] == ["A", "B", "B", "A"]
