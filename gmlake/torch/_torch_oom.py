"""Build and load the shims compiled against the running torch: here the one that throws PyTorch's own
out-of-memory error for the torch bridge; gmlake/torch/_torch_allocator.py's, by the same rules, answers cacheInfo.

Note [Torch's out-of-memory type]: callers recognise an out-of-memory by its type (`except torch.OutOfMemoryError`,
accelerate's and Lightning's batch-size finders, the HF Trainer's auto_find_batch_size) or by PyTorch's words. Torch's
Python binding makes torch.OutOfMemoryError only of a thrown c10::OutOfMemoryError; any other C++ exception from an
allocation becomes a plain RuntimeError. So the bridge throws c10's class, and only code built against the running
torch's c10 headers can: the class's layout and constructors are c10's, not a stable ABI, and a stand-in class of the
same name would break with any torch release. setup.py cannot build it: pip builds gmlake in isolation, without torch,
and a build against one torch would break with the next. So gmlake/torch/_torch_oom_shim.cc (one function, throwing the error)
is compiled here, when gmlake.torch.enable() runs, against the installed torch's headers (c10/util/Exception.h needs
no CUDA, so gmlake's one build still serves CUDA 12 and 13) and linked to its libc10. The library is cached per torch
(its version and directory), C++ ABI flag, compiler, shim source and include directories, in GMLAKE_CACHE_DIR (default
$XDG_CACHE_HOME/gmlake, else ~/.cache/gmlake), written under a temporary name and renamed, so processes starting
together (one per rank) never load a half-written file; a later enable() only loads it. Its address is handed to the
bridge (_torch_bridge.set_oom_thrower), which calls it only when an allocation has failed: no hot path changes.
Where it cannot be built (no C++ compiler, torch's headers missing), the bridge throws std::runtime_error with the same
text, which begins with PyTorch's words "CUDA out of memory.", so tools that read the text still recognise it, and
enable() warns once saying why. The build time is in docs/benchmarks.md ("The shims' builds").
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SOURCE = Path(__file__).with_name("_torch_oom_shim.cc")
THROW_SYMBOL = "gmlake_throw_torch_oom"


@dataclass(frozen=True)
class Shim:
    """A library built against the running torch by the rules of Note [Torch's out-of-memory type]."""
    name: str                       # its cache file's prefix, and its symbol gmlake_<name>_version
    source: Path
    libraries: tuple[str, ...]      # torch's libraries it links (in torch's lib directory)
    header: str                     # a header it needs under torch's include directory
    library: str | None = None      # a library of torch's it needs, checked before building (None: only libc10)
    # The further include directories it needs (the CUDA runtime's headers), or a RuntimeError saying why none.
    includes: Callable[[Any], list[str]] | None = None
    defines: tuple[str, ...] = ()   # preprocessor names it is built with (-D)


OOM = Shim("torch_oom", SOURCE, ("c10",), "c10/util/Exception.h")

_loaded: dict[tuple[str, str], object] = {}     # (shim, torch's version) -> the CDLL, or the reason it failed


def cache_dir() -> Path:
    """Where built shims are kept: GMLAKE_CACHE_DIR, else $XDG_CACHE_HOME/gmlake, else ~/.cache/gmlake."""
    chosen = os.environ.get("GMLAKE_CACHE_DIR", "").strip()
    if chosen:
        return Path(chosen)
    base = os.environ.get("XDG_CACHE_HOME", "").strip() or str(Path.home() / ".cache")
    return Path(base) / "gmlake"


def compiler() -> str | None:
    """The C++ compiler: $CXX (as torch.utils.cpp_extension reads it), else c++, else g++."""
    named = os.environ.get("CXX", "").strip()
    if named:
        return shutil.which(named)
    return shutil.which("c++") or shutil.which("g++")


def _torch_build(torch) -> tuple[list[str], Path, int]:
    """The running torch's include directory, its library directory (libc10) and its C++ ABI flag."""
    root = Path(torch.__file__).resolve().parent
    return [str(root / "include")], root / "lib", int(bool(torch.compiled_with_cxx11_abi()))


def _check(torch, shim: Shim) -> list[str]:
    """The include directories `shim` builds with, torch's first; a RuntimeError where the running torch (or the
    machine) lacks what it needs."""
    includes, libdir, _ = _torch_build(torch)
    if not (Path(includes[0]) / shim.header).is_file():
        raise RuntimeError(f"torch {torch.__version__} ships no C++ headers ({includes[0]}/{shim.header})")
    if shim.library and not (libdir / shim.library).is_file():
        raise RuntimeError(f"torch {torch.__version__} is not a CUDA build (no {shim.library} in {libdir})")
    return includes + (shim.includes(torch) if shim.includes else [])


def library_path(torch, cxx: str, shim: Shim = OOM) -> Path:
    """The cached shim for this torch, compiler, source and include directories."""
    _, libdir, abi = _torch_build(torch)
    includes = _check(torch, shim)
    key = hashlib.sha256("\0".join([
        shim.source.read_text(), str(torch.__version__), str(libdir), str(abi), os.path.realpath(cxx),
        platform.machine(), *includes, *shim.libraries, *shim.defines,
    ]).encode()).hexdigest()[:16]
    return cache_dir() / f"{shim.name}-{str(torch.__version__).replace('+', '_')}-{key}.so"


def build(torch, cxx: str, target: Path, shim: Shim = OOM) -> None:
    """Compile the shim into `target` (atomically). Raises RuntimeError with the compiler's last words on failure."""
    _, libdir, abi = _torch_build(torch)
    includes = _check(torch, shim)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=target.name + ".", suffix=".tmp", dir=target.parent)
    os.close(fd)
    try:
        last = ""
        # torch's headers need C++17; newer releases may need C++20, which every compiler that builds them has.
        for std in ("-std=c++17", "-std=c++20"):
            proc = subprocess.run(
                [cxx, std, "-O2", "-shared", "-fPIC", f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
                 f'-DGMLAKE_TORCH_VERSION="{torch.__version__}"', *[f"-D{d}" for d in shim.defines],
                 *[f"-I{p}" for p in includes], str(shim.source),
                 "-o", tmp, f"-L{libdir}", *[f"-l{lib}" for lib in shim.libraries], f"-Wl,-rpath,{libdir}"],
                capture_output=True, text=True, check=False)
            if proc.returncode == 0:
                os.replace(tmp, target)
                return
            last = (proc.stderr or proc.stdout).strip()
        raise RuntimeError(f"{cxx} failed: {last[-600:]}")
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def load(torch, shim: Shim) -> tuple[ctypes.CDLL | None, str | None]:
    """The shim built for the running torch, building it if it is not cached: (the library, None), or (None, why)
    where it cannot be had. Asked again, it answers the same without building again."""
    version = str(torch.__version__)
    got = _loaded.get((shim.name, version))
    if got is not None:
        return (got, None) if isinstance(got, ctypes.CDLL) else (None, str(got))
    try:
        cxx = compiler()
        path = library_path(torch, cxx or "c++", shim)
        if not path.is_file():
            if cxx is None:
                raise RuntimeError("no C++ compiler (set CXX, or install g++)")
            try:
                build(torch, cxx, path, shim)
            except OSError:             # the cache is not writable: build into a private directory instead
                path = Path(tempfile.mkdtemp(prefix="gmlake-")) / path.name
                build(torch, cxx, path, shim)
        lib = ctypes.CDLL(str(path))
        built_for = getattr(lib, f"gmlake_{shim.name}_version")
        built_for.restype = ctypes.c_char_p
        if built_for().decode() != version:
            raise RuntimeError(f"{path} was built for torch {built_for().decode()}")
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        _loaded[(shim.name, version)] = exc
        return None, str(exc)
    _loaded[(shim.name, version)] = lib
    return lib, None


def thrower(torch) -> tuple[int, str | None]:
    """The address of the shim's gmlake_throw_torch_oom(const char*) for the running torch, building the shim if it
    is not cached; (0, why) where it cannot be had."""
    lib, why = load(torch, OOM)
    if lib is None:
        return 0, why
    return ctypes.cast(getattr(lib, THROW_SYMBOL), ctypes.c_void_p).value, None
