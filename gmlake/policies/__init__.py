"""Placement policies: how a request is placed, how blocks split, which stitched blocks are evicted.

`get(name)` returns a built-in policy by name. Policies are frozen dataclasses of knobs read once by the Cython core,
so the built-in fast path runs with no Python; subclass one and change its fields to try a variant.
"""
from __future__ import annotations

from gmlake.policies.base import Policy
from gmlake.policies.gmlake import GMLakePolicy

_BUILTIN: dict[str, type[Policy]] = {
    GMLakePolicy.name: GMLakePolicy,
}


def names() -> list[str]:
    """Names of the built-in policies."""
    return sorted(_BUILTIN)


def get(name: str, **options) -> Policy:
    """A built-in policy by name, with its knobs overridden by `options`."""
    try:
        cls = _BUILTIN[name]
    except KeyError:
        raise ValueError(f"gmlake: unknown policy {name!r}; built-in policies: {', '.join(names())}") from None
    return cls(**options)


__all__ = ["Policy", "GMLakePolicy", "get", "names"]
