from __future__ import annotations

import functools

import pytest

import gmlake

MiB = 1 << 20


@functools.lru_cache(maxsize=1)
def _cuda_ok() -> bool:
    return gmlake.cuda_available()


def pytest_collection_modifyitems(config, items):
    if _cuda_ok():
        return
    skip = pytest.mark.skip(reason="no CUDA device here")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(params=["sim", "host"])
def driver(request):
    """A fresh modelled driver of each kind (2 MiB granularity, like an H200)."""
    return gmlake.SimDriver() if request.param == "sim" else gmlake.HostDriver()


def snapshot(alloc: gmlake.Allocator) -> tuple:
    """Everything observable about an allocator's state, for 'nothing changed' checks."""
    return alloc.stats(), alloc.segments_info()
