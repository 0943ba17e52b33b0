"""bench's own tests (a package, so that their modules and conftest never meet gmlake's tests/ of the same names)."""
