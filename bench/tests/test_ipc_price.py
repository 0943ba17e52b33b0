"""bench ipc-price on the host driver: the JSON it writes, the order it alternates, and its one-line refusals."""
import json

import pytest

from bench import harness, ipc_price


def test_it_writes_every_price_and_the_step(tmp_path, capsys):
    ipc_price.main(["--driver", "host", "--rounds", "2", "--calls", "2", "--out", str(tmp_path / "p.json")])
    got = json.loads((tmp_path / "p.json").read_text())
    for size in ("2MiB", "20MiB"):
        assert set(got[size]["plain"]) == {"create_us", "release_us"}, "a plain chunk is never exported"
        assert set(got[size]["exportable"]) == {"create_us", "release_us", "export_us"}
        assert got[size]["create_ratio"] == got[size]["exportable"]["create_us"] / got[size]["plain"]["create_us"]
    assert len(got["step_ms"]["samples"]["plain"]) == 2 == len(got["step_ms"]["samples"]["exportable"])
    assert "export+close" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["--rounds", "1"], ["--calls", "0"], ["--driver", "sim"]])
def test_bad_arguments_are_one_line(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        ipc_price.main(argv)
    assert exit_.value.code == 2 and len(capsys.readouterr().err.strip().splitlines()) == 1


def test_gmlake_noipc_runs_without_exportable_chunks_and_gmlake_with_the_default(monkeypatch):
    monkeypatch.setenv("GMLAKE_IPC", "1")
    assert harness.launch("gmlake-noipc", ["python"], ["x.py"])[1]["GMLAKE_IPC"] == "0"
    assert "GMLAKE_IPC" not in harness.launch("gmlake", ["python"], ["x.py"])[1]


# ---------------------------------------------------------------- docs/benchmarks.md's section, from a record

def _record(tmp_path, ratio: float | None = None):
    """A record as `bench ipc-price --out` writes it (the host driver's, two rounds), its ratios set where asked."""
    path = tmp_path / "h100-2026-12-07" / "ipc-price.json"
    ipc_price.main(["--driver", "host", "--rounds", "2", "--calls", "2", "--out", str(path)])
    if ratio is not None:
        data = json.loads(path.read_text())
        for size in ("2MiB", "20MiB"):
            data[size]["create_ratio"] = ratio
        path.write_text(json.dumps(data))
    return path


@pytest.fixture
def benchmarks():
    return pytest.importorskip("bench.report_docs.benchmarks")


def test_the_section_is_rendered_from_the_record(tmp_path, benchmarks):
    path = _record(tmp_path)
    data = json.loads(path.read_text())
    text = benchmarks.ipc_price(str(path))
    for size in ("2", "20"):
        row = data[f"{size}MiB"]
        assert (f"| {size} MiB | {row['plain']['create_us']:.2f} | {row['exportable']['create_us']:.2f} | "
                f"{row['create_ratio']:.3f} | {row['exportable']['export_us']:.0f} |") in text
    assert f"{data['step_ms']['plain']:.2f} ms plain" in text and str(path) in text
    assert "exportable by default (`GMLAKE_IPC=0` turns it off)" in text


def test_training_steps_beside_the_record_are_shown(tmp_path, benchmarks):
    """A speed-ab record of gmlake-noipc against the default, beside the price, becomes a table under it; without one
    the section has none."""
    path = _record(tmp_path)
    assert "Warm training steps" not in benchmarks.ipc_price(str(path))
    env = {"gpu": "NVIDIA H100 80GB HBM3", "nvidia_driver": "580", "torch": "2.11.0", "python": "3.12",
           "date": "2026-12-07T00:00:00", "command": "bench speed-ab --allocators gmlake-noipc gmlake"}
    rows = [{"workload": "bert", "allocator": "gmlake-noipc", "warm_sum_s": [1.5, 1.51], "spread_pct": 0.7},
            {"workload": "bert", "allocator": "gmlake", "warm_sum_s": [1.505, 1.5], "spread_pct": 0.3, "ratio": 0.998,
             "ratio_spread_pct": 1.0, "verdict": "within 2%"}]
    (path.parent / benchmarks.IPC_STEPS).write_text(json.dumps({"environment": env, "rows": rows}))
    text = benchmarks.ipc_price(str(path))
    assert "| bert | gmlake | 1.50 / 1.50 | 0.3 % | 0.998 (1.0 %) | within 2% |" in text
    assert "| bert | gmlake-noipc | 1.50 / 1.51 | 0.7 % | baseline |" in text


@pytest.mark.parametrize(("ratio", "said"), [(1.004, "1.004 times plain, within 5 %"),
                                             (1.2, "1.200 times plain, more than 5 % over")])
def test_the_section_says_whether_exportable_costs_at_create(tmp_path, benchmarks, ratio, said):
    assert said in benchmarks.ipc_price(str(_record(tmp_path, ratio)))


def test_without_a_record_the_section_says_how_to_make_one(benchmarks, monkeypatch, tmp_path):
    monkeypatch.setattr(benchmarks, "RESULTS", tmp_path)
    assert benchmarks.ipc_price_record() is None
    text = benchmarks.ipc_price()
    assert text.startswith("Not measured yet: `python -m bench ipc-price --out") and "|" not in text


def test_the_newest_record_is_the_one_shown(benchmarks, monkeypatch, tmp_path):
    for folder in ("h200-2026-12-08", "h100-2026-12-09b", "h100-2026-12-07"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "ipc-price.json").write_text("{}")
    monkeypatch.setattr(benchmarks, "RESULTS", tmp_path)
    assert benchmarks.ipc_price_record() == "h100-2026-12-09b/ipc-price.json"


def test_the_default_follows_from_the_measured_price(benchmarks):
    """Chunks are exportable by default exactly where the newest GPU record finds cuMemCreate no dearer for it."""
    from gmlake.drivers._cuda_driver import EXPORTABLE_DEFAULT

    record = benchmarks.ipc_price_record()
    if record is None:
        pytest.skip("no bench/results/*/ipc-price.json yet (`python -m bench ipc-price --out ...` on a GPU)")
    data = json.loads((benchmarks.RESULTS / record).read_text())
    worst = max(data[k]["create_ratio"] for k in data if k.endswith("MiB"))
    assert EXPORTABLE_DEFAULT == (worst <= benchmarks.IPC_SAME), (record, worst)
