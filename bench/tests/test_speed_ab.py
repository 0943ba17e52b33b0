"""bench speed-ab (no torch, no GPU): its statistics and verdict, the interleaved order, two builds of gmlake run
side by side, and bad input (one line, exit 2). The runs use a stand-in workload (bench/tests/fake_workload.py)."""
from __future__ import annotations

import json
import shutil
from itertools import pairwise

import pytest

from bench import ROOT, speed_ab


def test_spread_and_warm_figures_leave_the_warm_up_out():
    assert speed_ab.spread_pct([1.0]) is None
    assert speed_ab.spread_pct([9.9, 10.0, 10.2]) == pytest.approx(3.0)
    steps = [{"step_s": 5.0, "event_ms": 5000.0}] * 2 + [{"step_s": s, "event_ms": s * 1e3} for s in (0.1, 0.3, 0.2)]
    figures = speed_ab.warm_figures(steps, 2)
    assert figures["warm_steps"] == 3 and figures["warm_sum_s"] == pytest.approx(0.6)
    assert figures["warm_median_s"] == pytest.approx(0.2) and figures["event_median_ms"] == pytest.approx(200.0)
    assert "event_sum_ms" not in speed_ab.warm_figures([{"step_s": 1.0}, {"step_s": 1.0}], 1)
    probed = speed_ab.warm_figures([{"step_s": 1.0, "cpu_ms": 9.0}] + [{"step_s": 1.0, "cpu_ms": c} for c in (3, 5, 4)], 1)
    assert probed["median_cpu_ms"] == 4 and "median_gpu_spin_ms" not in probed


@pytest.mark.parametrize("ratios, spread, expected", [
    ([1.01], None, "cannot decide: one round"),
    ([1.00, 1.01], 2.5, "cannot decide: spread 2.5% > 2%"),
    ([1.005, 1.015], 1.0, "within 2%"),
    ([1.03, 1.035], 0.5, "slower by more than 2%"),
    ([0.95, 0.96], 1.0, "faster by more than 2%"),
    ([1.015, 1.025], 1.0, "cannot decide: rounds straddle +2%"),
    ([0.975, 0.99], 1.5, "not slower by 2% (maybe faster)"),
])
def test_verdict_says_cannot_decide_rather_than_pass(ratios, spread, expected):
    assert speed_ab.verdict(ratios, spread, 2.0) == expected


def run(spec: str, round_: int, warm_sum: float, workload: str = "t5") -> dict:
    return {"workload": workload, "allocator": spec, "round": round_, "warm_sum_s": warm_sum,
            "warm_median_s": warm_sum / 10, "warm_steps": 10}


def test_compare_pairs_rounds_and_takes_the_widest_spread():
    """The ratio is per round (the pair ran in one round); the verdict's spread is the largest of the allocator's,
    the baseline's and the ratio's, so a drift that the pairing cancels still has to be small."""
    runs = [run("expandable", 0, 10.0), run("gmlake", 0, 10.1), run("gmlake", 1, 10.5), run("expandable", 1, 10.4),
            {"workload": "t5", "allocator": "gmlake-paper", "round": 0, "error": "killed"}]
    for r, calls in zip(runs[1:3], (20, 30)):
        r.update(gmlake_after_warmup={"driver_calls": calls}, max_memory_reserved=3 << 30)
    rows = speed_ab.compare(runs, ["t5"], ["expandable", "gmlake", "gmlake-paper"], 2.0)
    base, mine, failed = rows
    assert "verdict" not in base and base["spread_pct"] == pytest.approx(100 * 0.4 / 10.2)
    assert mine["ratios"] == pytest.approx([1.01, 10.5 / 10.4])
    assert mine["spread_for_verdict_pct"] == pytest.approx(100 * 0.4 / 10.2)
    assert mine["verdict"] == "cannot decide: spread 3.9% > 2%"
    assert mine["driver_calls_per_warm_step"] == 2.5 and mine["peak_reserved_gib"] == 3.0
    assert failed["rounds"] == 0 and failed["failed"] == 1 and failed["verdict"] == "cannot decide: one round"
    steady = speed_ab.compare([run("a", 0, 10.0), run("b", 0, 10.1), run("b", 1, 10.11), run("a", 1, 10.02)],
                              ["t5"], ["a", "b"], 2.0)
    assert steady[1]["verdict"] == "within 2%"
    table = speed_ab.format_table(rows, "expandable", 2.0)
    assert "cannot decide: spread 3.9%" in table and "1.0098x" in table and "(1 failed)" in table


def fake_tree(tmp_path, slowdown: float):
    """A stand-in build of gmlake: the modules speed-ab's check imports, and a slowdown the fake workload reads."""
    tree = tmp_path / "old"
    for module in ("gmlake/__init__.py", "gmlake/core/__init__.py", "gmlake/core/_allocator.py",
                   "gmlake/core/_driver.py", "gmlake/drivers/__init__.py", "gmlake/drivers/_cuda_driver.py",
                   "gmlake/torch/__init__.py", "gmlake/torch/_torch_bridge.py"):
        (tree / module).parent.mkdir(parents=True, exist_ok=True)
        (tree / module).write_text("")
    (tree / "gmlake/__init__.py").write_text(f"FAKE_SLOWDOWN = {slowdown}\n")
    return tree


def test_two_builds_run_interleaved_each_with_its_own_gmlake(tmp_path, monkeypatch, capsys):
    gmlake = pytest.importorskip("gmlake")
    if not gmlake.__file__.startswith(str(ROOT)):      # an installed wheel, not this checkout: no tree to compare
        pytest.skip("gmlake is imported from an installed wheel, not from this checkout")
    monkeypatch.setattr(speed_ab, "WORKLOAD_MODULE", "bench.tests.fake_workload")
    tree = fake_tree(tmp_path, 1.1)
    out = tmp_path / "out"
    speed_ab.main(["--device", "cpu", "--workloads", "cnn", "--allocators", "native", f"native@{tree}",
                   "--rounds", "2", "--pool", "2", "--warmup", "2", "--timed", "3", "--out", str(out)])
    printed = capsys.readouterr().out
    record = json.loads((out / "speed-ab.json").read_text())
    assert record["order"] == ["cnn:native:r0", f"cnn:native@{tree}:r0", f"cnn:native@{tree}:r1", "cnn:native:r1"]
    seen = {r["allocator"]: r["gmlake_file"] for r in record["runs"]}
    assert seen["native"] == str(ROOT / "gmlake" / "__init__.py")
    assert "/trees/" in seen[f"native@{tree}"]        # the link to the tree's gmlake (its slowdown shows below)
    assert record["builds"][f"native@{tree}"]["tree"] == str(tree)
    assert all(len(r["per_step"]) == 5 and r["warm_steps"] == 3 for r in record["runs"])
    assert record["runs"][0]["warm_sum_s"] == pytest.approx(0.01 + 0.02 + 0.01)   # steps 2-4, the warm-up left out
    row = record["rows"][1]
    assert row["ratios"] == pytest.approx([1.1, 1.1]) and row["verdict"] == "slower by more than 2%"
    assert "expected about" in printed.splitlines()[0]
    assert printed.rstrip().splitlines()[-1].split()[:2] == ["cnn", "native@old"]


@pytest.mark.parametrize("argv, message", [
    (["--allocators", "native"], "need two or more distinct allocators"),
    (["--allocators", "native", "native"], "need two or more distinct allocators"),
    (["--allocators", "native", "native@/nonexistent"], "holds no gmlake/__init__.py"),
    (["--allocators", "native", "@/tmp"], "has no name before '@'"),
    (["--allocators", "native", "expandable"], "needs CUDA; on --device cpu"),
    (["--allocators", "native", "bogus"], "unknown allocator 'bogus'"),
    (["--pool", "9", "--warmup", "8"], "need --warmup >= --pool"),
    (["--rounds", "0"], "need --rounds, --pool and --timed >= 1"),
    (["--tolerance", "0"], "need 0 < --tolerance < 100"),
    (["--workloads", "nope"], "invalid choice"),
])
def test_bad_input_is_one_line_and_exit_2(argv, message, capsys):
    base = ["--device", "cpu", "--allocators", "native", f"native@{ROOT}"]
    with pytest.raises(SystemExit) as exit_:
        speed_ab.main(base + argv)
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and len(err.splitlines()) == 1 and message in err, err


@pytest.mark.parametrize("broken, message", [
    ("gmlake/core/_allocator.py", "does not import (ModuleNotFoundError"),          # not built
    ("gmlake/drivers", "build it in place"),        # this checkout's would fill in, and fail or be refused
])
def test_a_tree_not_built_is_refused(tmp_path, capsys, broken, message):
    tree = fake_tree(tmp_path, 1.0)
    shutil.rmtree(tree / broken) if (tree / broken).is_dir() else (tree / broken).unlink()
    with pytest.raises(SystemExit) as exit_:
        speed_ab.main(["--device", "cpu", "--allocators", "native", f"native@{tree}", "--out", str(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and len(err.splitlines()) == 1 and message in err, err


def test_a_tree_that_does_not_import_is_refused(tmp_path, capsys):
    tree = fake_tree(tmp_path, 1.0)
    (tree / "gmlake/__init__.py").write_text("raise ImportError('half a checkout')\n")
    with pytest.raises(SystemExit) as exit_:
        speed_ab.main(["--device", "cpu", "--allocators", "native", f"native@{tree}", "--out", str(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and len(err.splitlines()) == 1 and "does not import (ImportError: half" in err, err


def test_markdown_table_names_machine_and_command():
    record = {"rows": speed_ab.compare([run("a", 0, 10.0), run("b", 0, 10.1), run("b", 1, 10.11),
                                        run("a", 1, 10.02)], ["t5"], ["a", "b"], 2.0),
              "environment": {"gpu": "NVIDIA H100", "nvidia_driver": "580", "torch": "2.11", "python": "3.12",
                              "date": "2026-12-06T20:00:00+00:00", "command": "python -m bench speed-ab"}}
    text = speed_ab.markdown_table(record)
    assert "| t5 | b | 10.10 / 10.11 | 0.1 % | 1.009 (0.1 %) | within 2% |" in text
    assert "NVIDIA H100 (driver 580)" in text and "2026-12-06" in text


def test_a_pool_of_shapes_warms_every_shape_before_the_timed_steps():
    """Note [Warm steps from a pool of shapes]: the first steps are the pool's distinct shapes, every later step is
    one of them and differs from the step before; without a pool the schedule is drawn afresh, as before."""
    import random

    from bench.workloads.shapes import draw_schedule

    def draw(rng: random.Random) -> dict:
        return {"batch": rng.randrange(1, 5), "length": rng.randrange(8, 72, 8)}

    schedule = draw_schedule(draw, 40, seed=3, pool=6)
    pool = schedule[:6]
    assert len({tuple(s.values()) for s in pool}) == 6 and all(s in pool for s in schedule[6:])
    assert all(a != b for a, b in pairwise(schedule))
    assert draw_schedule(draw, 40, seed=3, pool=6) == schedule != draw_schedule(draw, 40, seed=4, pool=6)
    rng = random.Random(3)
    assert draw_schedule(draw, 10, seed=3) == [draw(rng) for _ in range(10)]
    assert draw_schedule(lambda rng: {"only": 1}, 3, seed=0, pool=4) == [{"only": 1}] * 3   # a space of one shape


@pytest.mark.gpu
def test_the_real_workloads_time_warm_steps_on_the_gpu(tmp_path):
    """dynamic.py's pool, CUDA events and quiet collector under two allocators: every run finishes and decides."""
    code = speed_ab.main(["--workloads", "cnn", "--size", "small", "--allocators", "expandable", "gmlake",
                          "--rounds", "2", "--pool", "3", "--warmup", "3", "--timed", "6", "--out", str(tmp_path)])
    record = json.loads((tmp_path / "speed-ab.json").read_text())
    assert code == 0 and len(record["runs"]) == 4
    assert all(r["warm_steps"] == 6 and r["shape_pool"] == 3 and "event_sum_ms" in r for r in record["runs"])
    assert record["rows"][1]["verdict"] and record["rows"][1]["driver_calls_per_warm_step"] is not None
