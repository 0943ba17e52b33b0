"""The package's layers (docs/design.md, "The package by layer"): imports point one way, inside functions too, and a
training job's install needs none of the analysis tools' dependencies."""
from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

import gmlake

# The package as it is imported: the source tree, or an installed wheel (which carries the stubs and .pxd files,
# not the .pyx and .pxi sources it was compiled from).
PACKAGE = Path(gmlake.__file__).resolve().parent
LAYERS = ("core", "drivers", "policies", "torch", "sim", "cli")
# What each layer may import, besides itself. "gmlake" is the package's own __init__: the names most code needs,
# gathered from core, drivers and policies.
ALLOWED = {
    "core": set(),
    "drivers": {"core"},
    "policies": {"core"},
    "gmlake": {"core", "drivers", "policies"},
    "torch": {"gmlake", "core", "drivers", "policies"},
    "sim": {"gmlake", "core", "drivers", "policies"},
    "cli": {"gmlake", "core", "drivers", "policies", "torch", "sim"},
}
_CIMPORT = re.compile(r"^\s*(?:from\s+(gmlake(?:\.\w+)*)\s+cimport\s+(.+)|cimport\s+(gmlake(?:\.\w+)*))", re.MULTILINE)


def layer_of_module(name: str) -> str:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else "gmlake"


def layer_of_file(path: Path) -> str:
    rel = path.relative_to(PACKAGE).parts
    return rel[0] if len(rel) > 1 and rel[0] in LAYERS else "gmlake"


def imports_of(path: Path) -> list[tuple[int, str]]:
    """Every gmlake module `path` imports or cimports, anywhere in it (inside functions too), with its line."""
    text = path.read_text()
    found = []
    if path.suffix in (".py", ".pyi"):
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Import):
                found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "gmlake"]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                    and node.module.split(".")[0] == "gmlake":
                if node.module == "gmlake":      # `from gmlake import sim` names a layer; `import Allocator` not
                    found += [(node.lineno, f"gmlake.{a.name}" if a.name in LAYERS else "gmlake") for a in node.names]
                else:
                    found.append((node.lineno, node.module))
    else:
        for m in _CIMPORT.finditer(text):
            found.append((text.count("\n", 0, m.start()) + 1, m.group(1) or m.group(3)))
        for m in re.finditer(r"^\s*(?:from\s+(gmlake(?:\.\w+)*)\s+import|import\s+(gmlake(?:\.\w+)*))", text, re.MULTILINE):
            found.append((text.count("\n", 0, m.start()) + 1, m.group(1) or m.group(2)))
    return found


SOURCES = sorted(p for p in PACKAGE.rglob("*") if p.suffix in (".py", ".pyi", ".pyx", ".pxd", ".pxi"))


def test_every_source_file_sits_in_a_layer():
    loose = [p.name for p in SOURCES if layer_of_file(p) == "gmlake" and p.name not in ("__init__.py", "__main__.py")]
    assert not loose, f"modules outside every layer: {loose}"
    assert {layer_of_file(p) for p in SOURCES} == {*LAYERS, "gmlake"}


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_point_down_the_layers(path):
    mine = layer_of_file(path)
    if path.name == "__main__.py":
        mine = "cli"
    wrong = [f"line {line}: {module}" for line, module in imports_of(path)
             if layer_of_module(module) != mine and layer_of_module(module) not in ALLOWED[mine]]
    assert not wrong, f"{path.relative_to(PACKAGE)} ({mine}) imports a layer above or beside it: {wrong}"


def test_the_import_graph_has_no_cycle():
    """Between modules, not only layers: a cycle hidden by an import inside a function still counts."""
    def module_of(path: Path) -> str:
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts.pop()
        return ".".join(parts)

    graph: dict[str, set[str]] = {}
    names = {module_of(p) for p in SOURCES}
    for p in SOURCES:
        if p.suffix == ".pxi":      # included into the module that includes it, not imported
            continue
        me = module_of(p)
        targets = set()
        for _, module in imports_of(p):
            while module not in names and "." in module:
                module = module.rsplit(".", 1)[0]
            if module != me and not me.startswith(module + ".") and not module.startswith(me + "."):
                targets.add(module)
        graph[me] = targets
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in graph.get(node, ()):
            if state.get(nxt) == 1:
                raise AssertionError(f"import cycle: {' -> '.join(path[path.index(nxt):] + [nxt])}")
            if nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])


LIGHT = """
import sys
for name in ("numpy", "matplotlib"):
    sys.modules[name] = None            # as after `pip install gmlake` without the sim extra
import gmlake, gmlake.torch, gmlake.policies, gmlake.cli
from gmlake.cli import main
assert "numpy" not in [m for m in sys.modules if sys.modules[m] is not None], "numpy was imported"
sys.exit(main(sys.argv[1:]))
"""


def test_a_training_install_needs_neither_numpy_nor_matplotlib():
    proc = subprocess.run([sys.executable, "-c", LIGHT, "policies"], capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode == 0, proc.stderr


def test_an_analysis_command_without_the_sim_extra_names_the_extra_in_one_line():
    proc = subprocess.run([sys.executable, "-c", LIGHT, "traces"], capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "gmlake[sim]" in lines[0], proc.stderr


# A measured figure: a time, a percentage, a ratio with decimals, a count of traces, or the machine it ran on.
_FIGURE = re.compile(r"\b\d+(?:\.\d+)? ?(?:µs|ms|%)|\bH[12]00\b|\b\d+\.\d+x\b|\b\d+ of \d+ traces\b")
CORE_AND_POLICIES = sorted(p for layer in ("core", "drivers", "policies") for p in (PACKAGE / layer).iterdir()
                           if p.suffix in (".py", ".pyx", ".pxd", ".pxi", ".h"))


@pytest.mark.parametrize("path", CORE_AND_POLICIES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_core_comments_hold_no_measured_figures(path):
    """Notes say why and point to docs/benchmarks.md; re-recording a benchmark never edits the core."""
    found = [f"line {n}: {line.strip()}" for n, line in enumerate(path.read_text().splitlines(), 1)
             if _FIGURE.search(line)]
    assert not found, f"{path.relative_to(PACKAGE)} quotes measurements (move them to docs/benchmarks.md): {found}"



# A module with one role reads in one sitting; past this size a file is usually holding two. Checked on the
# allocator's compilation unit: _allocator.pyx and the rooms it includes.
MAX_LINES = 600
CORE = PACKAGE / "core"
ROOMS = sorted(p for p in CORE.iterdir() if p.name == "_allocator.pyx" or p.suffix == ".pxi")


@pytest.mark.skipif(not ROOMS, reason="reads the core's sources, which an installed wheel does not carry")
@pytest.mark.parametrize("path", ROOMS, ids=lambda p: p.name)
def test_every_core_room_stays_under_600_lines(path):
    """A room that grows past this is split by role (docs/design.md, "The rooms")."""
    n = len(path.read_text().splitlines())
    assert n <= MAX_LINES, f"core/{path.name} has {n} lines; split it by role (at most {MAX_LINES})"


def test_the_size_check_reads_every_room():
    if not ROOMS:
        pytest.skip("reads the core's sources, which an installed wheel does not carry")
    names = {p.name for p in ROOMS}
    assert {"_allocator.pyx", "_requests.pxi", "_seams.pxi", "_hooks.pxi", "_sblocks.pxi"} <= names


# bench/ is the lab's one small tool beside the package: its code, tests and the docs generator aside
# (bench/report_docs/, one module per document, renders the result records), stays under this many lines, so that it
# cannot grow back into a second product unseen. Read as text: the product's tests never import bench.
BENCH = Path(__file__).resolve().parent.parent / "bench"
BENCH_MAX_LINES = 5070     # 4300 until bench speed-ab (about 390 lines), ipc-price (95) and sync-price (100) came;
#                            4800 until bench plan-goals (about 205) came; 5010 until the moe program (about 55) came


@pytest.mark.skipif(not BENCH.is_dir(), reason="reads bench/, which only a checkout carries")
def test_bench_stays_one_small_tool():
    sizes = {p.relative_to(BENCH).as_posix(): len(p.read_text().splitlines()) for p in BENCH.rglob("*.py")
             if p.relative_to(BENCH).parts[0] not in ("tests", "report_docs")}
    total = sum(sizes.values())
    largest = sorted(sizes.items(), key=lambda item: -item[1])[:5]
    assert total <= BENCH_MAX_LINES, (f"bench/ has {total} lines of code, tests and report_docs/ aside (at most "
                                      f"{BENCH_MAX_LINES}): drop a feature or merge repeated code; largest: {largest}")


def test_the_products_tests_never_import_bench():
    """bench/ is lab tooling beside the package: a test that imports it belongs in bench/tests."""
    pattern = re.compile(r"^\s*(?:from bench\b|import bench\b)|importorskip\(\s*[\"']bench\b", re.MULTILINE)
    found = [p.name for p in Path(__file__).resolve().parent.rglob("*.py") if pattern.search(p.read_text())]
    assert not found, found


_NOTE = re.compile(r"Note \[([^\]]+)\]:")
DESIGN = PACKAGE.parent / "docs" / "design.md"


@pytest.mark.skipif(not ROOMS or not DESIGN.exists(), reason="reads the sources and docs/design.md, which a wheel lacks")
def test_every_note_is_in_the_design_index():
    """A Note is found from docs/design.md's "Index of the Notes": each one the package defines has its row."""
    index = DESIGN.read_text().split("## Index of the Notes", 1)[1]
    defined = {m.group(1): path for path in sorted(PACKAGE.rglob("*")) if path.suffix in (".py", ".pyx", ".pxi", ".h")
               for m in _NOTE.finditer(path.read_text())}
    missing = sorted(f"{name} ({path.relative_to(PACKAGE)})" for name, path in defined.items()
                     if f"| {name} |" not in index)
    assert defined and not missing, f"Notes without a row in docs/design.md's index: {missing}"
