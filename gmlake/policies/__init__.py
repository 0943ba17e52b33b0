"""Placement policies: how a request is placed, how blocks split, which stitched blocks are evicted.

Built-in policies: "gmlake" (an expandable base with virtual memory stitching, the default), "gmlake-paper" (the
paper's 2 MiB-chunk stitching), "caching" (a model of PyTorch's native allocator) and "expandable" (a model of its
expandable segments). Policies are frozen dataclasses of knobs read once by the Cython core, so the built-in fast
path runs with no Python. Subclass one and change its fields, or override its hooks (`should_split`,
`allow_stitch`), to try a variant: see `gmlake.policies.examples`.

Every command and `gmlake run` name a policy by a spec, resolved here by `resolve()`:

    gmlake                            a built-in policy
    NAME                              a policy an installed package declares (entry point group gmlake.policies)
    package.module:Class              a Policy subclass importable from the current folder or sys.path
    path/to/file.py:Class             a Policy subclass defined in that file (the file is executed: it is code)
    SPEC[knob=value,knob=value]       any of the above with its own knobs (sizes take units: chunk_size=8MiB)
"""
from __future__ import annotations

from gmlake.core._allocator import set_default_policy
from gmlake.policies.base import Policy
from gmlake.policies.caching import CachingPolicy
from gmlake.policies.expandable import ExpandablePolicy
from gmlake.policies.gmlake import GMLakePolicy, PaperPolicy
from gmlake.policies.knobs import Knobs, knob
from gmlake.policies.spec import (
    ENTRY_POINT_GROUP,
    SPEC_HELP,
    PolicyChoice,
    choice_of,
    choose,
    get,
    installed,
    names,
    policy_class,
    resolve,
    split_spec,
    split_targeted,
)

set_default_policy(GMLakePolicy)     # what Allocator(driver) uses: the core names no policy itself

__all__ = [
    "ENTRY_POINT_GROUP",
    "SPEC_HELP",
    "CachingPolicy",
    "ExpandablePolicy",
    "GMLakePolicy",
    "Knobs",
    "PaperPolicy",
    "Policy",
    "PolicyChoice",
    "choice_of",
    "choose",
    "get",
    "installed",
    "knob",
    "names",
    "policy_class",
    "resolve",
    "split_spec",
    "split_targeted",
]
