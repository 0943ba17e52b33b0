"""Installing gmlake as PyTorch's CUDA allocator: enable(), and the GMLAKE_* settings that `GMLAKE=1` and `gmlake run`
read (see README and docs/guide.md)."""
from __future__ import annotations

import atexit
import ctypes
import os
import warnings
from typing import Any

from gmlake import policies
from gmlake.core._allocator import Allocator
from gmlake.policies.settings import coerce_knobs, env_knobs, parse_bool, parse_size
from gmlake.torch import _torch_bridge, sharing
from gmlake.torch.capture import torch_cuda_problem
from gmlake.torch.memory_api import install_memory_api
from gmlake.torch.state import _enabled, _history_settings

# The C entry points in gmlake/torch/_torch_bridge.pyx, and the CUDAPluggableAllocator hook each one serves, where
# torch's Python CUDAPluggableAllocator installs them (without the allocator shim: install_allocator).
_HOOKS = {
    "set_init_fn": "gmlake_init",
    "set_reset_fn": "gmlake_reset",
    "set_memory_fraction_fn": "gmlake_memory_fraction",
    "set_base_alloc_fn": "gmlake_base_alloc",
    "set_record_stream_fn": "gmlake_record_stream",
    # CUDA graphs' private pools (PyTorch 2.3+): Note [Graph pools through the bridge] in _torch_bridge.pyx.
    "set_begin_allocate_to_pool": "gmlake_begin_allocate_to_pool",
    "set_end_allocate_to_pool_fn": "gmlake_end_allocate_to_pool",
    "set_release_pool": "gmlake_release_pool",
}


def _env_size(name: str) -> int | None:
    """A GMLAKE_* variable holding bytes (units allowed: 8MiB), or None where unset."""
    value = os.environ.get(name)
    if value in (None, ""):
        return None
    return parse_size(value.strip(), what=name)


def options_from_env(load_policy_code: bool = True) -> dict:
    """Policy and limit settings from GMLAKE_* environment variables (see README), typed by the policy's knobs with
    the same strict parsing as `gmlake run --set` (GMLAKE_STITCH=maybe is an error, not True). GMLAKE_POLICY is any
    policy spec (see gmlake.policies.resolve): a built-in or installed name, module:Class or file.py:Class (whose
    file runs), optionally with inline knobs `NAME[knob=value]`. A ValueError names the variable it is about.
    `load_policy_code=False` (the start-up check of GMLAKE=1): a module:Class or file.py:Class policy is not imported,
    so its knobs are parsed but not typed by it."""
    def named(var: str, parse, *args):
        try:
            return parse(*args)
        except ValueError as exc:
            text = str(exc).removeprefix("gmlake: ")
            raise ValueError(text if text.startswith(var) else f"{var}={os.environ.get(var, '')}: {text}") from exc

    opts: dict[str, Any] = {}
    name = os.environ.get("GMLAKE_POLICY", "").strip() or "gmlake"
    if os.environ.get("GMLAKE_POLICY", "").strip():
        opts["policy"] = name
    given: list[tuple[str, dict[str, object]]] = []    # (variable, its knobs); later ones win
    knobs = named("GMLAKE_KNOBS", env_knobs)     # any knobs, "k=v,k=v"; the specific variables below win
    if knobs:
        given.append(("GMLAKE_KNOBS", knobs))
    for var, knob in (("GMLAKE_CHUNK_SIZE", "chunk_size"), ("GMLAKE_MAX_CACHED_SBLOCKS", "max_cached_sblocks"),
                      ("GMLAKE_MIN_STITCH_SIZE", "min_stitch_size")):
        value = named(var, _env_size, var)
        if value is not None:
            given.append((var, {knob: value}))
    if os.environ.get("GMLAKE_STITCH"):
        given.append(("GMLAKE_STITCH", {"stitch": named("GMLAKE_STITCH", lambda: parse_bool(
            os.environ["GMLAKE_STITCH"], what="GMLAKE_STITCH"))}))
    base = named("GMLAKE_POLICY", lambda: policies.split_spec(name)[0])
    if load_policy_code or ":" not in base:
        cls = named("GMLAKE_POLICY", policies.policy_class, base)
        for var, settings in given:
            opts.update(named(var, coerce_knobs, cls, settings, name))
    limit = named("GMLAKE_LIMIT", _env_size, "GMLAKE_LIMIT")
    if limit is not None:
        opts["limit"] = limit
    return opts


def policy_from_env(granularity: int | None = 1) -> tuple[policies.PolicyChoice, int]:
    """The policy (with its knobs, validated for `granularity`) and the per-device limit the GMLAKE_* variables
    choose: what `GMLAKE=1` and enable_from_env() install."""
    opts = options_from_env()
    spec = opts.pop("policy", "gmlake")
    limit = opts.pop("limit", 0)
    return policies.resolve(spec, opts, granularity), limit


def enable_from_env() -> None:
    """enable() with the GMLAKE_* settings (GMLAKE_POLICY, GMLAKE_LIMIT, knobs), checked before anything runs."""
    choice, limit = policy_from_env()    # an unknown or ill-typed knob fails here, not at the first allocation
    enable(choice, limit=limit)


def enable(policy: str | policies.Policy | policies.PolicyChoice = "gmlake", *, limit: int = 0, **knobs) -> None:
    """Install gmlake as PyTorch's CUDA allocator, one Allocator per device. Call before CUDA is initialised.

    policy: a policy spec (a built-in or installed name, module:Class, file.py:Class, with optional inline
      `[knob=value]`), a Policy object or a PolicyChoice; knobs override its fields (e.g. chunk_size=8 << 20).
    limit: a cap on each device's physical memory, in bytes (0: the device's own size).
    """
    # torch is optional: loaded on first use, so import gmlake stays light without it
    import torch

    if _enabled:
        if _enabled["policy"] == policy and _enabled["knobs"] == knobs and _enabled["limit"] == limit:
            return
        raise RuntimeError("gmlake: already enabled with other settings; the allocator cannot change once installed")
    if torch.cuda.is_initialized():
        raise RuntimeError(
            "gmlake: CUDA is already initialised, so PyTorch's allocator can no longer be replaced. Call "
            "gmlake.torch.enable() before any CUDA work, or start the program with `gmlake run`.")
    if knobs and not isinstance(policy, str):
        raise TypeError("gmlake: pass knobs with a policy name, or set them on the Policy object")
    if isinstance(policy, str):
        choice = policies.resolve(policy, knobs, granularity=None)
    elif isinstance(policy, (policies.Policy, policies.PolicyChoice)):
        choice = policies.choice_of(policy)
    else:
        raise TypeError(f"gmlake: policy must be a name or a gmlake.policies.Policy, got {type(policy).__name__}")
    chosen = choice.policy
    chosen.check_knobs()        # a knob its growth does not read fails here, not at the first allocation

    problem = torch_cuda_problem()      # a CPU-only build has no CUDA allocator to replace: say so, not its internals
    if problem:
        raise RuntimeError(f"gmlake: cannot install gmlake as PyTorch's CUDA allocator: {problem}")

    def factory(device: int) -> Allocator:
        # the CUDA driver needs libcuda: loaded only when a device is enabled
        from gmlake.drivers import cuda_driver

        made = Allocator(cuda_driver(device), chosen, limit=limit if limit else None)     # GMLAKE_LIMIT 0: none
        if _history_settings.get("enabled"):
            made.record_history(True, _history_settings["max_entries"])
        return made

    _torch_bridge.configure(factory)
    install_oom_error(torch)
    # registered first, so run last: Note [Frees after the interpreter]
    atexit.register(_torch_bridge.serve_no_more_frees)
    cache_info = install_allocator(torch)
    install_memory_api(torch)
    sharing.install(torch, _share_check(torch))     # Note [The sender's check before the feeder]
    _enabled.update(policy=policy, knobs=knobs, limit=limit, cache_info=cache_info, chosen=chosen, choice=choice)


def install_allocator(torch) -> bool:
    """Make the bridge PyTorch's CUDA allocator: through the shim whose cacheInfo the bridge answers (Note
    [cacheInfo through a subclass] in gmlake/torch/_torch_allocator.py), or, where it cannot be built, through
    torch.cuda.memory.CUDAPluggableAllocator, warning once that cudnn.benchmark = True then fails and CUDA tensors
    are not shared between processes. Whether cacheInfo is answered."""
    # links against torch's libraries: loaded only once torch is
    from gmlake.torch import _torch_allocator

    path = _torch_bridge.__file__
    installed, why = _torch_allocator.install(torch, path)
    if installed:
        return True
    pluggable = torch.cuda.memory.CUDAPluggableAllocator(path, "gmlake_alloc", "gmlake_free")
    lib = ctypes.CDLL(path)
    raw = pluggable.allocator()
    for setter, symbol in _HOOKS.items():
        hook = getattr(raw, setter, None)
        if hook is None:
            raise RuntimeError(f"gmlake: this PyTorch ({torch.__version__}) lacks CUDAPluggableAllocator.{setter}")
        hook(ctypes.cast(getattr(lib, symbol), ctypes.c_void_p).value)
    torch.cuda.memory.change_current_allocator(pluggable)
    warnings.warn(
        f"gmlake: torch.backends.cudnn.benchmark = True will fail in the first convolution (\"CUDAPluggableAllocator "
        f"does not yet support cacheInfo\") and CUDA tensors cannot be shared between processes: the shim that "
        f"answers both could not be built against torch {torch.__version__} ({why})", RuntimeWarning, stacklevel=3)
    return False


def _share_check(torch):
    """What raises, in the sender, where gmlake cannot share the block at a pointer: the bridge's share_ipc, or where
    the allocator shim's sharing could not be built (install_allocator warned), a refusal saying so."""
    from gmlake.torch import _torch_allocator

    why = _torch_allocator.no_sharing
    if why is None:
        return _torch_bridge.share_ipc

    def refuse(ptr: int):
        raise RuntimeError(f"gmlake: cannot share the CUDA tensor at {ptr:#x} with another process: the allocator "
                           f"shim's sharing could not be built against torch {torch.__version__} "
                           f"({why.splitlines()[0] if why else 'unknown'})")

    return refuse


def install_oom_error(torch) -> bool:
    """Make the bridge raise torch.OutOfMemoryError for an out-of-memory (Note [Torch's out-of-memory type] in
    gmlake/torch/_torch_oom.py): build or load the shim for the running torch and hand it to the bridge. Where it cannot
    be had, warn once, saying why: the error is then a RuntimeError whose text begins as PyTorch's. Whether the shim
    is in place."""
    # links against torch's libraries: loaded only once torch is
    from gmlake.torch import _torch_oom

    address, why = _torch_oom.thrower(torch)
    _torch_bridge.set_oom_thrower(address)
    if not address:
        warnings.warn(
            f"gmlake: an out-of-memory will be a RuntimeError whose text begins \"CUDA out of memory.\", not "
            f"torch.OutOfMemoryError: the shim that raises torch's type could not be built against torch "
            f"{torch.__version__} ({why})", RuntimeWarning, stacklevel=3)
    return bool(address)
