"""Build the Cython core of gmlake (compiled as C++17).

Nothing here needs CUDA: the `cuda` driver declares the few driver entry points it calls itself (_cuda_api.pxd) and
resolves them from libcuda at run time, so the same build runs on CUDA 12 and CUDA 13 drivers.
"""
import os
from pathlib import Path

from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.dist import Distribution

install_data = Distribution().get_command_class("install_data")   # setuptools >= 80 has no public module for it

# GMLAKE_DEBUG=1 at build time: a debug build, whose allocators check every invariant after every operation.
debug_macros = [("GMLAKE_DEBUG", "1")] if os.environ.get("GMLAKE_DEBUG", "") not in ("", "0") else []
common = {
    "language": "c++",
    "extra_compile_args": ["-O3", "-std=c++17", "-Wno-unused-function", "-Wno-deprecated-declarations"],
    "include_dirs": ["gmlake/core", "gmlake/torch"],
}
extensions = [
    # The core: the allocator and its rooms (core/_allocator.pyx includes the .pxi rooms), and the Driver interface.
    Extension("gmlake.core._driver", ["gmlake/core/_driver.pyx"], **common),
    Extension("gmlake.core._allocator", ["gmlake/core/_allocator.pyx"], define_macros=debug_macros, **common),
    # The drivers the same core runs over: the simulator, real host memory, and CUDA's VMM.
    Extension("gmlake.drivers._sim_driver", ["gmlake/drivers/_sim_driver.pyx"], **common),
    Extension("gmlake.drivers._host_driver", ["gmlake/drivers/_host_driver.pyx"], **common),
    # dlopen lives in libdl before glibc 2.34 (in libc after, where -ldl still links).
    Extension("gmlake.drivers._cuda_driver", ["gmlake/drivers/_cuda_driver.pyx"], libraries=["dl"], **common),
    # Policy seams decided in Cython, built against the .pxd files as a research policy's own module would be.
    Extension("gmlake.policies._seams_example", ["gmlake/policies/_seams_example.pyx"], **common),
    # Replay's event loop over the simulator.
    Extension("gmlake.sim._replay", ["gmlake/sim/_replay.pyx"], **common),
    # torch loads these symbols by name: C linkage for `cdef public` (Cython emits C++ linkage otherwise).
    Extension(
        "gmlake.torch._torch_bridge",
        ["gmlake/torch/_torch_bridge.pyx"],
        define_macros=[("CYTHON_EXTERN_C", 'extern "C"')],
        **common,
    ),
]

AUTOLOAD_PTH = "gmlake/gmlake_autoload.pth"


class install_autoload_pth(install_data):
    """Put gmlake_autoload.pth (GMLAKE=1 turns gmlake on, see gmlake/torch/_autoload.py) into site-packages.

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
