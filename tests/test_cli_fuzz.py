"""Fuzzing the command line itself: hypothesis draws argument lists and knob values for every command. Whatever it
draws, the command ends with a documented exit status, a bad input gets exactly one line on stderr, no traceback is
printed, and nothing is half-written."""
from __future__ import annotations

import contextlib
import io
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gmlake import policies
from gmlake.cli import EXIT_BAD_INPUT, EXIT_OK, EXIT_OUT_OF_MEMORY, main
from gmlake.policies.settings import knob_types
from gmlake.sim.trace import load

TINY = "tests/data/tiny-gpt2-native.pickle.gz"
WORK = Path(tempfile.mkdtemp(prefix="gmlake-cli-fuzz-"))
(WORK / "empty.gmtrace").write_bytes(b"")
(WORK / "adir").mkdir()
(WORK / "afile").write_text("keep")
(WORK / "garbage.pickle").write_bytes(b"\x80\x04garbage")

KNOBS = sorted(knob_types(policies.GMLakePolicy)) + ["name", "bogus", ""]
WORDS = ["0", "1", "-1", "true", "false", "no", "off", "maybe", "2MiB", "8MiB", "3MiB", "1.5GiB", "80GiB", "4096",
         "99999999999999999999999999", "chunks", "pytorch", "", " ", "1e3", "0x10", "nan", "5TiB", "4TiB"]
TRACES = [TINY, str(WORK / "missing.pickle"), str(WORK / "empty.gmtrace"), str(WORK / "adir"),
          str(WORK / "garbage.pickle"), "no-such-trace"]     # (bundled traces by name: too slow here; test_cli)
OUTPUTS = [str(WORK / "out.gmtrace"), str(WORK / "adir"), str(WORK / "afile"), str(WORK / "missing" / "x.gmtrace"),
           str(WORK / "x.pickle"), str(WORK / "adir" / "y.gmtrace")]

word = st.one_of(st.sampled_from(WORDS), st.text(max_size=12))
knob_setting = st.builds(lambda k, v, sep: f"{k}{sep}{v}", st.sampled_from(KNOBS), word, st.sampled_from(["=", ""]))
policy = st.one_of(st.sampled_from(policies.names()), word)
stray = st.sampled_from(["--json", "--bogus", "-m", "--", "--device", "-o", "--set", "--policy", "-h"])

replay_options = st.lists(st.one_of(
    st.tuples(st.just("--policy"), policy),
    st.tuples(st.just("--set"), knob_setting),
    st.tuples(st.just("--device-memory"), word),
    st.tuples(st.just("--device"), st.sampled_from(["0", "1", "-1", "x"])),
    st.tuples(st.just("--json")),
    st.tuples(stray),
), max_size=5).map(lambda groups: [token for group in groups for token in group])

command = st.one_of(
    st.builds(lambda c, t, o: [c, t, *o], st.sampled_from(["replay", "explain"]), st.sampled_from(TRACES),
              replay_options),
    st.builds(lambda t, o, rest: ["convert", t, "-o", o, *rest], st.sampled_from(TRACES), st.sampled_from(OUTPUTS),
              st.lists(st.sampled_from(["--name", "x", "--device", "0", "--bogus"]), max_size=2)),
    st.builds(lambda o, rest: ["compare", TINY, "--out", str(WORK / "afile"), *rest], st.just(0), replay_options),
    st.builds(lambda opts, prog: ["run", *opts, str(WORK / "missing.py"), *prog],
              st.lists(st.sampled_from(["--policy", "gmlake", "--limit", "8GiB", "--chunk-size", "x", "--no-stitch",
                                        "--set", "stitch=maybe", "--max-cached-sblocks", "-3"]), max_size=4),
              st.lists(word, max_size=2)),
    st.builds(lambda o, prog: ["capture", "-o", o, "--", *prog], st.sampled_from(OUTPUTS),
              st.lists(st.sampled_from(["python", "python3", str(WORK / "missing.py"), "-m", "ls"]), max_size=3)),
    st.lists(st.one_of(st.sampled_from(["replay", "traces", "--version", "nope", "--names", "-h"]), word),
             max_size=3),
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(argv=command)
def test_command_line_fuzz(argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(argv)
    errors = err.getvalue()
    assert status in (EXIT_OK, EXIT_BAD_INPUT, EXIT_OUT_OF_MEMORY), (argv, status, errors)
    assert "Traceback" not in errors and "gmlake: error: gmlake:" not in errors, (argv, errors)
    if status == EXIT_BAD_INPUT:
        assert errors.count("\n") == 1 and errors.startswith("gmlake: error: "), (argv, errors)
    assert not list(WORK.rglob("*.tmp")), argv
    assert (WORK / "afile").read_text() == "keep"
    for written in WORK.rglob("*.gmtrace"):
        if written.stat().st_size:
            load(written)                       # whatever was written is whole
