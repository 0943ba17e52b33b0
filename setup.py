"""Build the Cython core of gmlake (compiled as C++17).

Nothing here needs CUDA: the `cuda` driver declares the few driver entry points it calls itself (_cuda_api.pxd) and
resolves them from libcuda at run time, so the same build runs on CUDA 12 and CUDA 13 drivers.
"""
from Cython.Build import cythonize
from setuptools import Extension, setup

common = dict(
    language="c++",
    extra_compile_args=["-O3", "-std=c++17", "-Wno-unused-function", "-Wno-deprecated-declarations"],
    include_dirs=["gmlake"],
)
extensions = [
    Extension("gmlake._driver", ["gmlake/_driver.pyx"], **common),
    Extension("gmlake._sim_driver", ["gmlake/_sim_driver.pyx"], **common),
    Extension("gmlake._host_driver", ["gmlake/_host_driver.pyx"], **common),
    # dlopen lives in libdl before glibc 2.34 (in libc after, where -ldl still links).
    Extension("gmlake._cuda_driver", ["gmlake/_cuda_driver.pyx"], libraries=["dl"], **common),
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

setup(
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
