"""bench report prices: gmlake's driver price table against the time measured inside the driver's calls."""
from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from bench import RESULTS, ROOT
from gmlake.sim.replay import driver_costs

price_check = pytest.importorskip("bench.price_check")
REAL = [RESULTS / "train" / f"cap-2026-12-01{x}" for x in "cdef"]


def counters(reserve: int, maps: int, creates: int, busy: float | None) -> dict:
    """A gmlake counter dict: `reserve` calls, `maps` map calls of one handle each, `creates` chunks created."""
    out = {"calls": {"reserve": reserve, "map": maps, "create_chunk": creates, "synchronize": 3},
           "handles": {"map": maps, "create_chunk": creates, "set_access": 0}}
    return out if busy is None else {**out, "driver_busy_s": busy}


def priced(reserve: int, maps: int, creates: int) -> float:
    """What the table says those calls cost, in seconds (synchronize is not priced)."""
    c = driver_costs()
    return (reserve * c["per_call"]["reserve"] + maps * c["per_handle"]["map"]
            + creates * c["per_handle"]["create_chunk"]) * 1e-6


@pytest.fixture
def cap_folder(tmp_path: Path) -> Path:
    """A cap-search folder of four probes: a single-GPU gmlake run (uncapped), an FSDP gmlake run of two ranks
    (capped), an expandable run (no gmlake counters) and a gmlake run from before driver_busy_s was recorded."""
    single = {"allocator": "gmlake", "timed_s": 2.0, "gmlake": counters(10, 1000, 100, 0.01),
              "gmlake_after_warmup": counters(1, 100, 10, 0.004)}
    fsdp = {"allocator": "gmlake", "timed_s": 4.0, "memory_fraction": 0.5, "ranks": [
        {"gmlake": counters(20, 2000, 200, 0.03), "gmlake_after_warmup": counters(2, 200, 0, 0.002)},
        {"gmlake": counters(5, 500, 50, 0.004), "gmlake_after_warmup": counters(0, 0, 0, 0.0)}]}
    expandable = {"allocator": "expandable", "timed_s": 1.0, "gmlake": None}
    old = {"allocator": "gmlake", "timed_s": 1.0, "gmlake": counters(1, 1, 1, None),
           "gmlake_after_warmup": counters(0, 0, 0, None)}
    probes = [("a.b", "gmlake", "reference", single), ("w-fsdp", "gmlake", "timed", fsdp),
              ("a.b", "expandable", "reference", expandable), ("a.b", "gmlake", "bisect", old)]
    (tmp_path / "cap.json").write_text(json.dumps({"probes": [
        {"index": i, "workload": w, "allocator": a, "purpose": p} for i, (w, a, p, _) in enumerate(probes)]}))
    with tarfile.open(tmp_path / "probes.tar.gz", "w:gz") as tar:
        for i, (w, a, p, run) in enumerate(probes):
            data = json.dumps(run).encode()
            info = tarfile.TarInfo(f"probes/{i:03d}-{w.replace('.', '_')}-{a}-{p}.json")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return tmp_path


def test_prices_ratios_shares_and_skips(cap_folder, tmp_path, capsys):
    assert price_check.main([str(cap_folder), "--json", str(tmp_path / "out.json")]) == 0
    out = json.loads((tmp_path / "out.json").read_text())
    rows, summary = out["rows"], out["summary"]
    assert [(r["workload"], r["purpose"], r["rank"], r["capped"]) for r in rows] == [
        ("a.b", "reference", None, False), ("w-fsdp", "timed", 0, True), ("w-fsdp", "timed", 1, True)]
    expected = [(priced(10, 1000, 100), 0.01), (priced(20, 2000, 200), 0.03), (priced(5, 500, 50), 0.004)]
    for row, (price, busy) in zip(rows, expected):
        assert row["priced_s"] == pytest.approx(price) and row["busy_s"] == busy
        assert row["ratio"] == pytest.approx(busy / price)
    assert rows[0]["calls"] == 10 + 1000 + 100 + 3
    assert rows[0]["priced_after_s"] == pytest.approx(priced(1, 100, 10))
    assert rows[0]["share_after_pct"] == pytest.approx(100 * 0.004 / 2.0)
    assert rows[1]["share_after_pct"] == pytest.approx(100 * 0.002 / 4.0)    # a rank without its own: the run's
    ratios = sorted(b / p for p, b in expected)
    assert summary["n"] == 3 and summary["skipped_without_busy"] == 1
    assert summary["ratio_median"] == pytest.approx(ratios[1])
    assert (summary["ratio_min"], summary["ratio_max"]) == pytest.approx((ratios[0], ratios[2]))
    assert summary["uncapped_n"] == 1 and summary["uncapped_share_after_pct_max"] == pytest.approx(0.2)
    assert "n = 3; 1 gmlake runs/ranks without driver_busy_s skipped" in capsys.readouterr().out


def test_the_real_cap_searches_of_2026_12_01(tmp_path):
    assert price_check.main([*map(str, REAL), "--json", str(tmp_path / "out.json")]) == 0
    summary = json.loads((tmp_path / "out.json").read_text())["summary"]
    assert summary["n"] == 21 and summary["skipped_without_busy"] == 0
    assert 1.3 <= summary["ratio_median"] <= 2.3
    assert summary["ratio_min"] >= 1.0          # the GPU never took less than the table's price
    # gmlake/sim/data/driver_costs_h200.json's in_training_factor (compare's title quotes it) is this median
    from gmlake.sim.replay import driver_costs

    assert driver_costs()["in_training_factor"] == round(summary["ratio_median"], 2)


@pytest.mark.parametrize("bad", ["no-such-path", "empty-folder", "bad.json", "list.json", "no-timed.json"])
def test_bad_input_is_one_line_and_exit_2(bad, tmp_path):
    (tmp_path / "empty-folder").mkdir()
    (tmp_path / "bad.json").write_text("{")
    (tmp_path / "list.json").write_text("[1]")
    (tmp_path / "no-timed.json").write_text("{}")
    proc = subprocess.run([sys.executable, "-m", "bench", "report", "prices", str(tmp_path / bad)],
                          capture_output=True, text=True, check=False, timeout=120, cwd=ROOT)
    assert proc.returncode == 2 and proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("bench report prices: ") and bad in lines[0], proc.stderr


def test_a_json_output_in_no_folder_is_refused_before_any_work(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "bench", "report", "prices",
                           str(RESULTS / "train" / "cap-2026-12-01c"),
                           "--json", str(tmp_path / "no" / "such" / "x.json")],
                          capture_output=True, text=True, check=False, timeout=120, cwd=ROOT)
    assert proc.returncode == 2 and proc.stdout == "" and "Traceback" not in proc.stderr
    assert proc.stderr.count("\n") == 1 and "no such folder" in proc.stderr


def test_runs_without_measured_driver_time_say_so_in_one_line(tmp_path):
    """Results from before driver_busy_s was recorded (2026-12-01): a line saying so, no table of empty rows."""
    proc = subprocess.run([sys.executable, "-m", "bench", "report", "prices",
                           str(RESULTS / "train" / "speed-2026-11-30c")],
                          capture_output=True, text=True, check=False, timeout=120, cwd=ROOT)
    assert proc.returncode == 0 and proc.stdout.startswith("no gmlake run with driver_busy_s (") and \
        proc.stdout.count("\n") == 1, proc.stdout
