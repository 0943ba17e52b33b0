"""Every figure and sample output in README.md and docs/ is written by `python -m bench report docs` between
`<!-- generated: NAME -->` marks (from bench/results and tests/data, or by running the commands shown), or is a
method's or a knob's figure that a test here holds against the code. A change to the allocator, a policy, a table or
a result file that moves a figure fails here until the docs are regenerated with that one command, and so does a
figure edited by hand inside a generated section."""
from __future__ import annotations

import re

import pytest

report_docs = pytest.importorskip("bench.report_docs")

ROOT = report_docs.ROOT
MiB = 1 << 20


@pytest.mark.parametrize("doc", [d for d in report_docs.DOCS if d != report_docs.DOC and d.is_file()],
                         ids=lambda d: d.name)
def test_generated_sections_are_up_to_date(doc):
    text = doc.read_text()
    assert report_docs.render(text) == text, f"{doc.name} is stale: run python -m bench report docs"


@pytest.mark.parametrize(("doc", "names"), [
    ("docs/policies.md", {"tlsf", "tune-fit", "tune-search", "compare-maxpieces", "replay-neversplit", "explain"}),
    ("README.md", {"readme-utilization", "readme-results", "readme-limits"}),
    ("docs/graphs.md", {"graphs-replay", "capture-query", "graphs-measured"}),
    ("docs/benchmarks.md", {"graphs", "edge-missed", "fidelity", "handle-size"}),
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


# The README's figures outside generated sections: each a method's parameter or a knob's default, held below, or
# a version it requires (Python 3.10) or is licensed under (Apache-2.0).
README_FIGURES = {"1 %", "2 %", "20 MiB", "2 MiB", "8 MiB", "1.02x", "GMLAKE_KNOBS=reback_slot=2MiB",
                  "GMLAKE_KNOBS=device_reserve=64MiB", "3.10", "2.0"}
# A figure: a number with a unit, a percentage or a ratio, or any decimal (utilizations, GiB in tables).
FIGURE = re.compile(r"\d[\d.,]*\s?(?:%|x\b|[KMG]iB|ms\b|µs|GB\b)|\d+\.\d+")


def _stray_figures(prose: str, allowed: set[str]) -> list[str]:
    """The figures of `prose` (a knob's `name=value` whole) that are not in `allowed`."""
    return sorted({m.group() for m in re.finditer(r"[\w=]*(?:" + FIGURE.pattern + ")", prose)} - allowed)


def _section(text: str, heading: str) -> str:
    """The text of markdown `text` under `heading` (a whole heading line), up to the next heading."""
    start = text.index(heading + "\n") + len(heading) + 1
    end = re.search(r"^#+ ", text[start:], flags=re.MULTILINE)
    return text[start:start + end.start() if end else len(text)]


def test_the_readme_has_no_hand_written_measurement():
    """A measured figure in README.md comes from a generated section; what is left is the method and the knobs."""
    stray = _stray_figures(_outside_generated((ROOT / "README.md").read_text()), README_FIGURES)
    assert not stray, f"figures outside a generated section: {stray}"


# docs/graphs.md's figures outside generated sections: the sizes of a private pool's segments, PyTorch's rule, held
# against the knobs below.
GRAPHS_FIGURES = {"2 MiB", "10 MiB", "20 MiB", "22 MiB", "40 MiB"}
# docs/benchmarks.md, per section converted to generated text: the figures its prose keeps (the method's).
BENCHMARK_FIGURES = {
    "## CUDA graphs": {"32 x"},
    "## At the edge of memory, by replay": {"0.02 %", "0.2 %", "0.99", "1.02x", "1.05x", "1.5x", "2x", "2 MiB",
                                            "20 MiB", "edge_page=2MiB", "reback_slot=2MiB"},
    "### Finer pages by headroom, and stitching at the edge": {"2 MiB", "20 MiB", "edge_page=2MiB"},
    "## Replay on CPU: the bundled traces": {"20 MiB"},
}


def test_the_graphs_doc_has_no_hand_written_measurement():
    stray = _stray_figures(_outside_generated((ROOT / "docs" / "graphs.md").read_text()), GRAPHS_FIGURES)
    assert not stray, f"docs/graphs.md: figures outside a generated section: {stray}"


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


@pytest.mark.parametrize("heading", sorted(BENCHMARK_FIGURES))
def test_converted_benchmark_sections_have_no_hand_written_measurement(heading):
    prose = _outside_generated(_section(report_docs.DOC.read_text(), heading))
    stray = _stray_figures(prose, BENCHMARK_FIGURES[heading])
    assert not stray, f"docs/benchmarks.md, {heading}: figures outside a generated section: {stray}"


def test_the_edge_sections_method_figures_are_the_codes():
    """The goals and the bisection's resolution that "At the edge of memory" states are bench.edge's, and the pages
    it names the default policy's."""
    from bench import edge
    from gmlake.policies import GMLakePolicy

    text = " ".join(_section(report_docs.DOC.read_text(), "## At the edge of memory, by replay").split())
    record = report_docs.json.loads(report_docs.EDGE.read_text())
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


def test_a_figure_written_by_hand_into_a_converted_section_fails():
    """The stray-figure check sees a measurement typed into the prose of a converted section."""
    heading = "## CUDA graphs"
    prose = _outside_generated(_section(report_docs.DOC.read_text(), heading))
    assert not _stray_figures(prose, BENCHMARK_FIGURES[heading])
    assert _stray_figures(prose + "\nIt reserved 1.537 GiB.\n", BENCHMARK_FIGURES[heading]) == ["1.537 GiB"]


def test_the_readmes_method_and_knob_figures_are_the_codes():
    """The figures the README states about the policies and about replay's fidelity are the code's defaults."""
    from gmlake.policies import GMLakePolicy, PaperPolicy
    from gmlake.sim.replay import FIDELITY

    text = (ROOT / "README.md").read_text()
    default, paper = GMLakePolicy(), PaperPolicy()
    assert default.expandable_page_large == 20 * MiB and "20 MiB pages" in text
    assert default.min_saved_chunks == 3 and "saves at least three 20 MiB pages" in text
    assert paper.chunk_size == 2 * MiB and "2 MiB pages, stitch" in text
    assert default.device_reserve == 8 * MiB and "last 8 MiB" in text
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
