"""Fixtures of bench's own tests. bench is lab tooling run from a checkout; these tests import it from there (the
repository root is on pytest's pythonpath), and share gmlake's test helpers (tests/conftest.py), while gmlake's
product tests under tests/ import nothing of bench."""
from __future__ import annotations

from tests.conftest import pytest_collection_modifyitems  # noqa: F401  (GPU tests skip where no CUDA device is)
