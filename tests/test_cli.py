"""The gmlake command line: bad input gets one line on stderr and exit 2, failed replays say so, nothing is
half-written, and the small conveniences (units, bundled traces by name, --version) work."""
from __future__ import annotations

import gzip
import json
import os
import pickle
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from gmlake import __version__
from gmlake.cli import EXIT_BAD_INPUT, EXIT_OK, EXIT_OUT_OF_MEMORY, main
from gmlake.policies.settings import parse_bool, parse_size
from gmlake.sim.replay import bundled_traces, replay
from gmlake.sim.trace import EVENT_DTYPE, Trace, TraceError, load

TINY = "tests/data/tiny-gpt2-native.pickle.gz"
BUNDLED = bundled_traces()[0].name.removesuffix(".gmtrace")


def one_error_line(capsys, *words: str) -> str:
    """The command's stderr, checked to be one `gmlake: error:` line with no traceback, holding every word."""
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("gmlake: error: "), err
    assert "Traceback" not in err and "gmlake: error: gmlake:" not in err, err
    for word in words:
        assert word in err, (word, err)
    return err


def write_snapshot(path, entries, meta=None):
    snapshot = {"device_traces": [entries]}
    if meta is not None:
        snapshot["gmlake"] = meta
    path.write_bytes(gzip.compress(pickle.dumps(snapshot)))
    return str(path)


# ------------------------------------------------------------------------- item 1: resource exhaustion


def test_crafted_2_to_62_snapshot_ends_in_bounded_time_and_memory(tmp_path):
    """A 100-byte snapshot holding one alloc of 2^62 bytes: refused at once with one clear line, exit 2, in under
    5 s and under 2 GiB of address space (it used to map 4 billion chunks and take 16.8 GB)."""
    bad = tmp_path / "huge.pickle"
    bad.write_bytes(pickle.dumps({"device_traces": [[{"action": "alloc", "addr": 4096, "size": 1 << 62,
                                                       "stream": 0}]]}))
    assert bad.stat().st_size < 130

    def cap_memory():
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))

    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "gmlake", "replay", str(bad), "--policy", "gmlake"],
                          capture_output=True, check=False, text=True, timeout=60, preexec_fn=cap_memory)
    assert time.monotonic() - start < 5
    assert done.returncode == EXIT_BAD_INPUT, done.stderr
    assert done.stderr.count("\n") == 1 and "more than any device holds" in done.stderr, done.stderr


def test_a_huge_request_in_a_trace_object_is_an_oom_in_bounded_time():
    """Through the Python API no reader refuses it: the modelled device is always bounded, so the request is an
    out-of-memory after at most MAX_DEVICE_MEMORY worth of chunks, and the replay says it failed."""
    events = np.array([(0, 0, 1 << 62, 0), (0, 0, 1 << 30, 1), (1, 0, 1 << 30, 1)], dtype=EVENT_DTYPE)
    start = time.monotonic()
    result = replay(Trace(events, {}), "gmlake")
    assert time.monotonic() - start < 5
    assert result.ooms == 1 and result.failed and 1 << 30 <= result.peak_reserved < 2 << 30


def test_sparse_allocation_ids_do_not_size_the_replay(tmp_path):
    """A .gmtrace with an allocation id of 2^32 - 1 replays with a table as long as the trace, not 32 GiB."""
    events = np.array([(0, 0, 4096, 0xFFFF_FFFF), (1, 0, 4096, 0xFFFF_FFFF)], dtype=EVENT_DTYPE)
    result = replay(Trace(events, {}), "caching")
    assert result.ooms == 0 and result.peak_allocated == 4096


@pytest.mark.parametrize("meta", [{"device_total": 1 << 62}, {"device_total": "lots"}])
def test_recorded_device_size_is_bounded_and_typed(tmp_path, meta):
    path = write_snapshot(tmp_path / "t.pickle.gz", [{"action": "alloc", "addr": 1, "size": 4096}], meta)
    if isinstance(meta["device_total"], int):
        with pytest.raises(TraceError, match="more than any device"):
            load(path)
    else:
        assert "device_total" not in load(path).meta


def test_gmtrace_header_is_untrusted(tmp_path):
    """A .gmtrace header's values are typed like a snapshot's: a string device_total must not reach the replay."""
    from gmlake.sim.trace import save_compact

    trace = load(TINY)
    trace.meta["device_total"] = "lots"
    trace.meta["max_memory_reserved"] = [1]
    out = save_compact(trace, tmp_path / "t.gmtrace")
    again = load(out)
    assert "device_total" not in again.meta and "max_memory_reserved" not in again.meta
    assert main(["replay", str(out), "--policy", "caching", "--json"]) == EXIT_OK


# ------------------------------------------------------------------------- item 4: tracebacks and exit 1


@pytest.mark.parametrize("args, words", [
    (["replay", TINY, "--set", "name=foo"], ["no knob 'name'"]),
    (["replay", TINY, "--device-memory", "99999999999999999999999999"], ["--device-memory", "at most 4 TiB"]),
    (["explain", TINY, "--device-memory", "1"], ["served no request"]),
    (["replay", TINY, "--device-memory", "-1"], ["--device-memory", "at least 1 B"]),
    (["replay", TINY, "--device-memory", "lots"], ["--device-memory", "whole number"]),
    (["replay", TINY, "--policy", "gmlake", "--set", "bogus=1"], ["policy gmlake has no knob 'bogus'"]),
    (["replay", TINY, "--event-lag", "-1"], ["--event-lag", "0 or more"]),
    (["compare", TINY, "--event-lag", "soon"], ["--event-lag", "whole number of requests"]),
])
def test_bad_arguments_get_one_line_and_exit_2(capsys, args, words):
    assert main(args) == EXIT_BAD_INPUT
    one_error_line(capsys, *words)


def test_explain_on_a_snapshot_with_no_allocations(tmp_path, capsys):
    path = write_snapshot(tmp_path / "frees.pickle.gz", [{"action": "segment_alloc", "addr": 0, "size": 2 << 20},
                                                        {"action": "free_completed", "addr": 64, "size": 512}])
    assert main(["explain", path]) == EXIT_BAD_INPUT
    one_error_line(capsys, "no allocations to explain")


def test_compare_into_a_file_fails_before_replaying(tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("keep")
    assert main(["compare", TINY, "--out", str(afile)]) == EXIT_BAD_INPUT
    out = capsys.readouterr()
    assert out.out == "" and "is a file, not a folder" in out.err and out.err.count("\n") == 1
    assert afile.read_text() == "keep"


@pytest.mark.parametrize("args, words", [
    (["compare", TINY, "--policy", "gmlake", "--out", "{tmp}/missing/out"], ["--out", "no such directory", "missing"]),
    (["compare", TINY, "--policy", "gmlake", "--out", "{tmp}/afile/out"], ["--out", "is a file, not a folder"]),
    (["compare", TINY, "--policy", "gmlake", "--out", "{tmp}/locked/out"], ["--out", "permission denied"]),
    (["compare", TINY, "--policy", "gmlake", "--out", "{tmp}/locked"], ["--out", "permission denied"]),
    (["tune", TINY, "--jobs", "1", "--plot", "{tmp}/missing/tune.png"], ["--plot", "no such directory"]),
    (["tune", TINY, "--jobs", "1", "--plot", "{tmp}/locked/tune.png"], ["--plot", "permission denied"]),
    (["convert", TINY, "-o", "{tmp}/locked/x.gmtrace"], ["--output", "permission denied"]),
    (["capture", "-o", "{tmp}/locked/run.pickle.gz", "--", "python", "-c", "pass"], ["--output", "permission denied"]),
])
def test_an_output_path_that_cannot_be_written_fails_before_any_work(tmp_path, capsys, args, words):
    """Every option that writes a file or folder is checked before any replay: one line, exit 2, no table printed
    and nothing written (compare used to print its whole table, then fail)."""
    (tmp_path / "afile").write_text("keep")
    (tmp_path / "locked").mkdir(mode=0o500)
    if os.access(tmp_path / "locked", os.W_OK) and "locked" in " ".join(args):
        pytest.skip("running as root: no folder is locked")
    try:
        assert main([a.format(tmp=tmp_path) for a in args]) == EXIT_BAD_INPUT
        out = capsys.readouterr()
        assert out.out == "" and out.err.count("\n") == 1 and out.err.startswith("gmlake: error: "), out
        for word in words:
            assert word in out.err, (word, out.err)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "locked"]
        assert list((tmp_path / "locked").iterdir()) == []
    finally:
        (tmp_path / "locked").chmod(0o700)


@pytest.mark.parametrize("target", ["adir.gmtrace", "missing/x.gmtrace", "x.pickle"])
def test_convert_refuses_outputs_it_cannot_write_and_leaves_nothing(tmp_path, capsys, target):
    (tmp_path / "adir.gmtrace").mkdir()
    assert main(["convert", TINY, "-o", str(tmp_path / target)]) == EXIT_BAD_INPUT
    one_error_line(capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adir.gmtrace"]


def test_capture_into_a_missing_directory(tmp_path, capsys):
    script = tmp_path / "train.py"
    script.write_text("")
    assert main(["capture", "-o", str(tmp_path / "no" / "run.pickle.gz"), "--", "python", str(script)]) == 2
    one_error_line(capsys, "no such directory")


def test_save_compact_removes_its_temporary_file_on_failure(tmp_path):
    from gmlake.sim.trace import save_compact

    (tmp_path / "adir").mkdir()
    with pytest.raises(OSError):
        save_compact(load(TINY), tmp_path / "adir")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adir"]


def _fake_cpu_torch(tmp_path, monkeypatch):
    """A `torch` that imports but, like a CPU-only build, has no CUDA."""
    pkg = tmp_path / "fake" / "torch"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("__version__ = '9.9.9+cpu'\nclass version:\n    cuda = None\n"
                                     "class _C:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path / "fake"))
    # Recorded, so that the fake the test imports leaves sys.modules with it (a later importorskip must not find it).
    monkeypatch.setitem(sys.modules, "torch", None)
    monkeypatch.delitem(sys.modules, "torch")


@pytest.mark.parametrize("command", [["run"], ["capture", "--", "python"]])
def test_cpu_only_torch_is_named(tmp_path, monkeypatch, capsys, command):
    _fake_cpu_torch(tmp_path, monkeypatch)
    marker = tmp_path / "ran"
    script = tmp_path / "train.py"
    script.write_text(f"open({str(marker)!r}, 'w').close()\n")
    assert main([*command, str(script)]) == EXIT_BAD_INPUT
    one_error_line(capsys, "has no CUDA", "9.9.9+cpu")
    assert not marker.exists()


# ------------------------------------------------------------------------- item 5: silently wrong


@pytest.mark.parametrize("text, expected", [("false", False), ("0", False), ("no", False), ("OFF", False),
                                            ("true", True), ("1", True), ("Yes", True), ("on", True)])
def test_booleans_parse_strictly(text, expected):
    assert parse_bool(text) is expected


@pytest.mark.parametrize("value", ["no", "off"])
def test_stitch_no_and_off_turn_stitching_off(capsys, value):
    assert main(["replay", TINY, "--policy", "gmlake", "--set", f"stitch={value}", "--json"]) == EXIT_OK
    assert json.loads(capsys.readouterr().out)["stitches"] == 0
    assert replay(load(TINY), "gmlake").stats["stitches"] > 0


@pytest.mark.parametrize("value", ["maybe", "2", "", "nope"])
def test_stitch_maybe_is_refused(capsys, value):
    assert main(["replay", TINY, "--policy", "gmlake", "--set", f"stitch={value}"]) == EXIT_BAD_INPUT
    one_error_line(capsys, "knob stitch must be one of")


def test_run_takes_dash_m_module(monkeypatch, capsys):
    """`gmlake run -m module args` reaches the program check (here: no CUDA torch), not `unrecognized -m`."""
    from gmlake.cli import job

    asked = []

    def no_cuda(what: str) -> str:
        asked.append(what)
        return "stop here"

    monkeypatch.setattr(job, "_torch_cuda_problem", no_cuda)
    monkeypatch.setitem(sys.modules, "torch", sys.modules.get("torch") or type(sys)("torch"))
    assert main(["run", "--policy", "caching", "-m", "json.tool", "--sort-keys", "x"]) == EXIT_BAD_INPUT
    one_error_line(capsys, "stop here")
    assert asked == ["run"]


def test_program_options_are_the_programs():
    """Options after the script belong to the program, -m and all."""
    from gmlake.cli import _mark_program_start, build_parser

    parser = build_parser()
    args = parser.parse_args(_mark_program_start(["run", "--limit", "2GiB", "t.py", "--policy", "x", "-m"], parser))
    assert args.limit == 2 << 30 and args.policy is None and args.program[-4:] == ["t.py", "--policy", "x", "-m"]
    args = parser.parse_args(_mark_program_start(["capture", "-o", "o.gz", "python", "-m", "m", "--x"], parser))
    assert args.output == "o.gz" and args.program[-4:] == ["python", "-m", "m", "--x"]


def test_capture_runs_a_bare_python_as_this_interpreter(tmp_path, monkeypatch):
    from gmlake.cli import job

    calls = []
    monkeypatch.setattr(job, "_torch_cuda_problem", lambda what: None)
    monkeypatch.setattr(subprocess, "call", lambda cmd, env: calls.append(cmd) or 0)
    script = tmp_path / "train.py"
    script.write_text("")
    assert main(["capture", "-o", str(tmp_path / "r.pickle.gz"), "--", "python3", str(script), "--lr", "1"]) == 0
    assert calls[0][0] == sys.executable and calls[0][-3:] == [str(script), "--lr", "1"]


# ------------------------------------------------------------------------- item 6: OOMs in results


def test_a_replay_with_ooms_says_so_in_table_json_and_status(capsys):
    assert main(["replay", TINY, "--policy", "caching", "--device-memory", "1"]) == EXIT_OUT_OF_MEMORY
    out = capsys.readouterr().out
    assert "FAILED" in out and "failed" in out and "1.0000" not in out
    assert main(["replay", TINY, "--policy", "caching", "--device-memory", "1", "--json"]) == EXIT_OUT_OF_MEMORY
    row = json.loads(capsys.readouterr().out)
    assert row["failed"] is True and row["ooms"] > 0 and row["utilization"] is None
    assert main(["replay", TINY, "--policy", "caching", "--json"]) == EXIT_OK
    row = json.loads(capsys.readouterr().out)
    assert row["failed"] is False and row["ooms"] == 0 and 0 < row["utilization"] < 1


def test_a_failed_replay_has_no_utilization():
    result = replay(load(TINY), "caching", device_memory=1)
    assert result.failed and result.peak_reserved == 0
    assert not result.utilization >= 0          # NaN, not the 1.0 of "nothing reserved, all used"


def test_explain_and_compare_exit_3_on_ooms(tmp_path, capsys):
    assert main(["explain", TINY, "--policy", "caching", "--device-memory", "1GiB"]) == EXIT_OUT_OF_MEMORY
    assert "FAILED" in capsys.readouterr().out
    assert main(["compare", TINY, "--policy", "caching", "--device-memory", "1GiB", "--out", str(tmp_path)]) == 3
    rows = [json.loads(line) for line in (tmp_path / "compare.jsonl").read_text().splitlines()]
    assert rows[0]["failed"] and not list(tmp_path.glob("*.tmp"))


# ------------------------------------------------------------------------- --cap on compare and explain

# As --cap reads it. On TINY expandable fits under it, below its uncapped peak, and caching runs out.
CAP = parse_size("1.9GiB", round_down=True)


def test_compare_under_a_cap_replays_each_policy_under_it(tmp_path, capsys):
    """compare --cap: every row is replay(trace, policy, cap=...) and records the cap; the policy that runs out
    under the cap is marked failed, and the title and caption say it was a cap."""
    trace = load(TINY)
    want = {p: replay(trace, p, cap=CAP) for p in ("caching", "expandable")}
    assert want["caching"].failed and not want["expandable"].failed
    assert want["expandable"].peak_reserved < replay(trace, "expandable").peak_reserved   # the cap binds
    args = ["compare", TINY, "--policy", "caching", "--policy", "expandable", "--cap", "1.9GiB"]
    assert main([*args, "--out", str(tmp_path)]) == EXIT_OUT_OF_MEMORY
    out = " ".join(capsys.readouterr().out.split())
    assert "under a 1.900 GiB memory cap" in out
    assert "FAILED: 1 of 2 replays ran out of memory under the memory cap" in out
    rows = {row["policy"]: row for row in map(json.loads, (tmp_path / "compare.jsonl").read_text().splitlines())}
    for policy, result in want.items():
        got = rows[policy]
        assert got["cap"] == CAP and got["failed"] == result.failed and got["ooms"] == result.ooms, (policy, got)
        assert (got["peak_reserved"], got["peak_allocated"]) == (result.peak_reserved, result.peak_allocated)
    assert rows["caching"]["utilization"] is None


def test_explain_under_a_cap_explains_the_capped_replay(capsys):
    """explain --cap: both of its replays (the whole trace, then up to the moment) run under the cap, so its peak is
    replay's under the cap; a policy that runs out under it exits 3 and says so."""
    trace = load(TINY)
    assert main(["explain", TINY, "--policy", "expandable", "--policy", "caching", "--cap", "1.9GiB",
                 "--json"]) == EXIT_OUT_OF_MEMORY
    rows = {row["policy"]: row for row in map(json.loads, capsys.readouterr().out.splitlines())}
    for policy, row in rows.items():
        result = replay(trace, policy, cap=CAP)
        assert row["cap"] == CAP and row["ooms"] == result.ooms, (policy, row)
        assert row["peak_reserved"] == result.peak_reserved and row["peak_request_index"] == result.peak_event
        assert row["request_index"] == result.peak_growth_event
        assert row["reserved"] == result.reserved_at_peak_growth <= CAP
    assert rows["expandable"]["peak_reserved"] < replay(trace, "expandable").peak_reserved
    assert main(["explain", TINY, "--policy", "caching", "--cap", "1.9GiB"]) == EXIT_OUT_OF_MEMORY
    out = " ".join(capsys.readouterr().out.split())
    assert "under a 1.900 GiB memory cap" in out and "caching: 1 requests out of memory under the memory cap" in out


def test_explain_under_a_cap_too_small_for_any_request(capsys):
    assert main(["explain", TINY, "--policy", "gmlake", "--cap", "1MiB"]) == EXIT_BAD_INPUT
    one_error_line(capsys, "served no request", "under a 1 MiB memory cap")


@pytest.mark.parametrize("command", ["replay", "explain", "compare"])
@pytest.mark.parametrize("cap, words", [(["--cap", "0"], ["at least 1 B"]), (["--cap", "lots"], ["whole number"]),
                                        (["--cap", "-1GiB"], []), (["--cap=-1GiB"], ["at least 1 B"]),
                                        (["--cap", "5TiB"], ["at most 4 TiB"])])
def test_a_bad_cap_is_one_line_and_exit_2_for_every_replaying_command(tmp_path, capsys, command, cap, words):
    out = tmp_path / "out"
    extra = ["--out", str(out)] if command == "compare" else []
    assert main([command, TINY, "--policy", "caching", *cap, *extra]) == EXIT_BAD_INPUT
    one_error_line(capsys, "argument --cap", *words)
    assert not out.exists()


def test_cap_words_name_every_cap():
    from gmlake.sim.compare import cap_words

    assert cap_words([0, 0]) == ""
    assert cap_words([CAP, CAP]) == " under a 1.900 GiB memory cap"
    assert cap_words([CAP, 0, 1 << 30]) == " under memory caps of none, 1.000, 1.900 GiB"


# ------------------------------------------------------------------------- item 7: messages


def test_no_doubled_prefix(capsys):
    assert main(["replay", TINY, "--policy", "gmlake", "--set", "min_saved_chunks=-1"]) == EXIT_BAD_INPUT
    one_error_line(capsys, "min_saved_chunks")


@pytest.mark.parametrize("spec, setting", [("gmlake", ["--set", "round_to=-1"]),
                                           ("gmlake[round_to=0]", [])])
def test_a_knob_that_fails_validation_names_its_policy_once(capsys, spec, setting):
    assert main(["replay", TINY, "--policy", spec, *setting]) == EXIT_BAD_INPUT
    err = one_error_line(capsys, f"policy {spec}: round_to must be a positive int")
    assert err.count("policy ") == 1, err


def test_an_empty_gmtrace_is_called_empty(tmp_path, capsys):
    empty = tmp_path / "run.gmtrace"
    empty.write_bytes(b"")
    assert main(["replay", str(empty)]) == EXIT_BAD_INPUT
    err = one_error_line(capsys, "empty file")
    assert "pickle (" not in err
    notxz = tmp_path / "other.gmtrace"
    notxz.write_bytes(b"hello")
    assert main(["replay", str(notxz)]) == EXIT_BAD_INPUT
    one_error_line(capsys, "not a .gmtrace file")


def test_trace_names_are_not_rich_markup(tmp_path, capsys):
    path = write_snapshot(tmp_path / "t.pickle.gz", [{"action": "alloc", "addr": 1, "size": 4096}],
                          {"name": "[/bold] $\\alpha$ [red]x"})
    assert main(["replay", path, "--policy", "caching"]) == EXIT_OK
    assert "[/bold]" in capsys.readouterr().out
    assert main(["compare", path, "--policy", "caching", "--out", str(tmp_path / "o")]) == EXIT_OK


# ------------------------------------------------------------------------- issue 14, item 4


def test_version(capsys):
    assert main(["--version"]) == EXIT_OK
    assert capsys.readouterr().out.strip() == f"gmlake {__version__}"


def test_bundled_traces_are_listed_and_usable_by_name(capsys):
    assert main(["traces", "--names"]) == EXIT_OK
    names = capsys.readouterr().out.split()
    assert BUNDLED in names and len(names) == len(bundled_traces())
    assert main(["traces"]) == EXIT_OK
    assert BUNDLED in capsys.readouterr().out
    assert main(["replay", BUNDLED, "--policy", "caching", "--json"]) == EXIT_OK
    assert json.loads(capsys.readouterr().out)["trace"] == BUNDLED


@pytest.mark.parametrize("text, value", [("80GiB", 80 << 30), ("80G", 80 << 30), ("80GB", 80 * 10**9),
                                         ("1.5 GiB", 3 << 29), ("4096", 4096), ("2_048KiB", 2 << 20)])
def test_sizes_take_units(text, value):
    assert parse_size(text) == value


def test_device_memory_takes_units(capsys):
    assert main(["replay", TINY, "--policy", "caching", "--device-memory", "1GiB", "--json"]) == 3
    assert main(["replay", TINY, "--policy", "caching", "--device-memory", "140GiB", "--json"]) == 0
    assert main(["replay", TINY, "--policy", "caching", "--device-memory", "139.5GiB", "--json"]) == 0
    assert main(["replay", TINY, "--policy", "gmlake-paper", "--set", "chunk_size=4.0000001MiB"]) == 2  # knobs: exact
    assert main(["replay", TINY, "--policy", "gmlake-paper", "--set", "chunk_size=4MiB", "--json"]) == 0


def test_convert_says_what_it_writes_and_names_its_output(tmp_path, capsys):
    src = tmp_path / "run.pickle.gz"
    src.write_bytes(Path(TINY).read_bytes())
    assert main(["convert", str(src)]) == EXIT_OK
    assert "compact .gmtrace format" in capsys.readouterr().out
    assert len(load(tmp_path / "run.gmtrace")) == len(load(TINY))


def test_every_option_has_help_and_policy_help_names_them():
    from gmlake import policies
    from gmlake.cli import build_parser

    parser = build_parser()
    subs = next(a for a in parser._actions if a.dest == "command").choices
    for name, sub in subs.items():
        for action in sub._actions:
            assert action.help, (name, action.option_strings or action.dest)
            if action.dest == "policy":
                assert all(p in action.help for p in policies.names()), (name, action.help)


def test_console_script_errors_are_one_line(tmp_path):
    done = subprocess.run([sys.executable, "-m", "gmlake", "replay", TINY, "--set", "stitch=maybe"],
                          capture_output=True, check=False, text=True, timeout=60, env={**os.environ, "COLUMNS": "80"})
    assert done.returncode == EXIT_BAD_INPUT and done.stdout == ""
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("gmlake: error: ")


def test_a_trace_without_a_device_size_is_noted_once(tmp_path, capsys):
    """A snapshot that records no device size replays on the largest device; the commands say so in one line on
    stderr, and not where --device-memory gives the size or the trace records it."""
    path = write_snapshot(tmp_path / "unsized.pickle.gz", [{"action": "alloc", "addr": 1, "size": 4096}],
                          {"name": "unsized"})
    assert main(["replay", str(path), "--policy", "gmlake", "--json"]) == EXIT_OK
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unsized records no device size" in err and "--device-memory" in err
    assert main(["compare", str(path), BUNDLED, "--policy", "gmlake", "--out", str(tmp_path / "c")]) == EXIT_OK
    assert capsys.readouterr().err.count("records no device size") == 1
    assert main(["explain", str(path), "--policy", "gmlake", "--device-memory", "1GiB"]) == EXIT_OK
    assert "records no device size" not in capsys.readouterr().err


def test_compare_keeps_traces_of_the_same_name_apart(tmp_path, capsys):
    """Results, the real-reserved column and the plot are keyed by a trace's name: a second trace of the same name
    (here two files whose header says the same name but different real peaks) is shown as `NAME (2)` with its own
    rows, not under the first one's figures."""
    from gmlake.sim.trace import save_compact

    trace = load(TINY)
    paths = []
    for i, peak in enumerate((3 << 30, 5 << 30)):
        paths.append(save_compact(Trace(trace.events, {**trace.meta, "name": "run", "max_memory_reserved": peak}),
                                  tmp_path / f"run{i}.gmtrace"))
    assert main(["compare", *map(str, paths), "--policy", "expandable", "--out", str(tmp_path / "out")]) == EXIT_OK
    captured = capsys.readouterr()
    assert "named 'run' like an earlier trace; shown as 'run (2)'" in captured.err
    rows = [json.loads(line) for line in (tmp_path / "out" / "compare.jsonl").read_text().splitlines()]
    assert [row["trace"] for row in rows] == ["run", "run (2)"]
    first, second = [line for line in captured.out.splitlines() if "│ run" in line]
    assert "3.000" in first and "5.000" in second       # each row shows its own trace's real peak


def test_explain_at_an_event_lag_explains_that_replay():
    """explain --event-lag: both replays complete events that many requests late, as replay --event-lag does, so
    FSDP's peak can be explained where the GPU trails (at lag 100, rank 1's default peak holds 1.29 GiB of free
    whole pages that other streams freed and no event has handed over yet)."""
    from pathlib import Path

    path = str(Path(__file__).parent / "data" / "results" / "traces"
               / "opt1.3b-fsdp-lora-ckpt-12steps-native.rank1.gmtrace")
    trace = load(path)
    found = {}
    for lag in (0, 100):
        result = replay(trace, "gmlake", event_lag=lag)
        proc = subprocess.run([sys.executable, "-m", "gmlake", "explain", path, "--policy", "gmlake", "--json",
                               "--event-lag", str(lag)], capture_output=True, text=True, timeout=120, check=False)
        assert proc.returncode == 0, proc.stderr
        row = found[lag] = json.loads(proc.stdout)
        assert row["event_lag"] == lag and row["peak_reserved"] == result.peak_reserved
        assert row["request_index"] == result.peak_growth_event
    assert found[100]["peak_reserved"] > found[0]["peak_reserved"]
    assert found[100]["free_whole_chunks"] > found[0]["free_whole_chunks"]


# ------------------------------------------------------------------------- GMLAKE_KNOBS in the replay commands


@pytest.mark.parametrize("value, words", [
    ("stitch=perhaps", ["knob stitch must be one of"]),
    ("bogus=1", ["no knob 'bogus'"]),
    ("min_saved_chunks=4MiB", ["knob min_saved_chunks must be a whole number (count)"]),
    ("stitch", ["knob=value"]),
    ("chunk_size=8MiB", ["chunk_size does nothing"]),
])
@pytest.mark.parametrize("command", [["replay", TINY, "--policy", "gmlake"], ["explain", TINY, "--policy", "gmlake"],
                                     ["compare", TINY, "--policy", "gmlake", "--out", "{tmp}"],
                                     ["tune", TINY, "--jobs", "1"]])
def test_a_bad_gmlake_knobs_is_one_line_and_exit_2_never_the_defaults(monkeypatch, capsys, tmp_path, command, value,
                                                                      words):
    """GMLAKE_KNOBS, read by the one reader `GMLAKE=1` and `gmlake run` use (env_knobs), is refused by every
    command that replays, before any replay: it used to be ignored, so a typo replayed the defaults."""
    monkeypatch.setenv("GMLAKE_KNOBS", value)
    assert main([a.format(tmp=tmp_path / "out") for a in command]) == EXIT_BAD_INPUT
    err = one_error_line(capsys, f"GMLAKE_KNOBS={value}", *words)
    assert err.count("GMLAKE_KNOBS") == 1
    assert not (tmp_path / "out").exists()


def test_gmlake_knobs_reach_the_replay_below_set(monkeypatch, capsys):
    monkeypatch.setenv("GMLAKE_KNOBS", "min_saved_chunks=0,sblock_first=true")
    assert main(["replay", TINY, "--policy", "gmlake", "--set", "sblock_first=false", "--json"]) == EXIT_OK
    (row,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert row["knobs"]["min_saved_chunks"] == 0 and row["knobs"]["sblock_first"] is False
    # A --set error of its own is the user's, not the variable's.
    assert main(["replay", TINY, "--policy", "gmlake", "--set", "stitch=perhaps"]) == EXIT_BAD_INPUT
    err = one_error_line(capsys, "knob stitch must be")
    assert "GMLAKE_KNOBS" not in err


def test_gmlake_knobs_reads_alike_for_torch_and_the_commands(monkeypatch):
    """One reader (gmlake.policies.settings.env_knobs) for the torch bridge's options_from_env and the commands."""
    from gmlake.cli.common import _env_knobs
    from gmlake.policies.settings import env_knobs
    from gmlake.torch import options_from_env

    monkeypatch.setenv("GMLAKE_KNOBS", " min_saved_chunks=0 , ,stitch=no")
    assert [env_knobs()] == _env_knobs(["gmlake"]) == [{"min_saved_chunks": "0", "stitch": "no"}]
    assert options_from_env() == {"min_saved_chunks": 0, "stitch": False}
    monkeypatch.setenv("GMLAKE_KNOBS", "stitch")
    with pytest.raises(ValueError) as for_torch:
        options_from_env()
    with pytest.raises(ValueError) as for_commands:
        _env_knobs(["gmlake"])
    assert str(for_torch.value) == str(for_commands.value) == "GMLAKE_KNOBS=stitch: a knob setting is knob=value, " \
        "got 'stitch'"


@pytest.mark.parametrize("command", [["replay", TINY, "--json"], ["compare", TINY, "--out", "{tmp}"]])
@pytest.mark.parametrize("value, applied", [("tail_page=2MiB", {"gmlake"}),
                                            ("chunk_size=4MiB", {"gmlake-paper"}),
                                            ("tail_page=2MiB,min_saved_chunks=0", {"gmlake"})])
def test_gmlake_knobs_for_one_policy_apply_where_they_mean_something(monkeypatch, capsys, tmp_path, command, value,
                                                                     applied):
    """A job exports GMLAKE_KNOBS for the one policy it runs; plain compare and replay run every built-in policy:
    the knob reaches those that take it, and one line says which it did not reach (no exit 2)."""
    monkeypatch.setenv("GMLAKE_KNOBS", value)
    assert main([a.format(tmp=tmp_path / "out") for a in command]) == EXIT_OK
    out, err = capsys.readouterr()
    name, setting = value.split(",")[0].split("=")
    (line,) = [line for line in err.splitlines() if "GMLAKE_KNOBS" in line]
    skipped = set(line.split("not applied to ", 1)[1].split(" (", 1)[0].split(";")[0].split(", "))
    assert skipped and not skipped & applied and applied <= set(policies_names()) - skipped
    if command[0] == "replay":
        rows = {row["policy"]: row for row in map(json.loads, out.splitlines())}
        assert set(rows) and {policy.split("(")[0] for policy in rows} == set(policies_names())
        for policy in rows:
            base = policy.split("(")[0]
            assert (base in skipped) != (f"{name}={setting}" in policy), policy


def policies_names() -> list[str]:
    from gmlake import policies

    return policies.names()


def test_the_guide_says_the_piped_width_the_tables_use():
    """docs/guide.md tells the width of a piped table: the one the console uses."""
    import inspect
    import re
    from pathlib import Path

    from gmlake.cli.common import _console

    guide = Path(__file__).resolve().parents[1] / "docs" / "guide.md"
    if not guide.exists():
        pytest.skip("docs/ is not beside the tests (an installed wheel)")
    (said,) = re.findall(r"piped, (\d+)", guide.read_text())
    assert int(said) == inspect.signature(_console).parameters["piped_width"].default
