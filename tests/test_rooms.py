"""The core's rooms own their state: each room's field of the Allocator is written only by the room's own file
(docs/design.md, "The rooms"). A check of the source, so a change that writes another room's state is caught here."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

CORE = Path(__file__).resolve().parent.parent / "gmlake" / "core"
if not (CORE / "_allocator.pyx").is_file():
    pytest.skip("reads the core's sources, which an installed wheel does not carry (the source tree's run checks them)",
                allow_module_level=True)

# The Allocator's field for each room, and the one file whose functions may write it.
OWNERS = {
    "frees": "_blocks.pxi",
    "segments": "_segments.pxi",
    "sblock_cache": "_sblocks.pxi",
    "streams": "_streams.pxi",
    "pools": "_pools.pxi",
    "orphans": "_vmm.pxi",
}

# What changes a container or a room's value: an assignment, or a call of a method that changes its object.
MUTATORS = ("push_back", "pop_back", "erase", "insert", "clear", "swap", "put", "take", "take_at", "make", "drop",
            "assign", "resize", "add", "cache", "uncache", "forget")


def writes(field: str):
    return re.compile(rf"\b(?:self|a)\.{field}\.[\w.\[\]]*?(?:\s*[-+*/]?=(?!=)|\.(?:{'|'.join(MUTATORS)})\()")


def core_files():
    return sorted(p for p in CORE.iterdir() if p.suffix in (".pyx", ".pxi", ".pxd"))


@pytest.mark.parametrize("field", sorted(OWNERS))
def test_a_room_state_is_written_only_by_its_room(field):
    pattern = writes(field)
    found = [f"{path.name}:{n}: {line.strip()}"
             for path in core_files() if path.name != OWNERS[field]
             for n, line in enumerate(path.read_text().splitlines(), 1) if pattern.search(line)]
    assert not found, f"Allocator.{field} is room {OWNERS[field]}'s; written elsewhere:\n" + "\n".join(found)


def test_the_check_sees_writes():
    pattern = writes("streams")
    assert pattern.search("    self.streams.pending_per_stream[streams[i]] += 1")
    assert pattern.search("    self.streams.pending.push_back(pend)")
    assert pattern.search("    a.streams.spare_events = spares")
    assert not pattern.search("    if self.streams.pending.size() == 0:")
    assert not pattern.search("    n.events = self.streams.spare_events.size()")


def test_capturing_is_asked_of_the_pools_room():
    """Other rooms ask _capturing() whether a graph is captured; only the pools room (and the debug checks and the
    Python property, which report the count) reads its count."""
    readers = {"_pools.pxi", "_debug.pxi", "_allocator.pyx"}
    found = [f"{path.name}:{n}" for path in core_files() if path.name not in readers
             for n, line in enumerate(path.read_text().splitlines(), 1) if ".pools.capturing" in line]
    assert not found
    assert _allocator_reads() == 1


def _allocator_reads() -> int:
    return (CORE / "_allocator.pyx").read_text().count(".pools.capturing")


def _functions(path: Path) -> dict[str, str]:
    """Each module-level function of a core file, by name, with its text."""
    found, name, lines = {}, None, []
    for line in path.read_text().splitlines():
        m = re.match(r"(?:cdef|def)\s.*?(\w+)\(", line)
        if m and not line.startswith(" "):
            if name:
                found[name] = "\n".join(lines)
            name, lines = m.group(1), []
        lines.append(line)
    if name:
        found[name] = "\n".join(lines)
    return found


def test_whether_a_size_stitches_is_decided_in_one_place():
    """The built-in's stitch rule (`stitch`, `min_stitch_size`, `restitch_limit`, and the edge of memory lifting the
    limit) is read by one function, _may_stitch (the pressure loop sets the edge); the growth says only whether a
    stitch saves enough."""
    knob = re.compile(r"\.k\.(?:stitch|min_stitch_size|restitch_limit|restitch_room)\b|\.at_edge\b")
    readers = {f"{path.name}:{name}" for path in core_files() if path.suffix == ".pxi"
               for name, text in _functions(path).items() if knob.search(text)}
    growth = "_growth_expandable.pxi"   # at_edge there chooses the edge's pages and its saving (Growth)
    expected = {"_sblocks.pxi:_may_stitch", "_sblocks.pxi:_room_is_short", "_requests.pxi:_malloc_under_pressure"}
    assert {r for r in readers if not r.startswith(growth)} == expected


def test_the_device_reserve_rule_lives_in_one_room():
    """`device_reserve`, the libraries' measure (`libraries`, `libraries_half_life`) and whether a request has the
    reserve open (`reserve_open`) are read and written only by the reserve's own functions in _vmm.pxi (Note
    [Leaving the libraries room]), and the measure copied out for stats(); growth and the pressure loop ask them.
    Growth asks the device what is free only through _ask_device, which measures as it asks."""
    state = re.compile(r"\.k\.device_reserve\b|\.reserve_open\b|\.libraries\b|\.k\.libraries_half_life\b")
    readers = {f"{path.name}:{name}" for path in core_files() if path.suffix in (".pxi", ".pyx")
               for name, text in _functions(path).items() if state.search(text)}
    assert readers == {"_vmm.pxi:_ask_device", "_vmm.pxi:_reserve_kept", "_vmm.pxi:_alloc_from_reserve",
                       "_api_steps.pxi:_copy_stats"}, readers
    asking = re.compile(r"\.driver\.device_free\(")
    askers = {f"{path.name}:{name}" for path in core_files() if path.suffix in (".pxi", ".pyx")
              for name, text in _functions(path).items() if asking.search(text)}
    # the other asker records the free bytes in an out-of-memory's history entry, as PyTorch's snapshot does
    assert askers == {"_vmm.pxi:_ask_device", "_requests.pxi:_count_oom"}, askers


def _code(text: str) -> str:
    """A core file's code without its comments and docstrings, so a name only mentioned is not a call."""
    return re.sub(r"#[^\n]*", "", re.sub(r'"""[\s\S]*?"""', "", text))


def _included() -> list[str]:
    return re.findall(r'^include "(\w+\.pxi)"', (CORE / "_allocator.pyx").read_text(), re.MULTILINE)


def _listed_api(text: str) -> list[str]:
    """The names a file's opening comment lists under "# API (...)", in order."""
    lines = text.split("\n")
    start = next(i for i, line in enumerate(lines) if line.startswith("# API ("))
    names = []
    for line in lines[start + 1:]:
        if not line.startswith("#   "):
            break
        names += [n.strip() for n in line[4:].split(",") if n.strip() and n.strip() != "none"]
    return names


def _called_elsewhere(name: str) -> list[str]:
    """The functions and classes that file `name` defines at module level and that another core file's code names."""
    defined = re.findall(r"^(?:cdef|cpdef|def)\b[^\n(]*?(\w+)\(", (CORE / name).read_text(), re.MULTILINE)
    others = [_code(p.read_text()) for p in core_files() if p.name != name]
    return [d for d in defined if any(re.search(rf"\b{d}\b", text) for text in others)]


@pytest.mark.parametrize("name", _included() if (CORE / "_allocator.pyx").is_file() else [])
def test_each_room_file_opens_with_its_api(name):
    """Each file of the core's one compilation unit lists, in its opening comment, the functions the rest of the
    core calls, in the order it defines them, and only those (docs/design.md, "The rooms")."""
    assert _listed_api((CORE / name).read_text()) == _called_elsewhere(name), name


def test_the_api_lists_are_checked():
    assert _listed_api("# room\n#\n# API (what the rest calls):\n#   _a, _b\n#   _c\n\ncdef") == ["_a", "_b", "_c"]
    assert "_best_free" in _called_elsewhere("_blocks.pxi")
    assert "_malloc_small" not in _called_elsewhere("_requests.pxi")     # called only inside its own file


def test_the_design_room_table_names_only_listed_api():
    """Every function the room table of docs/design.md names as a room's API is in that room's files' API lists."""
    design = (CORE.parent.parent / "docs" / "design.md").read_text()
    rows = [line for line in design.split("\n") if line.startswith("| ") and "API:" in line and ".pxi`" in line]
    assert len(rows) >= 6
    for row in rows:
        files = re.findall(r"`(_\w+\.pxi)`", row.split("|")[2])
        listed = {n for f in files for n in _listed_api((CORE / f).read_text())}
        api_part = row.split("API:", 1)[1].split("|")[0]
        named = {n for n in re.findall(r"`(_\w+)`", api_part) if not n.endswith("*") and not n.endswith(".pxi")}
        assert named <= listed, (files, sorted(named - listed))
