"""Build the Cython core of gmlake (compiled as C++17).

The `cuda` driver cimports cuda-python's `cuda.bindings.cydriver`; its .pxd files must be compiled against a cuda.h
of the same CUDA major.minor. We look for cuda.h in, in order: $GMLAKE_CUDA_INCLUDE, $CUDA_HOME/include, the
`nvidia-cuda-runtime` wheel (nvidia/cu13/include), /usr/local/cuda/include, and prefer one whose version matches the
installed cuda-bindings.
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import sys
from pathlib import Path

from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.dist import Distribution

install_data = Distribution().get_command_class("install_data")   # setuptools >= 80 has no public module for it


def _cuda_h_version(include_dir: Path) -> tuple[int, int] | None:
    header = include_dir / "cuda.h"
    if not header.is_file():
        return None
    match = re.search(r"#define\s+CUDA_VERSION\s+(\d+)", header.read_text(errors="replace"))
    if not match:
        return None
    value = int(match.group(1))
    return value // 1000, (value % 1000) // 10


def _candidate_include_dirs() -> list[Path]:
    found: list[Path] = []
    for env in ("GMLAKE_CUDA_INCLUDE",):
        if os.environ.get(env):
            found.append(Path(os.environ[env]))
    if os.environ.get("CUDA_HOME"):
        found.append(Path(os.environ["CUDA_HOME"]) / "include")
    spec = importlib.util.find_spec("nvidia")
    if spec is not None and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            for sub in sorted(Path(location).glob("cu*/include")):
                found.append(sub)
    found.append(Path("/usr/local/cuda/include"))
    # cydriver.pxd includes cudaProfiler.h too; a directory without it cannot compile the cuda driver.
    return [path for path in found if (path / "cuda.h").is_file() and (path / "cudaProfiler.h").is_file()]


def _bindings_version() -> tuple[int, int] | None:
    try:
        parts = importlib.metadata.version("cuda-bindings").split(".")
        return int(parts[0]), int(parts[1])
    except Exception:
        return None


def find_cuda_include() -> Path:
    candidates = _candidate_include_dirs()
    if not candidates:
        sys.exit("gmlake: no cuda.h found; install nvidia-cuda-runtime or set GMLAKE_CUDA_INCLUDE")
    explicit = os.environ.get("GMLAKE_CUDA_INCLUDE")
    if explicit:
        return Path(explicit)
    wanted = _bindings_version()
    for path in candidates:
        if _cuda_h_version(path) == wanted:
            return path
    print(
        f"gmlake: warning: no cuda.h matches cuda-bindings {wanted}; using {candidates[0]} "
        f"(CUDA {_cuda_h_version(candidates[0])})",
        file=sys.stderr,
    )
    return candidates[0]


cuda_include = str(find_cuda_include())
common = dict(
    language="c++",
    extra_compile_args=["-O3", "-std=c++17", "-Wno-unused-function", "-Wno-deprecated-declarations"],
    include_dirs=["gmlake"],
)
extensions = [
    Extension("gmlake._driver", ["gmlake/_driver.pyx"], **common),
    Extension("gmlake._sim_driver", ["gmlake/_sim_driver.pyx"], **common),
    Extension("gmlake._host_driver", ["gmlake/_host_driver.pyx"], **common),
    Extension(
        "gmlake._cuda_driver",
        ["gmlake/_cuda_driver.pyx"],
        **{**common, "include_dirs": ["gmlake", cuda_include]},
    ),
    Extension("gmlake._allocator", ["gmlake/_allocator.pyx"], **common),
    Extension("gmlake._bench", ["gmlake/_bench.pyx"], **common),
    Extension("gmlake._replay", ["gmlake/_replay.pyx"], **common),
    # torch loads these symbols by name: C linkage for `cdef public` (Cython emits C++ linkage otherwise).
    Extension(
        "gmlake._torch_bridge",
        ["gmlake/_torch_bridge.pyx"],
        define_macros=[("CYTHON_EXTERN_C", 'extern "C"')],
        **common,
    ),
]

AUTOLOAD_PTH = "gmlake/gmlake_autoload.pth"


class install_autoload_pth(install_data):
    """Put gmlake_autoload.pth (GMLAKE=1 turns gmlake on, see gmlake/_autoload.py) into site-packages.

    A .pth works only at the top of site-packages. Wheels, editable ones included, install their data directory
    `NAME.data/data` under sys.prefix but `NAME.data/purelib` into site-packages, so the file goes to the sibling.
    """

    def run(self) -> None:
        data_dir = Path(self.install_dir)
        if data_dir.parent.name.endswith(".data"):
            target = data_dir.parent / "purelib"
        else:   # a direct (non-wheel) install
            import sysconfig

            target = Path(sysconfig.get_path("purelib", vars={"base": self.install_dir,
                                                              "platbase": self.install_dir}))
        self.mkpath(str(target))
        out, _ = self.copy_file(AUTOLOAD_PTH, str(target))
        self.outfiles.append(out)


class DistributionInstallingData(Distribution):
    """setuptools' editable_wheel (84 at least) runs install_data only if the distribution answers has_data(), a
    method distutils names has_data_files(); without this, `pip install -e .` would leave the .pth out."""

    def has_data(self) -> bool:
        return self.has_data_files()


setup(
    distclass=DistributionInstallingData,
    cmdclass={"install_data": install_autoload_pth},
    data_files=[("", [AUTOLOAD_PTH])],   # makes the install_data step run; install_autoload_pth places the file
    ext_modules=cythonize(
        extensions,
        compiler_directives={
            "language_level": "3",
            "boundscheck": False,
            "wraparound": False,
            "cdivision": True,
            "initializedcheck": False,
        },
    ),
)
