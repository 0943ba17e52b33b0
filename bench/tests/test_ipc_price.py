"""bench ipc-price on the host driver: the JSON it writes, the order it alternates, and its one-line refusals."""
import json
import statistics

import pytest

import gmlake
from bench import harness, ipc_price
from gmlake.sim.replay import driver_costs

CALLS = {"create_chunk", "map", "set_access", "unmap", "release_chunk"}


def test_it_writes_every_sample_and_prints_the_verdict(tmp_path, capsys):
    ipc_price.main(["--driver", "host", "--rounds", "3", "--calls", "2", "--steps", "4", "--out", str(tmp_path / "p.json")])
    got = json.loads((tmp_path / "p.json").read_text())
    assert got["environment"]["steps"] == 4 and got["environment"]["calls"] == 2
    for size in ("2MiB", "20MiB"):
        row = got["per_handle"][size]
        assert set(row["plain"]) == CALLS == set(row["exportable"]), "only the exported kind is exported"
        assert set(row["exported"]) == CALLS | {"export"}
        assert all(len(v) == 3 for kind in ("plain", "exportable", "exported") for v in row[kind].values()), \
            "one sample per round"
    assert [len(r) for r in got["steps"]["samples_ms"]["plain"]] == [4, 4, 4] == \
        [len(r) for r in got["steps"]["samples_ms"]["exportable"]]
    out = capsys.readouterr().out
    assert "| 20 MiB | export |" in out and "grow-and-release step" in out and "the default" in out


def test_the_summary_pairs_each_round_with_plain(tmp_path, benchmarks):
    """A ratio and an extra are each round's own, exportable against plain; the step's ratio is of the rounds'
    medians."""
    got = json.loads(_record(tmp_path).read_text())
    summary = benchmarks.ipc_summary(got)
    for size in ("2MiB", "20MiB"):
        row, samples = summary["per_handle"][size], got["per_handle"][size]
        for call in CALLS:
            pairs = list(zip(samples["exportable"][call], samples["plain"][call]))
            assert row["ratio"]["exportable"][call]["median"] == pytest.approx(statistics.median(a / b for a, b in pairs))
            assert row["extra_us"]["exportable"][call] == pytest.approx(statistics.median(a - b for a, b in pairs))
            spread = row["ratio"]["exportable"][call]
            assert spread["min"] <= spread["q1"] <= spread["median"] <= spread["q3"] <= spread["max"]
    steps = got["steps"]["samples_ms"]
    per_round = [statistics.median(e) / statistics.median(p) for e, p in zip(steps["exportable"], steps["plain"])]
    assert summary["steps"]["ratio"]["median"] == pytest.approx(statistics.median(per_round))


def test_rounds_alternate_the_order_of_kinds_and_steps_come_first(monkeypatch):
    """Prices: plain, exportable, exported one round, the reverse the next; steps interleaved A B B A, the first
    kind alternating by round, all before any export."""
    from bench import native

    seen = []
    real = native.load().time_driver_calls

    class Fake:
        @staticmethod
        def time_driver_calls(driver, size, calls, export=False, copies=True):
            seen.append(("export" if export else "price", drivers_by_id[id(driver)]))
            return real(driver, size, calls, export=export, copies=copies)

    monkeypatch.setattr(native, "load", lambda: Fake)
    drivers = {"plain": gmlake.HostDriver(), "exportable": gmlake.HostDriver()}
    drivers_by_id = {id(d): name for name, d in drivers.items()}
    monkeypatch.setattr(ipc_price, "time_step", lambda driver: seen.append(("step", drivers_by_id[id(driver)])) or 1.0)
    made = iter(drivers.values())
    monkeypatch.setattr(ipc_price.gmlake, "HostDriver", lambda: next(made))
    ipc_price.measure("host", 2, 1, 2)
    steps = [name for what, name in seen if what == "step"]
    assert steps == ["plain", "exportable"] + ["plain", "exportable", "exportable", "plain"] + \
        ["exportable", "plain", "plain", "exportable"], "one untimed step of each, then A B B A / B A A B"
    assert seen.index(("export", "exportable")) > max(i for i, (what, _) in enumerate(seen) if what == "step")
    prices = [("exported" if what == "export" else name) for what, name in seen if what != "step"]
    one = ["plain"] * 2 + ["exportable"] * 2 + ["exported"] * 2          # two sizes each
    assert prices == one + one[::-1]


@pytest.mark.parametrize("argv", [["--rounds", "1"], ["--calls", "0"], ["--steps", "0"], ["--driver", "sim"],
                                  ["--price-table", "/no/such/record.json"]])
def test_bad_arguments_are_one_line(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        ipc_price.main(argv)
    assert exit_.value.code == 2 and len(capsys.readouterr().err.strip().splitlines()) == 1


def test_gmlake_noipc_runs_without_exportable_chunks_and_gmlake_with_the_default(monkeypatch):
    monkeypatch.setenv("GMLAKE_IPC", "1")
    assert harness.launch("gmlake-noipc", ["python"], ["x.py"])[1]["GMLAKE_IPC"] == "0"
    assert "GMLAKE_IPC" not in harness.launch("gmlake", ["python"], ["x.py"])[1]


# ---------------------------------------------------------------- docs/benchmarks.md's section, from a record

def _record(tmp_path, ratio: float | None = None, step: tuple[float, float] | None = None,
            folder: str = "h100-2026-12-07"):
    """A record as `bench ipc-price --out` writes it (the host driver's, two rounds). Where asked, each exportable
    sample is its round's plain one times `ratio` less and more 1 % (quartiles 1 % of `ratio` apart), and the step's
    exportable samples are plain's times step[0] in the first round and step[1] in the second."""
    path = tmp_path / folder / "ipc-price.json"
    ipc_price.main(["--driver", "host", "--rounds", "2", "--calls", "2", "--steps", "2", "--out", str(path)])
    data = json.loads(path.read_text())
    if ratio is not None:
        for row in data["per_handle"].values():
            for call, plain in row["plain"].items():
                row["exportable"][call] = [plain[0] * ratio * 0.99, plain[1] * ratio * 1.01]
        step = step or (ratio, ratio)
        samples = data["steps"]["samples_ms"]
        samples["exportable"] = [[ms * factor for ms in plain] for plain, factor in zip(samples["plain"], step)]
    path.write_text(json.dumps(data))
    return path


def _old_record(tmp_path):
    """A record from before the per-handle prices: cuMemCreate alone, and one step per round."""
    path = tmp_path / "h100-2026-12-06" / "ipc-price.json"
    path.parent.mkdir(parents=True)
    row = {"plain": {"create_us": 9.7, "release_us": 11.1}, "exportable": {"create_us": 9.6, "release_us": 11.5,
                                                                           "export_us": 1065.0}, "create_ratio": 0.99}
    path.write_text(json.dumps({"environment": {"gpu": "NVIDIA H100 80GB HBM3", "date": "2026-12-06T23:15:41"},
                                "2MiB": row, "step_ms": {"plain": 1.2, "exportable": 1.4, "ratio": 1.18}}))
    return path


@pytest.mark.parametrize(("ratio", "step", "exportable"), [
    (1.004, None, True),                   # all within 5 %
    (1.06, None, False),                   # each call 6 % dearer
    (1.0, (0.96, 1.04), True),             # the step's rounds 8 points apart: quartiles 4 points apart, inside
    (1.0, (0.94, 1.06), None),             # quartiles 6 points apart: cannot decide
    (1.0, (1.07, 1.08), False),            # only the step dearer
])
def test_the_rule_weighs_a_handles_life_and_the_step_with_their_spread(tmp_path, benchmarks, ratio, step,
                                                                        exportable):
    decision = benchmarks.decide(json.loads(_record(tmp_path, ratio, step).read_text()))
    assert decision["exportable"] is exportable and not decision["lacks"]
    assert len(decision["judged"]) == 2 + 1, "a handle's life at each of two sizes, and the step"


def test_a_cheap_calls_noise_alone_does_not_stop_the_decision(tmp_path, benchmarks):
    """map costs half a µs on the GPU: its ratio moving by a fifth, while the handle's life moves by under 1 %,
    still decides (free), and the table shows map's own ratio beside it."""
    path = _record(tmp_path, 1.0)
    data = json.loads(path.read_text())
    for row in data["per_handle"].values():
        for kind in ("plain", "exportable"):
            row[kind] = {call: [100.0, 100.0] for call in row[kind]}
            row[kind]["map"] = [0.5, 0.5]
        row["exportable"]["map"] = [0.4, 0.6]
    path.write_text(json.dumps(data))
    decision = benchmarks.decide(data)
    assert decision["exportable"] is True, decision["judged"]
    text = benchmarks.ipc_price(str(path))
    assert "| 2 MiB | map | 0.50 | 0.50 | 1.000 (0.900-1.100) |" in text and "a handle's life" in text


def test_an_older_record_cannot_decide_and_says_what_it_lacks(tmp_path, benchmarks):
    assert benchmarks.decide(json.loads(_old_record(tmp_path).read_text())) == {
        "exportable": None, "judged": {}, "lacks": ["per_handle", "steps"]}


@pytest.fixture
def benchmarks():
    return pytest.importorskip("bench.report_docs.benchmarks")


def test_the_section_is_rendered_from_the_record(tmp_path, benchmarks):
    path = _record(tmp_path)
    summary = benchmarks.ipc_summary(json.loads(path.read_text()))
    text = benchmarks.ipc_price(str(path))
    for size in ("2", "20"):
        med, ratio = summary["per_handle"][f"{size}MiB"]["median_us"], summary["per_handle"][f"{size}MiB"]["ratio"]
        r = ratio["exportable"]["map"]
        assert (f"| {size} MiB | map | {med['plain']['map']:.2f} | {med['exportable']['map']:.2f} | "
                f"{r['median']:.3f} ({r['q1']:.3f}-{r['q3']:.3f}) |") in text
        assert f"| {size} MiB | export | | | | | {med['exported']['export']:.0f} | |" in text
    steps = summary["steps"]
    assert f"{steps['median_ms']['plain']:.3f} ms plain" in text and f"range {steps['ratio']['min']:.3f}" in text
    assert str(path) in text and "chunks are exportable by default (`GMLAKE_IPC=0` turns it off)" in text


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


@pytest.mark.parametrize(("ratio", "step", "said"), [
    (1.004, None, "are each within 5 % of plain, their quartiles no further apart: free, so the default is exportable"),
    (1.2, None, "cost more than 5 % over plain, so the default is not exportable"),
    (1.0, (0.9, 1.1), "grow-and-release step cannot decide (their quartiles further apart than 5 % of plain)")])
def test_the_section_says_what_the_record_decides(tmp_path, benchmarks, ratio, step, said):
    assert said in benchmarks.ipc_price(str(_record(tmp_path, ratio, step)))


def test_an_older_record_is_shown_with_what_it_lacks(tmp_path, benchmarks):
    text = benchmarks.ipc_price(str(_old_record(tmp_path)))
    assert "lacks `per_handle` and `steps`" in text and "cannot decide the default" in text
    assert "0.990 at 2 MiB" in text and "|" not in text, "its cuMemCreate ratio, no table"


def test_the_section_says_what_replay_prices_an_exportable_handle_at(tmp_path, benchmarks):
    extra = benchmarks.driver_costs()["per_handle_exportable_extra"]
    assert f"map {extra['map']:+g}" in benchmarks.ipc_price(str(_record(tmp_path)))


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
    """Chunks are exportable by default exactly where the newest GPU record finds every call of an exportable chunk
    that is not exported, and the grow-and-release step, free (bench/report_docs/benchmarks.py, decide)."""
    from gmlake.drivers._cuda_driver import EXPORTABLE_DEFAULT

    record = benchmarks.ipc_price_record()
    if record is None:
        pytest.skip("no bench/results/*/ipc-price.json yet (`python -m bench ipc-price --out ...` on a GPU)")
    decision = benchmarks.decide(json.loads((benchmarks.RESULTS / record).read_text()))
    if decision["exportable"] is None:
        pytest.skip(f"{record} cannot decide: lacks {decision['lacks']}" if decision["lacks"] else
                    f"{record} cannot decide: {decision['judged']}")
    assert EXPORTABLE_DEFAULT == decision["exportable"], (record, decision["judged"])


def test_the_cost_table_prices_exportable_handles_from_the_newest_record(benchmarks):
    """Replay's extra per exportable handle is the newest record's, where that record has per-handle prices;
    until one does, the provisional values say so."""
    costs, record = driver_costs(), benchmarks.ipc_price_record()
    data = json.loads((benchmarks.RESULTS / record).read_text()) if record else {}
    if "per_handle" not in data:
        assert "per_handle_exportable_result" not in costs and "Provisional" in costs["per_handle_exportable_note"]
        assert set(costs["per_handle_exportable_extra"]) == set(costs["per_handle"])
        return
    assert costs.get("per_handle_exportable_result") == record, "run `python -m bench ipc-price --price-table`"
    assert costs["per_handle_exportable_extra"] == benchmarks.table_extra(data)


def test_price_table_writes_a_records_extras_into_the_table(tmp_path, monkeypatch, capsys, benchmarks):
    table = tmp_path / "costs.json"          # a copy of the installed table (a wheel's tree has no source copy)
    table.write_text(json.dumps(driver_costs(), indent=2) + "\n")
    monkeypatch.setattr(benchmarks, "COST_TABLE", table)
    monkeypatch.setattr(benchmarks, "RESULTS", tmp_path)
    path = _record(tmp_path)
    ipc_price.main(["--price-table", str(path)])
    costs = json.loads(table.read_text())
    assert costs["per_handle_exportable_extra"] == benchmarks.table_extra(json.loads(path.read_text()))
    assert costs["per_handle_exportable_result"] == "h100-2026-12-07/ipc-price.json"
    assert "Provisional" not in costs["per_handle_exportable_note"] and "2 rounds of 2 2 MiB handles" in \
        costs["per_handle_exportable_note"]
    assert list(costs).index("per_handle_exportable_extra") == list(costs).index("per_handle") + 1
    assert "per_handle_exportable_extra" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_:         # an older record has no per-handle prices: one line
        ipc_price.main(["--price-table", str(_old_record(tmp_path))])
    assert exit_.value.code == 2 and "no per-handle prices" in capsys.readouterr().err


def test_without_a_gpu_it_says_so_in_one_line(capsys):
    if gmlake.cuda_available():
        pytest.skip("a CUDA driver is here")
    with pytest.raises(SystemExit) as exit_:
        ipc_price.main(["--rounds", "2", "--calls", "1", "--steps", "1"])
    assert str(exit_.value.code).startswith("bench ipc-price: ") and "\n" not in str(exit_.value.code)


@pytest.mark.gpu
def test_on_the_gpu_each_kind_is_priced_and_only_exported_chunks_export(tmp_path, benchmarks):
    """A short run on the CUDA driver: every call of every kind timed, the export costing something, and a verdict
    (any) that the section renders."""
    path = tmp_path / "ipc-price.json"
    ipc_price.main(["--rounds", "2", "--calls", "4", "--steps", "2", "--out", str(path)])
    data = json.loads(path.read_text())
    assert all(us > 0 for row in data["per_handle"].values() for kind in row.values() for v in kind.values()
               for us in v)
    assert benchmarks.decide(data)["judged"] and "| 2 MiB | export |" in benchmarks.ipc_price(str(path))
