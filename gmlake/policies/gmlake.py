"""The default policy: GMLake's virtual memory stitching, with packing below chunk level."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from gmlake.policies.base import Policy


@dataclass(frozen=True)
class GMLakePolicy(Policy):
    """Best fit, split, then stitch free chunks before asking the driver for new ones (the defaults of Policy)."""

    name: ClassVar[str] = "gmlake"
