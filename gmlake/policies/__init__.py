"""Placement policies: how a request is placed, how blocks split, which stitched blocks are evicted.

`get(name)` returns a built-in policy by name: "gmlake" (an expandable base with virtual memory stitching, the
default), "gmlake-paper" (the paper's 2 MiB-chunk stitching), "caching" (a model
of PyTorch's native allocator) and "expandable" (a model of its expandable segments). Policies are frozen dataclasses
of knobs read once by the Cython core, so the built-in fast path runs with no Python. Subclass one and change its
fields, or override its hooks (`should_split`, `allow_stitch`), to try a variant: see `gmlake.policies.examples`.
"""
from __future__ import annotations

from dataclasses import fields
from typing import Iterable

from gmlake.policies.base import Policy
from gmlake.policies.caching import CachingPolicy
from gmlake.policies.expandable import ExpandablePolicy
from gmlake.policies.gmlake import GMLakePolicy, PaperPolicy

_BUILTIN: dict[str, type[Policy]] = {
    cls.name: cls for cls in (GMLakePolicy, PaperPolicy, CachingPolicy, ExpandablePolicy)
}


def names() -> list[str]:
    """Names of the built-in policies."""
    return list(_BUILTIN)


def get(name: str, **options) -> Policy:
    """A built-in policy by name, with its knobs overridden by `options`."""
    try:
        cls = _BUILTIN[name]
    except KeyError:
        raise ValueError(f"gmlake: unknown policy {name!r}; built-in policies: {', '.join(names())}") from None
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(options) - known)
    if unknown:
        raise ValueError(f"gmlake: policy {name} has no knob {', '.join(map(repr, unknown))}; "
                         f"its knobs: {', '.join(sorted(known))}")
    return cls(**options)


def parse_knobs(items: Iterable[str]) -> dict:
    """'knob=value' strings (from `--set` or GMLAKE_KNOBS) as knobs: integers, true/false, else strings."""
    knobs: dict = {}
    for item in items:
        name, sep, text = item.strip().partition("=")
        if not sep or not name.strip():
            raise ValueError(f"gmlake: a knob setting is knob=value, got {item!r}")
        low = text.strip().lower()
        digits = low.replace("_", "")
        knobs[name.strip()] = True if low == "true" else False if low == "false" else \
            int(digits) if digits.lstrip("-").isdigit() else text.strip()
    return knobs


__all__ = ["Policy", "GMLakePolicy", "PaperPolicy", "CachingPolicy", "ExpandablePolicy", "get", "names", "parse_knobs"]
