"""docs/policies.md's worked examples run as written: one per seam."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parent.parent / "docs" / "policies.md"
BLOCKS = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.DOTALL)


def test_the_doc_has_an_example_per_seam():
    for hook in ("choose_block", "should_split", "choose_stitch", "segment_layout", "evict_victim",
                 "relieve_pressure"):
        assert any(f"def {hook}(" in block for block in BLOCKS), hook


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_example_runs(index):
    # running the doc's own code, as a reader would, is the point of the test
    exec(compile(BLOCKS[index], f"{DOC.name} example {index + 1}", "exec", dont_inherit=True),  # noqa: S102
         {"__name__": "policies_doc"})
