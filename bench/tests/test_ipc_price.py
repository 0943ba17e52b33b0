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


def test_gmlake_ipc_runs_with_exportable_chunks_and_gmlake_without(monkeypatch):
    monkeypatch.setenv("GMLAKE_IPC", "1")
    assert harness.launch("gmlake-ipc", ["python"], ["x.py"])[1]["GMLAKE_IPC"] == "1"
    assert "GMLAKE_IPC" not in harness.launch("gmlake", ["python"], ["x.py"])[1]
