"""docs/policies.md's worked examples run as written: one per seam, and it documents all seven."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parent.parent / "docs" / "policies.md"
# The examples a reader runs in Python; a block that starts `# NAME.py` is a file to write (the Cython path's,
# run by tests/test_cython_policy_doc.py).
BLOCKS = [block for block in re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.DOTALL)
          if not re.match(r"# [\w.]+\.py\n", block)]


def test_the_doc_has_an_example_per_seam():
    from gmlake.policies.base import Policy

    hooks = ("choose_block", "should_split", "choose_stitch", "allow_stitch", "segment_layout", "evict_victim",
             "relieve_pressure")
    assert all(callable(vars(Policy)[hook]) and not Policy().overrides(hook) for hook in hooks)
    text = DOC.read_text()
    assert "## 2. The seven hooks" in text
    for hook in hooks:
        assert any(f"def {hook}(" in block for block in BLOCKS), hook
        assert f"| `{hook}(" in text, hook                        # in the table of seams


def test_the_examples_subclass_the_default_policy_where_a_user_would():
    bases = [block for block in BLOCKS if "(GMLakePolicy):" in block]
    assert len(bases) >= 5, len(bases)


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_example_runs(index):
    # running the doc's own code, as a reader would, is the point of the test
    exec(compile(BLOCKS[index], f"{DOC.name} example {index + 1}", "exec", dont_inherit=True),  # noqa: S102
         {"__name__": "policies_doc"})
