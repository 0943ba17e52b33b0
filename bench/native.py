"""bench's own Cython module, `_bench.pyx` (nogil timing loops over the core and the drivers), built in place against
the installed gmlake the first time it is used, so that gmlake's wheel carries no lab code."""
from __future__ import annotations

import importlib
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

HERE = Path(__file__).resolve().parent

_BUILD = """
import sys
from pathlib import Path
from Cython.Build import cythonize
from setuptools import Extension, setup
import gmlake.core
core = Path(gmlake.core.get_include())
setup(script_args=["build_ext", "--inplace", "-q"], ext_modules=cythonize(
    [Extension("bench._bench", ["bench/_bench.pyx"], language="c++", include_dirs=[str(core)],
               extra_compile_args=["-O3", "-std=c++17", "-Wno-unused-function"])],
    include_path=[str(core.parent.parent)], quiet=True,
    compiler_directives={"language_level": "3", "boundscheck": False, "wraparound": False, "cdivision": True}))
"""


# Cython's and the C++ compiler's diagnostics: FILE:LINE:COLUMN: message (warnings and notes are not the cause).
_DIAGNOSTIC = re.compile(r"^[^\s:]+:\d+:\d+: (?!warning|note)")


def _first_error(stderr: str) -> str:
    """The one line that says why the build failed: the first error at a place in the source, else the last line
    (a missing Cython or compiler)."""
    lines = stderr.strip().splitlines()
    return next((line for line in lines if _DIAGNOSTIC.match(line)), lines[-1] if lines else "no output")


def load() -> ModuleType:
    """bench._bench, built first where it is missing or older than its source or gmlake's core."""
    import gmlake.core

    built = sorted(HERE.glob("_bench.*.so"))
    sources = [HERE / "_bench.pyx", *Path(gmlake.core.get_include()).glob("*.pxd")]
    if not built or built[0].stat().st_mtime < max(p.stat().st_mtime for p in sources):
        proc = subprocess.run([sys.executable, "-c", _BUILD], cwd=HERE.parent, capture_output=True, text=True,
                              check=False)
        if proc.returncode:
            raise ImportError(f"could not build bench/_bench.pyx: {_first_error(proc.stderr)}")
        importlib.invalidate_caches()
    return importlib.import_module("bench._bench")
