"""Build and load the shim that installs gmlake as PyTorch's CUDA allocator with cacheInfo answered.

Note [cacheInfo through a subclass]: cuDNN's benchmark mode (torch.backends.cudnn.benchmark = True) sizes its search
by asking PyTorch's allocator for the largest block it could serve (CUDACachingAllocator::cacheInfo; Note [The
largest block served now] in gmlake/torch/_torch_bridge.pyx says what gmlake answers). PyTorch's pluggable
allocator (torch.cuda.memory.CUDAPluggableAllocator) takes no hook for it and throws "CUDAPluggableAllocator does
not yet support cacheInfo", so the first convolution under benchmark mode fails. cacheInfo is a virtual method of
the C++ class, so a subclass overriding it alone does: gmlake/torch/_torch_allocator_shim.cc derives from
torch::cuda::CUDAPluggableAllocator::CUDAPluggableAllocator, gives it the bridge's hooks as torch's set_*_fn
bindings do (function pointers by address), and installs it with changeCurrentAllocator, what
torch.cuda.memory.change_current_allocator calls; everything else is torch's own pluggable allocator, unchanged.
Its cacheInfo calls the bridge's gmlake_cache_info. The class's layout is torch's and changes between releases, so
the subclass is compiled when gmlake.torch.enable() runs, against the running torch's headers, by the rules of Note
[Torch's out-of-memory type] (gmlake/torch/_torch_oom.py: no setup.py build, cached per torch, compiler, source and
include directories, written atomically), and linked to its libtorch_cuda. Unlike the out-of-memory shim it needs
the CUDA runtime's headers (torch's c10/cuda headers include cuda_runtime_api.h and cuda.h), taken from the CUDA
that matches the running torch where pip installed it (the nvidia-cuda-runtime wheels: nvidia/cu13/include for CUDA
13, nvidia/cuda_runtime/include for CUDA 12), else a CUDA toolkit (CUDA_HOME or CUDA_PATH first, then nvcc's,
then /usr/local/cuda). Where it cannot be built (no compiler, no CUDA headers, a torch without CUDA), enable()
installs torch's plain pluggable allocator as before and warns once saying why: everything works but
cudnn.benchmark = True, which then fails as it did, and sharing CUDA tensors between processes. The same subclass
overrides shareIpcHandle and getIpcDevPtr (Note [Sharing a tensor through PyTorch's handle] in
gmlake/torch/_torch_bridge.pyx); where only those fail to compile against a torch, the shim is built without them
(GMLAKE_NO_IPC) and enable() warns once that tensors are not shared. The build time is in docs/benchmarks.md ("The
shims' builds").
"""
from __future__ import annotations

import ctypes
import importlib.util
import os
import shutil
from pathlib import Path

from gmlake.torch import _torch_oom

SOURCE = Path(__file__).with_name("_torch_allocator_shim.cc")
INSTALL_SYMBOL = "gmlake_install_torch_allocator"
# The bridge's entry points the shim hands to torch (gmlake/torch/_torch_bridge.pyx), each by its symbol.
HOOKS = ("gmlake_alloc", "gmlake_free", "gmlake_init", "gmlake_reset", "gmlake_memory_fraction", "gmlake_base_alloc",
         "gmlake_record_stream", "gmlake_begin_allocate_to_pool", "gmlake_end_allocate_to_pool",
         "gmlake_release_pool", "gmlake_cache_info", "gmlake_share_ipc")
# What the CUDA headers torch's c10/cuda headers include must hold.
CUDA_HEADERS = ("cuda_runtime_api.h", "cuda.h")


def _nvidia_dirs() -> list[Path]:
    """Where pip's nvidia-* wheels are installed (the `nvidia` namespace package's directories)."""
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        return []
    return [Path(p) for p in (spec.submodule_search_locations or [])] if spec else []


def cuda_include_candidates(torch) -> list[Path]:
    """The directories searched for the CUDA runtime's headers, in order (Note [cacheInfo through a subclass])."""
    found: list[Path] = []
    for var in ("CUDA_HOME", "CUDA_PATH"):
        named = os.environ.get(var, "").strip()
        if named:
            found.append(Path(named) / "include")
    major = str(getattr(torch.version, "cuda", None) or "").split(".")[0]
    for base in _nvidia_dirs():
        if major:
            found.append(base / f"cu{major}" / "include")
        found.append(base / "cuda_runtime" / "include")
    nvcc = shutil.which("nvcc")
    if nvcc:
        found.append(Path(os.path.realpath(nvcc)).parent.parent / "include")
    found.append(Path("/usr/local/cuda/include"))
    unique: list[Path] = []
    for path in found:
        if path not in unique:
            unique.append(path)
    return unique


def cuda_includes(torch) -> list[str]:
    """The CUDA include directory to build with: the first candidate that holds CUDA_HEADERS; a RuntimeError naming
    where it looked where none does."""
    candidates = cuda_include_candidates(torch)
    for path in candidates:
        if all((path / header).is_file() for header in CUDA_HEADERS):
            return [str(path)]
    raise RuntimeError(f"no CUDA headers ({' and '.join(CUDA_HEADERS)}) found in {', '.join(map(str, candidates))}; "
                       f"set CUDA_HOME to a CUDA toolkit")


ALLOCATOR = _torch_oom.Shim("torch_allocator", SOURCE, ("torch_cuda", "c10_cuda", "c10"),
                            "torch/csrc/cuda/CUDAPluggableAllocator.h", "libtorch_cuda.so", cuda_includes)
# The same without shareIpcHandle and getIpcDevPtr (GMLAKE_NO_IPC), for a torch whose classes they do not fit.
ALLOCATOR_NO_IPC = _torch_oom.Shim("torch_allocator_noipc", SOURCE, ("torch_cuda", "c10_cuda", "c10"),
                                   "torch/csrc/cuda/CUDAPluggableAllocator.h", "libtorch_cuda.so", cuda_includes,
                                   ("GMLAKE_NO_IPC",))


# Why CUDA tensors cannot be shared between processes (the shim with shareIpcHandle could not be had), once install()
# has run; None where they can.
no_sharing: str | None = None


def install(torch, bridge_path: str) -> tuple[bool, str | None]:
    """Install gmlake as torch's CUDA allocator through the shim, with cacheInfo answered by the bridge whose library
    is `bridge_path`, and shareIpcHandle / getIpcDevPtr too (Note [Sharing a tensor through PyTorch's handle] in
    gmlake/torch/_torch_bridge.pyx), or, where those do not compile against this torch, without them and one warning:
    (True, None); (False, why) where no shim can be had, nothing changed. A RuntimeError where torch refused the
    allocator (the shim was had)."""
    global no_sharing
    lib, why = _torch_oom.load(torch, ALLOCATOR)
    if lib is None:
        no_sharing = why
        lib, _ = _torch_oom.load(torch, ALLOCATOR_NO_IPC)
        if lib is None:
            return False, why
        import warnings

        warnings.warn(
            f"gmlake: CUDA tensors cannot be shared between processes (torch.multiprocessing raises \"does not yet "
            f"support shareIPcHandle\"): the allocator shim's sharing could not be built against torch "
            f"{torch.__version__} ({why})", RuntimeWarning, stacklevel=4)
    bridge = ctypes.CDLL(bridge_path)
    names = (ctypes.c_char_p * len(HOOKS))(*(name.encode() for name in HOOKS))
    addresses = (ctypes.c_size_t * len(HOOKS))(*(ctypes.cast(getattr(bridge, n), ctypes.c_void_p).value
                                                   for n in HOOKS))
    error = ctypes.create_string_buffer(1024)
    entry = getattr(lib, INSTALL_SYMBOL)
    entry.argtypes = [ctypes.POINTER(ctypes.c_char_p), ctypes.POINTER(ctypes.c_size_t), ctypes.c_size_t,
                      ctypes.c_char_p, ctypes.c_size_t]
    entry.restype = ctypes.c_int
    if entry(names, addresses, len(HOOKS), error, len(error)):
        raise RuntimeError(f"gmlake: PyTorch refused gmlake's allocator: {error.value.decode(errors='replace')}")
    return True, None
