"""docs/guide.md's generated section: the out-of-memory message the torch bridge writes."""
from __future__ import annotations

from collections.abc import Callable

from bench import ROOT
from bench.report_docs.common import GiB, MiB, _fill

DOC = ROOT / "docs" / "guide.md"


def oom_message() -> str:
    """docs/guide.md: the out-of-memory message a 1 GiB request meets under a 2 GiB cap on an H200 (that device's
    capacity and free memory), as the torch bridge writes it."""
    from gmlake.core.errors import OutOfMemoryError

    error = OutOfMemoryError(requested=GiB, reserved=1536 * MiB, allocated=1536 * MiB, cached=0, limit=2 * GiB,
                             capacity=143156 * MiB)
    return "```\n" + _fill(error.torch_message(0, device_free=int(137.62 * GiB), stitches=3), 115) + "\n```\n"


TABLES: dict[str, Callable[[], str]] = {"oom-message": oom_message}
