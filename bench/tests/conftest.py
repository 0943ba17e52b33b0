"""Fixtures of bench's own tests. bench is lab tooling run from a checkout; these tests import it from there (the
repository root is on pytest's pythonpath), while gmlake's product tests under tests/ import nothing of it."""
from __future__ import annotations

import functools

import pytest

import gmlake
from bench import ROOT


@functools.lru_cache(maxsize=1)
def _cuda_ok() -> bool:
    return gmlake.cuda_available()


def pytest_collection_modifyitems(config, items):
    if _cuda_ok():
        return
    skip = pytest.mark.skip(reason="no CUDA device here")
    for item in items:
        if "gpu" in item.keywords and item.path.is_relative_to(ROOT / "bench"):
            item.add_marker(skip)

