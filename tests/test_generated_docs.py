"""The manual's replayed figures and sample outputs (docs/policies.md: the TLSF example, the `gmlake tune` sample,
the tune search) are what the commands give today: `python -m bench report docs` writes them, and a change to the
allocator, a policy or a table that moves them fails here until they are regenerated with that one command."""
from __future__ import annotations

import pytest

report_docs = pytest.importorskip("bench.report_docs")


@pytest.mark.parametrize("doc", [d for d in report_docs.DOCS if d != report_docs.DOC and d.is_file()],
                         ids=lambda d: d.name)
def test_generated_sections_are_up_to_date(doc):
    text = doc.read_text()
    assert report_docs.render(text) == text, f"{doc.name} is stale: run python -m bench report docs"


def test_the_manual_has_its_generated_sections():
    text = (report_docs.ROOT / "docs" / "policies.md").read_text()
    names = [m["name"] for m in report_docs.MARK.finditer(text)]
    assert {"tlsf", "tune-fit", "tune-search"} <= set(names)
