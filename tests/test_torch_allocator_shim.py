"""The shim that installs gmlake as PyTorch's allocator with cacheInfo answered (Note [cacheInfo through a subclass] in
gmlake/torch/_torch_allocator.py), as far as a machine without a GPU can see it: where the CUDA headers are looked
for, what the cache key follows, that the shim's C++ compiles against the installed torch's headers, and that
without it enable() installs torch's plain pluggable allocator and warns once why. Its run on a GPU:
tests/test_torch_gpu.py (cudnn.benchmark under gmlake)."""
from __future__ import annotations

import ctypes
import shutil
import subprocess
import types
import warnings
from pathlib import Path
from typing import ClassVar

import pytest

from gmlake.torch import _torch_allocator, _torch_bridge, _torch_oom


def _torch():
    try:
        import torch
    except ImportError:
        return None
    return torch


def _header(root: Path, *names: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for name in names:
        (root / name).write_text("")
    return root


def test_cuda_headers_are_looked_for_in_order(tmp_path, monkeypatch):
    """CUDA_HOME and CUDA_PATH first (named by the user), then the wheels of the running torch's CUDA (CUDA 13's
    nvidia/cu13, CUDA 12's nvidia/cuda_runtime), then nvcc's toolkit (through its links), then /usr/local/cuda."""
    wheels = tmp_path / "site" / "nvidia"
    toolkit = tmp_path / "cuda-13.0"
    (toolkit / "bin").mkdir(parents=True)
    (toolkit / "bin" / "nvcc").write_text("")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "nvcc").symlink_to(toolkit / "bin" / "nvcc")
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("CUDA_PATH", str(tmp_path / "path"))
    monkeypatch.setattr(_torch_allocator, "_nvidia_dirs", lambda: [wheels])
    monkeypatch.setattr(shutil, "which", lambda name: str(tmp_path / "bin" / "nvcc") if name == "nvcc" else None)
    fake = types.SimpleNamespace(version=types.SimpleNamespace(cuda="13.0"))
    assert _torch_allocator.cuda_include_candidates(fake) == [
        tmp_path / "home" / "include", tmp_path / "path" / "include", wheels / "cu13" / "include",
        wheels / "cuda_runtime" / "include", toolkit / "include", Path("/usr/local/cuda/include")]
    monkeypatch.delenv("CUDA_HOME")
    monkeypatch.delenv("CUDA_PATH")
    fake.version.cuda = "12.8"
    assert _torch_allocator.cuda_include_candidates(fake)[:2] == [wheels / "cu12" / "include",
                                                                  wheels / "cuda_runtime" / "include"]


def test_the_first_directory_holding_both_headers_is_taken(tmp_path, monkeypatch):
    only_runtime = _header(tmp_path / "a", "cuda_runtime_api.h")
    both = _header(tmp_path / "b", "cuda_runtime_api.h", "cuda.h")
    later = _header(tmp_path / "c", "cuda_runtime_api.h", "cuda.h")
    monkeypatch.setattr(_torch_allocator, "cuda_include_candidates", lambda torch: [only_runtime, both, later])
    assert _torch_allocator.cuda_includes(None) == [str(both)]
    monkeypatch.setattr(_torch_allocator, "cuda_include_candidates", lambda torch: [only_runtime, tmp_path / "d"])
    with pytest.raises(RuntimeError) as caught:
        _torch_allocator.cuda_includes(None)
    assert str(caught.value) == (f"no CUDA headers (cuda_runtime_api.h and cuda.h) found in {only_runtime}, "
                                 f"{tmp_path / 'd'}; set CUDA_HOME to a CUDA toolkit")


def test_the_cache_key_follows_the_include_directories(tmp_path):
    """Two CUDAs give two libraries; the same one, the same library."""
    torch = _torch()
    if torch is None:
        pytest.skip("needs torch")
    shims = [_torch_oom.Shim("probe", _torch_allocator.SOURCE, ("c10",), "c10/util/Exception.h",
                             includes=lambda t, d=d: [str(tmp_path / d)]) for d in ("cuda-12", "cuda-13", "cuda-12")]
    paths = [_torch_oom.library_path(torch, "c++", shim) for shim in shims]
    assert paths[0] == paths[2] != paths[1]
    assert paths[0].name.startswith(f"probe-{str(torch.__version__).replace('+', '_')}-")


def test_a_torch_without_cuda_is_refused_with_the_reason(tmp_path, monkeypatch):
    torch = _torch()
    if torch is None:
        pytest.skip("needs torch")
    libdir = Path(torch.__file__).resolve().parent / "lib"
    if (libdir / "libtorch_cuda.so").is_file():
        pytest.skip("this torch is a CUDA build")
    monkeypatch.setenv("GMLAKE_CACHE_DIR", str(tmp_path))
    assert _torch_allocator.install(torch, _torch_bridge.__file__) == (
        False, f"torch {torch.__version__} is not a CUDA build (no libtorch_cuda.so in {libdir})")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("defines", [(), ("GMLAKE_NO_IPC",)], ids=["with-sharing", "without-sharing"])
def test_the_shim_compiles_against_the_installed_torchs_headers(tmp_path, defines):
    """The shim's C++ against the headers of the torch installed here (its subclass overrides what torch declares,
    its hooks have the types torch's setters take), with and without its sharing overrides (the fallback build);
    linking needs libtorch_cuda, which a GPU machine has."""
    torch = _torch()
    cxx = _torch_oom.compiler()
    if torch is None or cxx is None:
        pytest.skip("needs torch and a C++ compiler")
    includes, _, abi = _torch_oom._torch_build(torch)
    if not (Path(includes[0]) / _torch_allocator.ALLOCATOR.header).is_file():
        pytest.skip("this torch ships no CUDAPluggableAllocator.h")
    try:
        cuda = _torch_allocator.cuda_includes(torch)
    except RuntimeError as exc:
        pytest.skip(str(exc))
    # A CPU build of torch lacks the header its CUDA build generates (c10/cuda/impl/cuda_cmake_macros.h).
    generated = (Path(includes[0]) / "c10" / "cuda" / "impl" / "cuda_cmake_macros.h").is_file()
    proc = subprocess.run(
        [cxx, "-std=c++17", "-fPIC", "-c", f"-D_GLIBCXX_USE_CXX11_ABI={abi}", '-DGMLAKE_TORCH_VERSION="probe"',
         *([] if generated else ["-DC10_CUDA_NO_CMAKE_CONFIGURE_FILE"]), *[f"-D{d}" for d in defines],
         f"-I{includes[0]}", f"-I{cuda[0]}",
         str(_torch_allocator.SOURCE), "-o", str(tmp_path / "shim.o")], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    symbols = subprocess.run(["nm", "-g", "--defined-only", str(tmp_path / "shim.o")], capture_output=True, text=True,
                             check=False).stdout if shutil.which("nm") else ""
    if symbols:
        assert " T gmlake_install_torch_allocator" in symbols and " T gmlake_torch_allocator_version" in symbols


class _FakePluggable:
    """torch.cuda.memory.CUDAPluggableAllocator as enable() uses it: its raw allocator's setters, recorded."""
    made: ClassVar[list] = []

    def __init__(self, path, alloc, free):
        self.args, self.set = (path, alloc, free), {}
        _FakePluggable.made.append(self)

    def allocator(self):
        return types.SimpleNamespace(**{name: (lambda address, name=name: self.set.__setitem__(name, address))
                                        for name in _FAKE_SETTERS})


_FAKE_SETTERS = ("set_init_fn", "set_reset_fn", "set_memory_fraction_fn", "set_base_alloc_fn", "set_record_stream_fn",
                 "set_begin_allocate_to_pool", "set_end_allocate_to_pool_fn", "set_release_pool")


def test_without_the_shim_torchs_pluggable_allocator_is_installed_with_one_warning(tmp_path, monkeypatch):
    """A torch without the shim's headers: today's pluggable allocator, every hook set, and one warning naming
    cudnn.benchmark and why."""
    root = tmp_path / "torch"
    (root / "include").mkdir(parents=True)
    (root / "lib").mkdir()
    changed = []
    fake = types.SimpleNamespace(
        __version__="0.0.0+fake", __file__=str(root / "__init__.py"), compiled_with_cxx11_abi=lambda: True,
        version=types.SimpleNamespace(cuda="13.0"),
        cuda=types.SimpleNamespace(memory=types.SimpleNamespace(CUDAPluggableAllocator=_FakePluggable,
                                                                change_current_allocator=changed.append)))
    monkeypatch.setenv("GMLAKE_CACHE_DIR", str(tmp_path / "cache"))
    from gmlake.torch import install

    _FakePluggable.made.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert install.install_allocator(fake) is False
    expected = ("gmlake: torch.backends.cudnn.benchmark = True will fail in the first convolution "
                "(\"CUDAPluggableAllocator does not yet support cacheInfo\") and CUDA tensors cannot be shared "
                "between processes: the shim that answers both could not be built against torch 0.0.0+fake (torch "
                f"0.0.0+fake ships no C++ headers ({root / 'include'}/torch/csrc/cuda/CUDAPluggableAllocator.h))")
    assert [str(w.message) for w in caught] == [expected]
    (pluggable,) = _FakePluggable.made
    assert pluggable.args == (_torch_bridge.__file__, "gmlake_alloc", "gmlake_free")
    assert changed == [pluggable]
    bridge = ctypes.CDLL(_torch_bridge.__file__)
    for setter, symbol in install._HOOKS.items():
        assert pluggable.set[setter] == ctypes.cast(getattr(bridge, symbol), ctypes.c_void_p).value, setter


def test_the_shim_and_the_fallback_name_the_same_hooks():
    """The shim is handed every entry point the fallback sets, plus cacheInfo's, and its C++ knows each by name."""
    from gmlake.torch import install

    assert set(_torch_allocator.HOOKS) == {"gmlake_alloc", "gmlake_free", "gmlake_cache_info", "gmlake_share_ipc",
                                           *install._HOOKS.values()}
    source = _torch_allocator.SOURCE.read_text()
    for name in _torch_allocator.HOOKS:
        assert source.count(f'"{name}"') == 2, name      # its slot, and the check that it was given


def test_a_shim_whose_sharing_does_not_build_is_installed_without_it_and_one_warning(monkeypatch):
    """Where the overrides of shareIpcHandle and getIpcDevPtr do not compile against a torch, the shim is built
    without them (GMLAKE_NO_IPC): cacheInfo is still answered, and one warning names what is lost and why."""
    tried, installed = [], []

    def load(torch, shim):
        tried.append(shim)
        if shim is _torch_allocator.ALLOCATOR:
            return None, "g++ failed: no member named 'shareIpcHandle'"
        def install(names, addresses, count, error, size):
            installed.append([names[i].decode() for i in range(count)])
            return 0

        return types.SimpleNamespace(gmlake_install_torch_allocator=install), None

    monkeypatch.setattr(_torch_oom, "load", load)
    fake = types.SimpleNamespace(__version__="9.9.9+fake")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert _torch_allocator.install(fake, _torch_bridge.__file__) == (True, None)
    assert tried == [_torch_allocator.ALLOCATOR, _torch_allocator.ALLOCATOR_NO_IPC]
    assert _torch_allocator.ALLOCATOR_NO_IPC.defines == ("GMLAKE_NO_IPC",)
    assert installed == [list(_torch_allocator.HOOKS)]
    assert [str(w.message) for w in caught] == [(
        "gmlake: CUDA tensors cannot be shared between processes (torch.multiprocessing raises \"does not yet "
        "support shareIPcHandle\"): the allocator shim's sharing could not be built against torch 9.9.9+fake "
        "(g++ failed: no member named 'shareIpcHandle')")]
