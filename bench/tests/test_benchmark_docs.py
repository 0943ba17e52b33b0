"""docs/benchmarks.md's generated tables are what their result files give: a result file or a generator that changed
without `python -m bench report docs` fails here, so no figure in the benchmark docs drifts from its data."""
from __future__ import annotations

import pytest

report_docs = pytest.importorskip("bench.report_docs")


def test_every_generated_table_is_up_to_date():
    text = report_docs.benchmarks.DOC.read_text()
    assert report_docs.MARK.search(text), "docs/benchmarks.md has no generated table"
    assert report_docs.render(text) == text, "stale: run python -m bench report docs"


def test_an_unknown_table_is_refused():
    with pytest.raises(ValueError, match="no generated table 'nonesuch'"):
        report_docs.render("<!-- generated: nonesuch -->\nx\n<!-- end generated -->")
