"""The sdist is what a package index serves and what wheels are built from: it must hold every source setup.py
cythonizes (and the files those include), the package's data, and the tests, so that a wheel built from it alone
installs and passes the tests (.ci/run builds that wheel in a fresh venv and runs the suite from it)."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCE_SUFFIXES = (".py", ".pyx", ".pxi", ".pxd", ".h", ".pyi", ".json", ".gmtrace", ".pth")
GENERATED = ("_torch_bridge.h", "_torch_bridge_api.h")   # Cython writes these while building the torch bridge

pytestmark = pytest.mark.skipif(not (ROOT / "setup.py").is_file() or not (ROOT / "gmlake").is_dir()
                                or shutil.which("git") is None or not (ROOT / ".git").exists(),
                                reason="needs the source checkout (git), not an installed wheel")


def _tracked(prefix: str) -> list[str]:
    out = subprocess.run(["git", "ls-files", prefix], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return out.split()


@pytest.fixture(scope="module")
def sdist(tmp_path_factory) -> tuple[str, set[str]]:
    """The sdist `python -m build --sdist` makes of this checkout's files: (its top folder, the paths inside it).

    Built from a copy of the files git knows (and the C++ that cythonize generated, with its times, so that
    setup.py need not cythonize again): in the checkout itself setuptools would read the file list an earlier
    build left in gmlake.egg-info. Built with this environment's setuptools and Cython (nothing to download)."""
    copy = tmp_path_factory.mktemp("checkout")
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.split()
    for name in [*listed, *(p.relative_to(ROOT).as_posix() for p in (ROOT / "gmlake").rglob("*.cpp"))]:
        if (ROOT / name).is_file():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, copy / name)
    out = tmp_path_factory.mktemp("dist")
    proc = subprocess.run([sys.executable, "-m", "build", "--sdist", "--no-isolation", "--skip-dependency-check",
                           "--outdir", str(out)], cwd=copy, capture_output=True, text=True, check=False, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (archive,) = out.glob("gmlake-*.tar.gz")
    with tarfile.open(archive) as tar:
        names = tar.getnames()
    top = names[0].split("/")[0]
    return top, {name.removeprefix(top + "/") for name in names if "/" in name}


def test_the_sdist_holds_every_source_and_data_file_of_the_package(sdist):
    _, names = sdist
    wanted = [p for p in _tracked("gmlake") if p.endswith(SOURCE_SUFFIXES) or p.endswith("py.typed")]
    assert [p for p in wanted if p.endswith(".pyx")], "no .pyx found: the checkout is not what this test expects"
    assert [p for p in wanted if p not in names] == []


def test_every_extension_source_and_include_is_in_the_sdist(sdist):
    """setup.py cythonizes the .pyx named in its extensions; they include .pxi files and cimport .pxd files."""
    _, names = sdist
    setup_py = (ROOT / "setup.py").read_text()
    sources = re.findall(r'"(gmlake/[\w/]+\.pyx)"', setup_py)
    assert sources
    missing = [s for s in sources if s not in names]
    for source in [p for p in _tracked("gmlake") if p.endswith((".pyx", ".pxi", ".pxd"))]:
        folder = Path(source).parent
        for include in re.findall(r'^\s*include\s+"([^"]+)"', (ROOT / source).read_text(), flags=re.MULTILINE):
            if (folder / include).as_posix() not in names:
                missing.append(f"{(folder / include).as_posix()} (included by {source})")
    assert missing == []


def test_the_sdist_leaves_out_what_the_build_generates(sdist):
    _, names = sdist
    generated = [n for n in names if n.startswith("gmlake/") and (n.endswith((".cpp", ".so")) or
                                                                   Path(n).name in GENERATED)]
    assert generated == []


def test_the_sdist_holds_the_tests_and_what_they_read(sdist):
    _, names = sdist
    for prefix in ("tests", "bench", "docs", "examples"):
        tracked = _tracked(prefix)
        assert tracked and [p for p in tracked if p not in names] == [], prefix
    assert {"README.md", "LICENSE", "setup.py", "pyproject.toml", "MANIFEST.in", ".ci/run"} <= names


def test_the_license_is_an_spdx_expression_that_the_required_setuptools_reads():
    """`project.license` as a TOML table is deprecated (the build warns); the SPDX string form needs setuptools 77,
    so the build requirement must not admit an older one."""
    tomllib = pytest.importorskip("tomllib")
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert isinstance(meta["project"]["license"], str), meta["project"]["license"]
    assert not any(c.startswith("License ::") for c in meta["project"].get("classifiers", []))
    (floor,) = [int(re.search(r">=\s*(\d+)", r).group(1)) for r in meta["build-system"]["requires"]
                if r.startswith("setuptools")]
    assert floor >= 77
