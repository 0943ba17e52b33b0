"""Every figure and sample output in README.md and docs/ is written by `python -m bench report docs` between
`<!-- generated: NAME -->` marks (from bench/results and tests/data, or by running the commands shown), or is a
method's or a knob's figure that a test here holds against the code. A change to the allocator, a policy, a table or
a result file that moves a figure fails here until the docs are regenerated with that one command, and so does a
figure edited by hand inside a generated section."""
from __future__ import annotations

import json
import re

import pytest

report_docs = pytest.importorskip("bench.report_docs")

ROOT = report_docs.ROOT
MiB = 1 << 20


@pytest.mark.parametrize("doc", [d for d in report_docs.DOCS if d != report_docs.benchmarks.DOC and d.is_file()],
                         ids=lambda d: d.name)
def test_generated_sections_are_up_to_date(doc):
    text = doc.read_text()
    assert report_docs.render(text) == text, f"{doc.name} is stale: run python -m bench report docs"


@pytest.mark.parametrize(("doc", "names"), [
    ("docs/policies.md", {"tlsf", "tune-fit", "tune-search", "compare-maxpieces", "replay-neversplit", "explain",
                          "policy-errors"}),
    ("docs/guide.md", {"oom-message"}),
    ("README.md", {"readme-utilization", "readme-results", "readme-limits"}),
    ("docs/graphs.md", {"graphs-replay", "capture-query", "graphs-measured"}),
    ("docs/benchmarks.md", {"versions", "training", "training-notes", "dynamic", "dynamic-notes", "caps", "caps-notes",
                            "edge", "edge-missed", "edge-fit", "tune-gpu", "latency", "micro", "micro-notes", "replay",
                            "fidelity", "handle-size", "graphs", "sync-price", "ipc-price", "replay-goals", "gpu-goals"}),
])
def test_the_docs_have_their_generated_sections(doc, names):
    path = ROOT / doc
    assert path in report_docs.DOCS, f"{doc} is not among the documents bench report docs rewrites"
    found = [m["name"] for m in report_docs.MARK.finditer(path.read_text())]
    assert names <= set(found), names - set(found)


def _outside_generated(text: str) -> str:
    """The prose a person wrote: the text without its generated sections and code blocks."""
    text = report_docs.MARK.sub("", text)
    return re.sub(r"```.*?```", "", text, flags=re.DOTALL)


# A figure: a number with a unit, a percentage or a ratio, or a decimal that is not part of a name or a dotted
# version (utilizations, GiB in tables; not OPT-1.3B or driver 580.159.04).
FIGURE = re.compile(r"\d[\d.,]*\s?(?:%|x\b|[KMG]i?B\b|ms\b|µs|ns\b|s\b)|(?<![\d.])\d+\.\d+(?![\w.])")
# The figures prose may carry besides the automatic ones (_automatic): each a method's constant held against the code
# below, a parameter of a documented example, or a version. Nothing measured belongs here: a measurement is
# generated from its record by `python -m bench report docs`.
ALLOWED = {
    "0.2 %": "replay's bisection to the smallest cap and device (gmlake.sim.cap.smallest_cap's resolution)",
    "1 %": "replay's fidelity goal for native; the moment of peak growth; tune's visible saving",
    "2 %": "replay's fidelity goal for expandable segments",
    "1.05": "gmlake tune's --within default", "50 ms": "gmlake tune's tie in driver seconds",
    "0.02 %": "bench edge's bisection", "0.99": "bench edge's utilization goal",
    "1.02x": "bench edge's margins", "1.05x": "bench edge's margins", "1.5x": "bench edge's speed goal",
    "2x": "bench edge's cap that never binds",
    "22 MiB": "graphs.md's example request", "40 MiB": "that request in whole 20 MiB pages",
    "2 GiB": "the cap of guide.md's generated out-of-memory sample", "32 x": "the CUDA graphs model's batch",
    "4 KiB": "the micro benchmark's case", "512 MiB": "the micro benchmark's stitch", "stitched_128MiB": "its case",
    "3.10": "the Python gmlake requires", "3.11": "a wheel's Python tag in the guide's example",
    "2.0": "the Apache License's version",
    "11.8": "CUDA versions in the guide", "12.0": "CUDA versions in the guide", "12.8": "CUDA versions in the guide",
    "13.0": "CUDA versions in the guide", "2.34": "the glibc version manylinux names",
}


def _defaults() -> dict[str, object]:
    """Every built-in policy's knobs, as `gmlake policies` lists them, with their defaults (the last policy's where
    two share a name)."""
    from gmlake import policies

    return {k: v for name in policies.names() for k, v, _ in type(policies.get(name)).knob_rows()}


def _automatic() -> set[str]:
    """Figures prose may carry because the code says them: a built-in policy's size default ("20 MiB")."""
    from gmlake import policies

    sizes = {v for name in policies.names() for _, v, unit in type(policies.get(name)).knob_rows() if unit == "bytes"}
    return {f"{s >> 20} MiB" for s in sizes if s >= MiB and s % MiB == 0}


def _stray_figures(prose: str, allowed: set[str]) -> list[str]:
    """The figures of `prose` that are not in `allowed`. A knob's `name=value` is one token, allowed where the name
    is a built-in policy's knob (an example setting), and so is a size written as the command line takes it
    (`24GiB`, no space: an input, not a result)."""
    knobs = _defaults()
    found = {m.group() for m in re.finditer(r"[\w=]*(?:" + FIGURE.pattern + ")", prose)}
    return sorted(f for f in found - allowed if not (
        ("=" in f and f.split("=")[-2] in knobs)
        or re.fullmatch(r"\d+[KMG]i?B", f)))


def _section(text: str, heading: str) -> str:
    """The text of markdown `text` under `heading` (a whole heading line), up to the next heading."""
    start = text.index(heading + "\n") + len(heading) + 1
    end = re.search(r"^#+ ", text[start:], flags=re.MULTILINE)
    return text[start:start + end.start() if end else len(text)]


DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


@pytest.mark.parametrize("doc", DOCUMENTS, ids=lambda d: d.name)
def test_no_figure_is_written_by_hand(doc):
    """Outside generated sections and code, a document's figures are the code's constants and examples only."""
    stray = _stray_figures(_outside_generated(doc.read_text()), set(ALLOWED) | _automatic())
    assert not stray, f"{doc.name}: figures outside a generated section: {stray} (generate them from their record " \
                      "in bench/report_docs/, or drop them)"


def test_every_allowed_figure_is_used():
    """The allow-list stays short: an entry no document needs any more goes."""
    prose = "".join(_outside_generated(d.read_text()) for d in DOCUMENTS)
    used = {m.group() for m in re.finditer(r"[\w=]*(?:" + FIGURE.pattern + ")", prose)}
    assert set(ALLOWED) <= used, set(ALLOWED) - used


def test_the_allowed_constants_are_the_codes():
    """Each method constant the allow-list lets prose state is what the code uses."""
    import inspect

    from bench import edge
    from gmlake.sim import cap, tune
    from gmlake.sim.replay import FIDELITY

    assert inspect.signature(cap.smallest_cap).parameters["resolution"].default == 0.002
    assert FIDELITY == {"native": ("caching", 0.01), "expandable": ("expandable", 0.02)}
    assert (tune.WITHIN, tune.TIE_SECONDS, tune.VISIBLE) == (1.05, 0.05, 0.01)
    assert (edge.MARGINS, edge.UNBINDING, edge.SPEED_RATIO, edge.UTILIZATION) == ((1.02, 1.05), 2.0, 1.5, 0.99)
    assert "2 MiB" in _automatic() and "20 MiB" in _automatic()


@pytest.mark.parametrize("doc", DOCUMENTS, ids=lambda d: d.name)
def test_a_figure_written_by_hand_fails(doc):
    """The check sees a measurement typed into any document's prose, and a knob default quoted wrongly."""
    prose = _outside_generated(doc.read_text())
    allowed = set(ALLOWED) | _automatic()
    assert _stray_figures(prose + "\nIt reserved 1.537 GiB in 0.80 s, 1.07x faster.\n", allowed) == \
        ["0.80 s", "1.07x", "1.537 GiB"]
    assert _stray_figures("pages of 21 MiB, `nosuch_knob=4MiB`", allowed) == ["21 MiB", "nosuch_knob=4MiB"]


def test_the_graphs_docs_pool_sizes_are_the_codes():
    """Pool segments are sized by PyTorch's rule, the knobs' defaults; whole 20 MiB pages would round 22 MiB up."""
    from gmlake.policies import GMLakePolicy

    text = " ".join((ROOT / "docs" / "graphs.md").read_text().split())
    p = GMLakePolicy()
    assert (p.small_segment_size, p.large_segment_size, p.min_large_alloc, p.round_large) == \
        (2 * MiB, 20 * MiB, 10 * MiB, 2 * MiB)
    assert "(2 MiB for the small pool; 20 MiB for requests under 10 MiB" in text
    assert "else the request rounded up to 2 MiB)" in text
    page = p.expandable_page_large
    assert page == 20 * MiB and -(-22 * MiB // page) * page == 40 * MiB
    assert "in whole 20 MiB pages a 22 MiB request would take 40 MiB" in text


def test_the_edge_sections_method_figures_are_the_codes():
    """The goals and the bisection's resolution that "At the edge of memory" states are bench.edge's, and the pages
    it names the default policy's."""
    from bench import edge
    from gmlake.policies import GMLakePolicy

    text = " ".join(_section(report_docs.benchmarks.DOC.read_text(), "## At the edge of memory, by replay").split())
    record = json.loads(report_docs.benchmarks.EDGE.read_text())
    assert record["resolution"] == 2e-4 and "bisects, to 0.02 %, the smallest device" in text
    assert edge.MARGINS == (1.02, 1.05) and "at a cap and at a device of 1.02x and 1.05x P" in text
    assert edge.UNBINDING == 2.0 and "replays a cap of 2x P (which never binds)" in text
    assert edge.FIT_SLACK == 0.002 and "fit within 0.2 % of P of the better of the other two" in text
    assert edge.SPEED_RATIO == 1.5 and "at most 1.5x the expandable model's priced driver time" in text
    assert edge.UTILIZATION == 0.99 and edge.UNCAPPED_RATIO == 2.0
    assert "utilization 0.99 without a limit at 2x the expandable model's driver time at most" in text
    p = GMLakePolicy()
    assert p.expandable_page_large == 20 * MiB and p.reback_slot == 0 and p.edge_page == 2 * MiB
    assert "The table is the default as it is: 20 MiB pages" in text and "(`reback_slot=0`" in text
    assert "(`edge_page=2MiB`" in text


def test_the_readmes_method_and_knob_figures_are_the_codes():
    """The figures the README states about the policies and about replay's fidelity are the code's defaults."""
    from gmlake.policies import GMLakePolicy, PaperPolicy
    from gmlake.sim.replay import FIDELITY

    text = (ROOT / "README.md").read_text()
    default, paper = GMLakePolicy(), PaperPolicy()
    assert default.expandable_page_large == 20 * MiB and "20 MiB pages" in text
    assert default.min_saved_chunks == 3 and "saves at least three 20 MiB pages" in text
    assert paper.chunk_size == 2 * MiB and "2 MiB pages, stitch" in text
    assert default.device_reserve == 8 * MiB and "at least 8 MiB" in text
    assert default.reback_slot == 0 and "Re-backing at the limit is off" in text
    assert FIDELITY == {"native": ("caching", 0.01), "expandable": ("expandable", 0.02)}
    assert "within 1 % for native's and 2 % for expandable segments" in text


def _edit_a_figure(text: str, name: str) -> str:
    """`text` with one digit inside generated section `name` changed, as a hand edit would."""
    match = next(m for m in report_docs.MARK.finditer(text) if m["name"] == name)
    body = match["body"]
    digit = re.search(r"\d", body)
    assert digit, f"section {name} holds no figure"
    new = "7" if digit.group() != "7" else "8"
    start = match.start("body") + digit.start()
    return text[:start] + new + text[start + 1:]


@pytest.mark.parametrize("name", ["readme-utilization", "readme-results", "readme-limits"])
def test_a_hand_edited_figure_in_the_readme_fails_the_check(tmp_path, capsys, name):
    """`bench report docs --check` (and this file's up-to-date test) fails on a figure edited inside a section;
    prose outside the sections stays the writer's."""
    readme = tmp_path / "README.md"
    text = (ROOT / "README.md").read_text()
    readme.write_text(text.replace("## Install", "## Installing"))
    assert report_docs.main(["--check", "--doc", str(readme)]) == 0
    readme.write_text(_edit_a_figure(text, name))
    assert report_docs.main(["--check", "--doc", str(readme)]) == 1
    assert "stale: run python -m bench report docs" in capsys.readouterr().err
    edited = readme.read_text()
    assert report_docs.render(edited) == text
