"""Custom policies from the command line and `gmlake run`: a Policy subclass named by module:Class, by
path/to/file.py:Class or by an installed package's entry point, with knobs for each policy, labels that tell knob
variants apart, results that record spec, class and knobs, and one line with exit 2 for every bad input."""
from __future__ import annotations

import json
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from gmlake import policies
from gmlake.cli import EXIT_BAD_INPUT, EXIT_OK, build_parser, main

TINY = "tests/data/tiny-gpt2-native.pickle.gz"

POLICY_SOURCE = textwrap.dedent('''
    """Research policies for the tests: a stitch limited to a few pieces, and things that are not policies."""
    from dataclasses import dataclass
    from typing import ClassVar

    from gmlake.policies import PaperPolicy, knob


    @dataclass(frozen=True)
    class MaxPieces(PaperPolicy):
        """The paper's policy, stitching at most `max_pieces` free pieces."""

        max_pieces: int = 16

        def allow_stitch(self, size, stream, pieces, new_bytes):
            return len(pieces) <= self.max_pieces


    @dataclass(frozen=True)
    class SmallPieces(MaxPieces):
        """Also no piece under `min_piece` bytes: a size knob, declared so."""

        min_piece: int = knob(64 << 20, unit="bytes")


    @dataclass(frozen=True)
    class Named(PaperPolicy):
        name: ClassVar[str] = "named-one"


    @dataclass(frozen=True)
    class Refuses(PaperPolicy):
        def __post_init__(self):
            raise RuntimeError("this policy refuses to be built")


    class NotAPolicy:
        pass


    not_a_class = 42
''')


def one_error_line(capsys, *words: str) -> str:
    """stderr is one `gmlake: error:` line, no traceback, holding every word."""
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("gmlake: error: "), err
    assert "Traceback" not in err, err
    for word in words:
        assert word in err, (word, err)
    return err


def json_rows(capsys) -> list[dict]:
    return [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.strip()]


@pytest.fixture
def policy_file(tmp_path) -> Path:
    path = tmp_path / "research_policies.py"
    path.write_text(POLICY_SOURCE)
    return path


@pytest.fixture
def policy_module(tmp_path, monkeypatch) -> str:
    """A module of a fresh name on sys.path, holding the policies."""
    name = f"gmlake_test_policies_{uuid.uuid4().hex[:8]}"
    folder = tmp_path / "modules"
    folder.mkdir()
    (folder / f"{name}.py").write_text(POLICY_SOURCE)
    monkeypatch.syspath_prepend(str(folder))
    yield name
    sys.modules.pop(name, None)


@pytest.fixture
def plugin(tmp_path, monkeypatch) -> str:
    """An 'installed' package: a module and a dist-info declaring its policies in the gmlake.policies group (as
    pip install would leave them), on sys.path. Yields the entry point name of MaxPieces."""
    name = f"gmlake_test_plugin_{uuid.uuid4().hex[:8]}"
    site = tmp_path / "site"
    site.mkdir()
    (site / f"{name}.py").write_text(POLICY_SOURCE)
    info = site / f"{name}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        f"[gmlake.policies]\nmaxpieces-{name} = {name}:MaxPieces\nbroken-{name} = {name}:NotAPolicy\n"
        f"missing-{name} = {name}_gone:MaxPieces\ngmlake = {name}:MaxPieces\n")
    monkeypatch.syspath_prepend(str(site))
    yield f"maxpieces-{name}"
    sys.modules.pop(name, None)


@pytest.fixture(params=["file", "module", "entry point"])
def max_pieces_spec(request, policy_file, tmp_path, monkeypatch) -> str:
    """MaxPieces named each way a user can name it."""
    if request.param == "file":
        return f"{policy_file}:MaxPieces"
    if request.param == "module":
        return f"{request.getfixturevalue('policy_module')}:MaxPieces"
    return request.getfixturevalue("plugin")


# ------------------------------------------------------------------------------------ each source, each path


def test_resolve_each_source(max_pieces_spec):
    choice = policies.resolve(max_pieces_spec)
    assert type(choice.policy).__name__ == "MaxPieces" and choice.policy.max_pieces == 16
    assert choice.label == "MaxPieces" and choice.spec == max_pieces_spec
    record = choice.record()
    assert record["policy_class"].endswith("MaxPieces") and record["knobs"]["max_pieces"] == 16
    assert record["knobs"]["segment_rule"] == "chunks"          # the full knob set, inherited ones too


def test_replay_each_source(max_pieces_spec, capsys):
    assert main(["replay", TINY, "--policy", f"{max_pieces_spec}[max_pieces=0]", "--policy", max_pieces_spec,
                 "--json"]) == EXIT_OK
    limited, free = json_rows(capsys)
    assert limited["policy"] == "MaxPieces(max_pieces=0)" and free["policy"] == "MaxPieces"
    assert limited["policy_spec"] == f"{max_pieces_spec}[max_pieces=0]"
    assert limited["knobs"]["max_pieces"] == 0 and free["knobs"]["max_pieces"] == 16
    # The knob reached the hook: no piece count passes max_pieces=0, while the default stitches on this trace.
    assert limited["stitches"] == 0 < free["stitches"]


def test_compare_each_source(max_pieces_spec, tmp_path, capsys):
    out = tmp_path / "cmp"
    assert main(["compare", TINY, "--policy", max_pieces_spec, "--policy", "gmlake", "--out", str(out)]) == EXIT_OK
    assert "MaxPieces" in capsys.readouterr().out
    rows = [json.loads(line) for line in (out / "compare.jsonl").read_text().splitlines()]
    assert [r["policy"] for r in rows] == ["MaxPieces", "gmlake"]
    assert rows[0]["policy_spec"] == max_pieces_spec and rows[0]["knobs"]["max_pieces"] == 16
    assert rows[1]["policy_class"] == "gmlake.policies.gmlake.GMLakePolicy"
    assert (out / "compare.png").stat().st_size > 0


def test_explain_each_source(max_pieces_spec, capsys):
    assert main(["explain", TINY, "--policy", max_pieces_spec, "--set", "max_pieces=3", "--json"]) == EXIT_OK
    (row,) = json_rows(capsys)
    assert row["policy"] == "MaxPieces(max_pieces=3)" and row["knobs"]["max_pieces"] == 3
    assert row["policy_spec"] == max_pieces_spec and row["reserved"] > 0


def test_torch_environment_selects_each_source(max_pieces_spec, monkeypatch):
    """GMLAKE_POLICY / GMLAKE_KNOBS, as `GMLAKE=1` and enable_from_env() read them (no GPU needed to choose)."""
    from gmlake import torch as gtorch

    monkeypatch.setenv("GMLAKE_POLICY", max_pieces_spec)
    monkeypatch.setenv("GMLAKE_KNOBS", "max_pieces=2,chunk_size=4MiB")
    monkeypatch.setenv("GMLAKE_LIMIT", "8GiB")
    choice, limit = gtorch.policy_from_env()
    assert type(choice.policy).__name__ == "MaxPieces" and choice.policy.max_pieces == 2
    assert choice.policy.chunk_size == 4 << 20 and limit == 8 << 30
    assert choice.label == "MaxPieces(chunk_size=4MiB, max_pieces=2)"


def test_gmlake_run_selects_each_source(max_pieces_spec, monkeypatch):
    """The policy `gmlake run` would install: flags over environment, --set over both."""
    from gmlake.cli.job import _run_policy

    monkeypatch.setenv("GMLAKE_POLICY", "caching")
    monkeypatch.setenv("GMLAKE_KNOBS", "stitch=false")
    args = build_parser().parse_args(["run", "--policy", max_pieces_spec, "--set", "max_pieces=5",
                                      "--chunk-size", "8MiB", "--", "train.py"])
    choice, limit = _run_policy(args)
    assert type(choice.policy).__name__ == "MaxPieces"
    assert (choice.policy.max_pieces, choice.policy.chunk_size, choice.policy.stitch, limit) == (5, 8 << 20, False, 0)


def test_gmlake_run_checks_the_policy_before_the_program(tmp_path, monkeypatch, capsys):
    """A bad custom policy is the one-line error, before gmlake looks at the script or at CUDA."""
    monkeypatch.delenv("GMLAKE_POLICY", raising=False)
    assert main(["run", "--policy", f"{tmp_path / 'nope.py'}:MaxPieces", "missing_script.py"]) == EXIT_BAD_INPUT
    one_error_line(capsys, "nope.py", "no such file")


def test_torch_snapshot_records_the_policy():
    from gmlake.core._allocator import Allocator
    from gmlake.drivers._sim_driver import SimDriver
    from gmlake.torch import snapshot_of

    choice = policies.resolve("gmlake[min_saved_chunks=0]")
    settings = snapshot_of({0: Allocator(SimDriver(), choice.policy)}, choice.label,
                           choice.record())["allocator_settings"]
    assert settings["gmlake_policy"] == "gmlake(min_saved_chunks=0)"
    assert settings["gmlake_policy_spec"] == "gmlake[min_saved_chunks=0]"
    assert settings["gmlake_policy_class"] == "gmlake.policies.gmlake.GMLakePolicy"
    assert settings["gmlake_knobs"]["min_saved_chunks"] == 0 and len(settings["gmlake_knobs"]) > 10


# ------------------------------------------------------------------------------------ files, modules, plugins


def test_a_file_is_loaded_once(policy_file):
    """Naming one file twice gives one class, so two choices of it compare equal (enable() relies on it)."""
    first = policies.policy_class(f"{policy_file}:MaxPieces")
    again = policies.policy_class(f"{policy_file.parent}/./{policy_file.name}:MaxPieces")
    assert first is again


def test_a_module_in_the_current_folder(tmp_path, monkeypatch):
    """`--policy mypolicies:MaxPieces` finds mypolicies.py in the current folder, as `python -m` would, and does not
    leave the folder on sys.path."""
    name = f"gmlake_cwd_policies_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(POLICY_SOURCE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    try:
        assert policies.policy_class(f"{name}:MaxPieces").__name__ == "MaxPieces"
        assert str(tmp_path) not in sys.path
    finally:
        sys.modules.pop(name, None)


def test_installed_policies_are_listed_and_cannot_replace_builtins(plugin):
    assert plugin in policies.installed()
    assert "gmlake" not in policies.installed()              # the plugin's own "gmlake" entry is ignored
    assert type(policies.get("gmlake")) is policies.GMLakePolicy


def test_a_class_with_its_own_name_is_labelled_by_it(policy_file):
    """`name` set on the class labels it; a subclass that does not set it is labelled by its class name, not by
    the inherited name (MaxPieces is not 'gmlake-paper')."""
    assert policies.resolve(f"{policy_file}:Named").label == "named-one"
    assert policies.resolve(f"{policy_file}:MaxPieces").label == "MaxPieces"
    assert policies.get("gmlake-paper").label() == "gmlake-paper"


# ------------------------------------------------------------------------------------ knobs per policy


def test_labels_tell_knob_variants_apart():
    assert policies.get("gmlake").label() == "gmlake"
    assert policies.get("gmlake", min_saved_chunks=0).label() == "gmlake(min_saved_chunks=0)"
    assert policies.get("gmlake", chunk_size=8 << 20, stitch=False).label() == \
        "gmlake(chunk_size=8MiB, stitch=false)"
    # A knob set to its default is not a change.
    assert policies.get("gmlake", min_saved_chunks=3).label() == "gmlake"


def test_a_plain_int_knob_is_a_count_and_a_size_knob_says_so(policy_file, capsys):
    """docs/policies.md: a plain `int` field is a count (no unit, listed as `count`, labelled as a number); a size
    is declared with knob(..., unit="bytes") and takes units."""
    spec = f"{policy_file}:SmallPieces"
    policy = policies.resolve(f"{spec}[max_pieces=1_0,min_piece=1GiB]").policy
    assert (policy.max_pieces, policy.min_piece) == (10, 1 << 30)
    assert policies.resolve(f"{spec}[max_pieces=4096]").label == "SmallPieces(max_pieces=4096)"
    assert policies.resolve(f"{spec}[min_piece=1GiB]").label == "SmallPieces(min_piece=1GiB)"
    assert main(["policies", spec]) == EXIT_OK
    out = capsys.readouterr().out
    rows = {line.split("│")[1].strip(): line for line in out.splitlines() if line.count("│") > 2}
    assert "64MiB" in rows["min_piece"] and "bytes" in rows["min_piece"], rows
    assert "count" in rows["max_pieces"] and "16" in rows["max_pieces"], rows
    for text in ("4MiB", "1k", "2.5", "lots"):
        assert main(["replay", TINY, "--policy", f"{spec}[max_pieces={text}]"]) == EXIT_BAD_INPUT
        one_error_line(capsys, "knob max_pieces must be a whole number (count)", repr(text))
        assert main(["replay", TINY, "--policy", spec, "--set", f"max_pieces={text}"]) == EXIT_BAD_INPUT
        one_error_line(capsys, "knob max_pieces must be a whole number (count)")


def test_one_policy_twice_with_different_knobs(capsys):
    assert main(["replay", TINY, "--policy", "gmlake", "--policy", "gmlake[min_saved_chunks=0]", "--json"]) == EXIT_OK
    default, variant = json_rows(capsys)
    assert (default["policy"], variant["policy"]) == ("gmlake", "gmlake(min_saved_chunks=0)")
    assert (default["knobs"]["min_saved_chunks"], variant["knobs"]["min_saved_chunks"]) == (3, 0)


@pytest.mark.parametrize("target", ["2", "gmlake-paper"])
def test_set_aimed_at_one_policy(capsys, target):
    assert main(["replay", TINY, "--policy", "gmlake", "--policy", "gmlake-paper", "--set", "max_cached_sblocks=64",
                 "--set", f"{target}.max_cached_sblocks=8", "--json"]) == EXIT_OK
    first, second = json_rows(capsys)
    assert first["knobs"]["max_cached_sblocks"] == 64 and second["knobs"]["max_cached_sblocks"] == 8


def test_set_aimed_at_a_file_policy_and_precedence(policy_file, capsys):
    """Aimed at `file.py:Class` (dots in the spec are fine: the knob is after the last dot); the spec's own
    [knobs] win over the aimed --set, which wins over the plain --set."""
    spec = f"{policy_file}:MaxPieces"
    assert main(["replay", TINY, "--policy", spec, "--policy", f"{spec}[max_pieces=7]", "--set", "max_pieces=1",
                 "--set", f"{spec}.max_pieces=2", "--json"]) == EXIT_OK
    aimed, inline = json_rows(capsys)
    assert aimed["knobs"]["max_pieces"] == 2 and inline["knobs"]["max_pieces"] == 7


def test_split_targeted():
    everywhere, targeted = policies.split_targeted(["stitch=false", "my.policies:Mine.max_pieces=2",
                                                    "a/b.py:C.x = 1", "2.chunk_size=4MiB"])
    assert everywhere == {"stitch": "false"}
    assert targeted == {"my.policies:Mine": {"max_pieces": "2"}, "a/b.py:C": {"x": "1"},
                        "2": {"chunk_size": "4MiB"}}


# ------------------------------------------------------------------------------------ bad input: one line, exit 2


@pytest.mark.parametrize("spec, words", [
    ("gmlake_no_such_module_xyz:MaxPieces", ["no module named 'gmlake_no_such_module_xyz'"]),
    ("{file}:Missing", ["has no 'Missing'", "its policies: MaxPieces, Named, Refuses"]),
    ("{dir}/absent.py:MaxPieces", ["no such file", "absent.py"]),
    ("{file}:NotAPolicy", ["class NotAPolicy is not a subclass of gmlake.policies.Policy"]),
    ("{file}:not_a_class", ["a int is not a subclass"]),
    ("{file}:Refuses", ["constructing Refuses failed: RuntimeError: this policy refuses to be built"]),
    ("{file}:MaxPieces[bogus=1]", ["has no knob 'bogus'", "max_pieces"]),
    ("{file}:MaxPieces[max_pieces=lots]", ["knob max_pieces must be"]),
    ("{file}:MaxPieces[max_pieces]", ["knob=value"]),
    ("{file}:MaxPieces[chunk_size=3MiB]", ["not a multiple of the driver's granularity"]),
    ("gmlake[stitch=maybe", ["NAME[knob=value"]),
    ("[stitch=false]", ["follow a policy name"]),
    ("no-such-policy", ["unknown policy 'no-such-policy'", "gmlake-paper", "module:Class"]),
    (":MaxPieces", ["write module:Class"]),
    ("{syntax}:X", ["SyntaxError"]),
    ("json:dumps", ["is not a subclass"]),
])
def test_bad_policies_get_one_line_and_exit_2(policy_file, tmp_path, capsys, spec, words):
    broken = tmp_path / "broken.py"
    broken.write_text("def (:\n")
    spec = spec.format(file=policy_file, dir=tmp_path, syntax=broken)
    for command in (["replay", TINY], ["explain", TINY], ["compare", TINY, "--out", str(tmp_path / "o")]):
        assert main([*command, "--policy", spec]) == EXIT_BAD_INPUT, (command, spec)
        one_error_line(capsys, *words)
    assert not (tmp_path / "o").exists()


def test_a_module_missing_a_dependency_is_told_apart_from_a_missing_module(tmp_path, monkeypatch, capsys):
    name = f"gmlake_needs_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text("import gmlake_dependency_that_is_not_installed\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["replay", TINY, "--policy", f"{name}:MaxPieces"]) == EXIT_BAD_INPUT
    one_error_line(capsys, f"importing {name} failed: ModuleNotFoundError",
                   "gmlake_dependency_that_is_not_installed")


def test_bad_entry_points_get_one_line(plugin, capsys):
    name = plugin.removeprefix("maxpieces-")
    assert main(["replay", TINY, "--policy", f"broken-{name}"]) == EXIT_BAD_INPUT
    one_error_line(capsys, "NotAPolicy is not a subclass")
    assert main(["replay", TINY, "--policy", f"missing-{name}"]) == EXIT_BAD_INPUT
    one_error_line(capsys, "loading entry point", "ModuleNotFoundError")


def test_unknown_policy_lists_installed_ones(plugin, capsys):
    assert main(["replay", TINY, "--policy", "nope"]) == EXIT_BAD_INPUT
    one_error_line(capsys, "installed:", plugin)


@pytest.mark.parametrize("args, words", [
    (["--policy", "gmlake", "--policy", "{file}:MaxPieces", "--set", "max_pieces=2"],
     ["policy gmlake has no knob 'max_pieces'"]),
    (["--policy", "gmlake", "--set", "caching.stitch=false"], ["'caching' is none of the chosen policies"]),
    (["--policy", "gmlake", "--set", "3.stitch=false"], ["'3' is none of the chosen policies", "1..1"]),
    (["--policy", "gmlake", "--set", ".stitch=false"], ["POLICY.knob=value"]),
    (["--policy", "gmlake", "--set", "gmlake.stitch=perhaps"], ["knob stitch must be"]),
])
def test_bad_knob_settings_get_one_line(policy_file, capsys, args, words):
    args = [a.format(file=policy_file) for a in args]
    assert main(["replay", TINY, *args]) == EXIT_BAD_INPUT
    one_error_line(capsys, *words)


def test_bad_environment_policy_gets_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GMLAKE_POLICY", f"{tmp_path}/gone.py:MaxPieces")
    assert main(["run", "train.py"]) == EXIT_BAD_INPUT
    one_error_line(capsys, "gone.py", "no such file")


# ------------------------------------------------------------------------------------ plot colours


def test_custom_policies_get_distinct_colours_never_a_builtins():
    from matplotlib.colors import to_hex

    from gmlake.sim.plots import BUILTIN_COLORS, policy_colors

    labels = ["gmlake", "caching", *(f"Mine(k={i})" for i in range(12)), "gmlake(min_saved_chunks=0)"]
    colors = policy_colors(labels)
    builtin = {to_hex(c) for c in BUILTIN_COLORS.values()}
    assert colors["gmlake"] == to_hex("tab:green") and colors["caching"] == to_hex("tab:red")
    others = [colors[label] for label in labels[2:]]
    assert len(set(others)) == len(others)                    # 13 custom labels, 13 colours
    assert not set(others) & builtin
