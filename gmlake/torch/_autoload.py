"""`GMLAKE=1`: gmlake becomes PyTorch's CUDA allocator in every Python process, with no wrapper and no code change.

site-packages holds gmlake_autoload.pth, which Python runs at start-up. Unset (or GMLAKE=0) it costs one
os.environ lookup and imports nothing. Set, it imports this module and install() puts a finder on sys.meta_path that
waits for `import torch`: when torch's own module has finished executing (before anything can use CUDA), gmlake is
enabled with the GMLAKE_* settings, as `gmlake run` would. Processes that never import torch are left alone;
DataLoader workers that never touch CUDA get the allocator installed but never use it. If gmlake cannot be installed,
`import torch` raises, so a job never silently trains on PyTorch's own allocator.

A setting that cannot be right (GMLAKE=maybe, GMLAKE_LIMIT=abc, GMLAKE_KNOBS=nosuch=1, an unknown GMLAKE_POLICY) is
refused at start-up, before the program runs: one line on stderr naming the variable and what it accepts, exit
status 2 (GMLAKE_TRACEBACK=1 adds the traceback), as the gmlake command refuses bad input. A policy given as
module:Class or file.py:Class is not imported then (its code runs when torch is), so its knobs are checked then.
The check imports gmlake (not torch): tens of milliseconds at the start of each process GMLAKE=1 is set for, the
price of refusing a bad setting before the program runs rather than after its imports.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import traceback

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
        # cycle: runs while torch is being imported, and gmlake.torch imports torch
        from gmlake import torch as gtorch

        choice, limit = gtorch.policy_from_env()    # a bad setting is an error with any PyTorch
        build = _cpu_only_build()
        if build:
            # see Note [GMLAKE=1 with a CPU-only PyTorch]
            sys.stderr.write(f"gmlake: {VARIABLE}={os.environ.get(VARIABLE)} ignored: this PyTorch ({build}) has "
                             f"no CUDA allocator to replace\n")
            return
        gtorch.enable(choice, limit=limit)
    except Exception as exc:
        reason = str(exc).removeprefix("gmlake: ").removeprefix("cannot install gmlake as PyTorch's CUDA allocator: ")
        raise RuntimeError(
            f"gmlake: {VARIABLE}={os.environ.get(VARIABLE)} is set, but gmlake could not be installed as PyTorch's "
            f"CUDA allocator: {reason}. Unset {VARIABLE} to run on PyTorch's own allocator.") from exc


def _cpu_only_build() -> str | None:
    """The version of the imported PyTorch when it is a build without CUDA (nor ROCm), else None.

    Note [GMLAKE=1 with a CPU-only PyTorch]:
    A job's environment carries GMLAKE=1 into every process it starts, CPU-only helper scripts among them, and
    some of those run a CPU-only PyTorch. Such a build has no CUDA allocator to replace, so there is nothing for
    gmlake to do: like PyTorch, which ignores expandable_segments without CUDA, the script runs on (one line on
    stderr says gmlake was ignored). A CUDA build that finds no GPU is not this case: gmlake installs, unused.
    A bad GMLAKE_* setting is still refused first, whatever the build."""
    torch = sys.modules.get("torch")
    version = getattr(torch, "version", None)
    if getattr(version, "cuda", None) is not None or getattr(version, "hip", None) is not None:
        return None
    return str(getattr(torch, "__version__", "without a version"))


def _remove_finder() -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _EnableAfterTorch)]


# Variables that set knobs, whose values a policy's own checks (gmlake.policies.resolve) may refuse together.
_KNOB_VARIABLES = ("GMLAKE_POLICY", "GMLAKE_KNOBS", "GMLAKE_CHUNK_SIZE", "GMLAKE_MAX_CACHED_SBLOCKS",
                   "GMLAKE_MIN_STITCH_SIZE", "GMLAKE_STITCH")


def check_environment() -> None:
    """Parse every GMLAKE_* setting as gmlake.torch.enable_from_env will, without importing torch or a policy's own
    module or file; raise ValueError naming the variable."""
    # cycle: runs while torch is being imported, and gmlake.torch imports torch
    from gmlake import policies
    from gmlake import torch as gtorch
    from gmlake.drivers._cuda_driver import exportable_requested

    exportable_requested()                  # GMLAKE_IPC: 0 or 1 (Note [Exporting a chunk]); loads no CUDA
    opts = gtorch.options_from_env(load_policy_code=False)
    spec = opts.pop("policy", "gmlake")
    opts.pop("limit", None)
    if ":" in policies.split_spec(spec)[0]:
        return
    try:
        policies.resolve(spec, opts, 1)
    except ValueError as exc:
        given = [f"{var}={os.environ[var]}" for var in _KNOB_VARIABLES if os.environ.get(var, "").strip()]
        raise ValueError(f"{', '.join(given) or 'GMLAKE_POLICY=gmlake'}: {str(exc).removeprefix('gmlake: ')}") from exc


def _refuse(exc: BaseException) -> None:
    """One line on stderr and exit status 2, before the program runs. Raising would not do: site.py prints an
    exception from a .pth file as a traceback and goes on to run the program."""
    if os.environ.get("GMLAKE_TRACEBACK"):
        traceback.print_exception(exc)
    text = " ".join(str(exc).split()).removeprefix("gmlake: ")
    if not text.startswith(f"{VARIABLE}="):
        text += f" (unset {VARIABLE} to run without gmlake)"
    sys.stderr.write(f"gmlake: error: {text}\n")
    sys.stderr.flush()
    os._exit(2)


def install() -> None:
    """Called from gmlake_autoload.pth when $GMLAKE is set: check the GMLAKE_* settings (a bad one ends the process
    with one line and exit status 2), then enable gmlake when torch is imported."""
    try:
        if not requested():
            return
        check_environment()
    except Exception as exc:  # noqa: BLE001 - any failure to read the settings is reported the same way
        _refuse(exc)
    if "torch" in sys.modules:      # imported by an earlier .pth or sitecustomize: enable now, CUDA is not up yet
        enable_from_environment()
        return
    if not any(isinstance(f, _EnableAfterTorch) for f in sys.meta_path):
        sys.meta_path.insert(0, _EnableAfterTorch())
