"""`GMLAKE=1`: gmlake becomes PyTorch's CUDA allocator in every Python process, with no wrapper and no code change.

site-packages holds gmlake_autoload.pth, which Python runs at start-up. Unset (or GMLAKE=0) it costs one
os.environ lookup and imports nothing. Set, it imports this module and install() puts a finder on sys.meta_path that
waits for `import torch`: when torch's own module has finished executing (before anything can use CUDA), gmlake is
enabled with the GMLAKE_* settings, as `gmlake run` would. Processes that never import torch are left alone;
DataLoader workers that never touch CUDA get the allocator installed but never use it. If gmlake cannot be installed,
`import torch` raises, so a job never silently trains on PyTorch's own allocator.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys

VARIABLE = "GMLAKE"
_OFF = ("", "0", "false", "no", "off")
_ON = ("1", "true", "yes", "on")


def requested() -> bool:
    """Whether $GMLAKE asks for gmlake; a value that is neither on nor off is an error, not a guess."""
    value = os.environ.get(VARIABLE, "").strip().lower()
    if value in _OFF:
        return False
    if value in _ON:
        return True
    raise ValueError(f"gmlake: {VARIABLE}={os.environ[VARIABLE]!r}: use 1 to turn gmlake on, 0 or unset for off")


class _EnableAfterTorch(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for `torch`, it wraps the real loader so gmlake is enabled right after torch loads."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                spec.loader = _Loader(spec.loader)
                return spec
        return None


class _Loader(importlib.abc.Loader):
    def __init__(self, loader: importlib.abc.Loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        self.loader.exec_module(module)
        _remove_finder()
        # torch is fully imported now; give it back its own loader (resource readers, is_package, ...).
        module.__loader__ = module.__spec__.loader = self.loader
        enable_from_environment()


def enable_from_environment() -> None:
    """Enable gmlake with the GMLAKE_* settings; on failure raise an error that says how to run without it."""
    try:
        if not requested():
            return
        from gmlake import torch as gtorch

        gtorch.enable_from_env()
    except Exception as exc:
        reason = str(exc).removeprefix("gmlake: ").removeprefix("cannot install gmlake as PyTorch's CUDA allocator: ")
        raise RuntimeError(
            f"gmlake: {VARIABLE}={os.environ.get(VARIABLE)} is set, but gmlake could not be installed as PyTorch's "
            f"CUDA allocator: {reason}. Unset {VARIABLE} to run on PyTorch's own allocator.") from exc


def _remove_finder() -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _EnableAfterTorch)]


def install() -> None:
    """Called from gmlake_autoload.pth when $GMLAKE is set: enable gmlake when torch is imported.

    A value that is neither on nor off is reported when torch is imported (an error raised here, during start-up,
    would only be printed by site.py), so only programs that use torch fail on it.
    """
    try:
        if not requested():
            return
    except ValueError:
        pass
    if "torch" in sys.modules:      # imported by an earlier .pth or sitecustomize: enable now, CUDA is not up yet
        enable_from_environment()
        return
    if not any(isinstance(f, _EnableAfterTorch) for f in sys.meta_path):
        sys.meta_path.insert(0, _EnableAfterTorch())
