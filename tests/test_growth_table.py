"""The table of growths (gmlake/policies/growths.py) describes each growth once: the knob rules derive from it, the
Allocator makes the class it names, nothing else compares a growth's name, and the reports that differ by growth
(the out-of-memory hint, `explain`) ask the growth itself. Each knob is declared once (gmlake/policies/knobs.py):
the core's C struct is held to the declarations, and docs/policies.md documents every knob."""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from gmlake.policies import knobs as knob_module
from gmlake.policies.growths import GROWTHS, SEGMENT_RULES, SIZING, STITCHING

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "gmlake"
TABLE = PACKAGE / "policies" / "growths.py"
if not (PACKAGE / "core" / "_allocator.pxd").is_file():
    pytest.skip("reads the package's sources, which an installed wheel does not carry", allow_module_level=True)

NAME = "|".join(re.escape(n) for n in GROWTHS)
# A growth's name compared, looked up or mapped to a class: what only the table may do.
COMPARES = re.compile(
    rf"segment_rule\s*(?:==|!=)\s*[\"']|[\"'](?:{NAME})[\"']\s*(?:==|!=)\s*\S*segment_rule"
    rf"|segment_rule\s+(?:not\s+)?in\s+[(\[{{]\s*[\"']|[\"'](?:{NAME})[\"']\s*:\s*\w*Growth\b")
# Guessing the growth from what it says of itself, outside the core: ask its methods instead.
GUESSES = re.compile(r"growth\.(?:stitches|fit_counts_unmapped)\b|isinstance\([^)]*\b(?:Chunk|PyTorch|Expandable)Growth")


def sources():
    return sorted(p for p in PACKAGE.rglob("*") if p.suffix in (".py", ".pyx", ".pxi", ".pxd") and p != TABLE)


def test_no_file_outside_the_table_compares_a_growth_name():
    found = [f"{p.relative_to(ROOT)}:{n}: {line.strip()}" for p in sources()
             for n, line in enumerate(p.read_text().splitlines(), 1) if COMPARES.search(line)]
    assert not found, "a growth's name is compared outside gmlake/policies/growths.py:\n" + "\n".join(found)


def test_no_room_above_the_core_guesses_the_growth():
    found = [f"{p.relative_to(ROOT)}:{n}: {line.strip()}" for p in sources() if "core" not in p.parts
             for n, line in enumerate(p.read_text().splitlines(), 1) if GUESSES.search(line)]
    assert not found, "ask the growth (page, oom_pages, whole_pages), not its flags:\n" + "\n".join(found)


def test_the_checks_see_a_comparison():
    for line in ('page = p.chunk_size if policy.segment_rule == "chunks" else 0',
                 "if 'expandable' != self.segment_rule:", 'if policy.segment_rule in ("chunks", "expandable"):',
                 '{"chunks": ChunkGrowth, "pytorch": PyTorchGrowth}[rule]()'):
        assert COMPARES.search(line), line
    assert not COMPARES.search("if self.segment_rule not in SEGMENT_RULES:")
    assert GUESSES.search("    elif a.growth.stitches:")
    assert GUESSES.search("if isinstance(g, ExpandableGrowth):")


def test_the_knob_rules_derive_from_the_table():
    assert knob_module.SEGMENT_RULES == SEGMENT_RULES == tuple(GROWTHS)
    assert knob_module.STITCHING == STITCHING == tuple(n for n, row in GROWTHS.items() if row.stitches)
    assert knob_module.SIZING == SIZING == {n: row.sizing for n, row in GROWTHS.items()}
    specs = knob_module.knob_specs()
    for name, row in GROWTHS.items():
        for knob in row.pages + row.sizing:
            assert knob in specs and name in specs[knob]["growths"], (name, knob)


def test_every_policy_makes_the_class_its_row_names():
    from gmlake import policies
    from gmlake.core import Allocator
    from gmlake.drivers import SimDriver

    for spec in ("gmlake", "gmlake-paper", "caching", "expandable"):
        policy = policies.get(spec)
        alloc = Allocator(SimDriver(1 << 34), policy)
        assert type(alloc.growth) is GROWTHS[policy.segment_rule].cls
        assert type(policy.growth()) is GROWTHS[policy.segment_rule].cls
        alloc.close()


def _marked(cls):
    """A growth of `cls` whose answers are marked: what asks it returns the mark, what guesses does not."""
    class Marked(cls):
        def page(self, policy, binds=False):
            return 7 << 20

        def oom_pages(self, policy):
            return 7 << 20, 9 << 20, 3 << 20
    return Marked


@pytest.mark.parametrize("rule", sorted(GROWTHS))
def test_explain_takes_the_page_from_the_growth(rule):
    from gmlake import policies
    from gmlake.sim.explain import explain
    from gmlake.sim.replay import bundled_traces
    from gmlake.sim.trace import load

    base = policies.get("gmlake")
    marked = _marked(GROWTHS[rule].cls)

    @dataclass(frozen=True)
    class Asked(type(base)):
        segment_rule: str = rule

        def cython_growth(self):
            return marked()

    trace = load(bundled_traces()[0])
    out = explain(trace, Asked())
    assert out.page == 7 << 20
    # and what the built-in growth of that row answers is its own page knob
    plain = policies.get("gmlake").__class__(segment_rule=rule) if rule != "chunks" else policies.get("gmlake-paper")
    page = plain.growth().page(plain)
    assert page == 0 if not GROWTHS[rule].pages else page == getattr(plain, GROWTHS[rule].pages[0])


def test_the_hint_takes_its_pages_from_the_growth():
    """The out-of-memory hint (torch bridge) passes what the growth's oom_pages says, and sizes what fits under a
    bound with its whole_pages; each built-in growth answers with its own page knobs, or None where it maps no
    range in place."""
    bridge = (PACKAGE / "torch" / "_torch_bridge.pyx").read_text()
    assert "a.growth.oom_pages(a.policy)" in bridge and "a.growth.whole_pages(a, " in bridge
    from gmlake import policies

    for spec in ("gmlake", "gmlake-paper", "caching", "expandable"):
        policy = policies.get(spec)
        row = GROWTHS[policy.segment_rule]
        page, capped, tail = policy.growth().oom_pages(policy)
        if page is None:
            assert capped is None and tail is None
        else:
            assert page == getattr(policy, row.pages[0])
            assert {"capped_page_large", "tail_page"} <= set(row.pages)
    assert _marked(GROWTHS["pytorch"].cls)().oom_pages(None) == (7 << 20, 9 << 20, 3 << 20)


# ----------------------------------------------------------------------------------------------------- knobs once

C_TYPES = {bool: "bint", int: "size_t"}
DERIVED_ONLY = {"slot"}                              # derived in Knobs.core_knobs from several knobs
FROM_THE_CORE = re.compile(r"^(?:hook_\w+|fit_counts_unmapped)$")   # what the core fills in itself


def struct_fields() -> dict[str, str]:
    text = (PACKAGE / "core" / "_allocator.pxd").read_text()
    body = text[text.index("cdef struct Knobs:"):].split("\n\n", 1)[0]
    return {m.group(2): m.group(1) for m in re.finditer(r"^\s+(\w+)\s+(\w+)\s*(?:#.*)?$", body, re.MULTILINE)}


def struct_mismatches(c: dict[str, str]) -> list[str]:
    """How the C struct `c` (field -> C type) differs from the knobs as declared and as the core reads them."""
    from dataclasses import fields

    declared = {f.name: f.type for f in fields(knob_module.Knobs)}
    knobs = knob_module.Knobs().core_knobs(1 << 34)
    found = []
    for name, value in knobs.items():
        py = bool if isinstance(value, bool) else int
        if name not in c:
            found.append(f"knob {name} has no field in Knobs (gmlake/core/_allocator.pxd)")
        elif c[name] != C_TYPES[py]:
            found.append(f"Knobs.{name} is {c[name]} in C, {py.__name__} in knobs.py")
        if name in declared and declared[name] not in (py.__name__, py):
            found.append(f"knob {name} is declared {declared[name]} but its value is {py.__name__}")
        if name not in declared and name not in DERIVED_ONLY:
            found.append(f"the core reads {name}, which no knob declares and no rule derives")
    found += [f"field {n} of the C struct is no knob" for n in c if n not in knobs and not FROM_THE_CORE.match(n)]
    return found


def test_the_c_struct_holds_each_declared_knob_by_name_and_type():
    found = struct_mismatches(struct_fields())
    assert not found, "\n".join(found)


def test_the_struct_check_sees_a_mismatch():
    fields = struct_fields()
    assert struct_mismatches({**fields, "stitch": "size_t"})
    assert struct_mismatches({k: v for k, v in fields.items() if k != "tail_page"})
    assert struct_mismatches({**fields, "stale_knob": "size_t"})


def test_every_knob_of_the_built_in_policies_is_documented():
    from dataclasses import fields

    from gmlake import policies

    doc = (ROOT / "docs" / "policies.md").read_text()
    missing = sorted({f.name for spec in ("gmlake", "gmlake-paper", "caching", "expandable")
                      for f in fields(policies.get(spec)) if f"`{f.name}`" not in doc})
    assert not missing, f"docs/policies.md documents no {', '.join(missing)}"
