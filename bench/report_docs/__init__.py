"""Rewrite the generated tables of the docs: docs/benchmarks.md's from the result files in bench/results, and the
manual's sample outputs and replayed figures (docs/policies.md) by running the commands they show.

    python -m bench report docs [--check] [--doc docs/policies.md ...]

It also draws docs/training.png, the README's figure, from the training suite's results, and docs/tune.png from the
tune sample's run (docs/policies.md).
Each generated table sits between `<!-- generated: NAME -->` and `<!-- end generated -->`; everything else in the
document is prose and stays as it is. NAME picks the table and the results it is made of (each document has a module
here that names them), so the figures in the document are the files' and nothing else. --check rewrites nothing and
exits 1 if the document is not what the files give (a stale table).
"""
from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from bench import ROOT
from bench.cli import OneLineParser
from bench.report_docs import benchmarks, graphs, guide, policies, readme
from bench.report_docs.common import MARK

# The documents whose generated sections this command rewrites, one module each: the benchmark docs, and the manual's
# sample outputs and figures that replay computes. Each names its DOC and its TABLES (NAME -> the section's text),
# and draws its figures in draw() where it has any.
DOCUMENTS = [benchmarks, policies, guide, graphs, readme]
DOCS = [module.DOC for module in DOCUMENTS]
TABLES: dict[str, Callable[[], str]] = {name: table for module in DOCUMENTS for name, table in module.TABLES.items()}
assert len(TABLES) == sum(len(module.TABLES) for module in DOCUMENTS), "two documents name the same section"


def render(text: str) -> str:
    """`text` with every generated section rewritten; an unknown NAME raises ValueError."""
    def one(match) -> str:
        name = match["name"]
        if name not in TABLES:
            raise ValueError(f"no generated table {name!r}; one of: {', '.join(TABLES)}")
        return match.group(1) + TABLES[name]() + match.group(4)

    return MARK.sub(one, text)


def main(argv: list[str] | None = None, prog: str = "bench report docs") -> int:
    parser = OneLineParser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument("--doc", type=Path, action="append",
                        help="a document to rewrite (repeatable; default: " + ", ".join(
                            str(d.relative_to(ROOT)) for d in DOCS) + ")")
    parser.add_argument("--check", action="store_true", help="rewrite nothing; exit 1 if a table is stale")
    args = parser.parse_args(argv)
    stale = []
    for doc in args.doc or DOCS:
        try:
            text = doc.read_text()
            new = render(text)
        except (OSError, ValueError, KeyError) as exc:
            parser.error(f"{doc}: {exc}")
        if args.check:
            if new != text:
                stale.append(doc)
            continue
        if new != text:
            doc.write_text(new)
        print(f"{doc}: {len(MARK.findall(text))} generated sections" + (", rewritten" if new != text else ""))
    if args.check:
        for doc in stale:
            print(f"{doc}: stale: run python -m bench report docs", file=sys.stderr)
        if not stale:
            print("up to date")
        return 1 if stale else 0
    chosen = {doc.resolve() for doc in args.doc or DOCS}
    for module in DOCUMENTS:            # each chosen document's figures, from the records its sections show
        if module.DOC in chosen and hasattr(module, "draw"):
            for png in module.draw():
                print(f"drew {png}")
    return 0
