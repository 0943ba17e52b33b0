"""The public API can be found: `gmlake.__all__` holds the policies, extension classes have real signatures (at run
time and in .pyi stubs that match them), and bundled traces load by name from Python."""
from __future__ import annotations

import ast
import inspect
import pydoc
from pathlib import Path

import pytest

import gmlake
from gmlake.sim import trace

PACKAGE = Path(gmlake.__file__).parent


def test_all_holds_the_policies_and_no_benchmark_code():
    for name in ("Policy", "GMLakePolicy", "PaperPolicy", "CachingPolicy", "ExpandablePolicy", "Allocator",
                 "SimDriver", "HostDriver", "Driver", "cuda_driver", "OutOfMemoryError", "PolicyError"):
        assert name in gmlake.__all__, name
    assert "bench_cache_hits" not in gmlake.__all__
    for name in gmlake.__all__:
        assert hasattr(gmlake, name), name
    assert gmlake.PaperPolicy().name == "gmlake-paper" and gmlake.GMLakePolicy().name == "gmlake"


@pytest.mark.parametrize("cls, params", [
    (gmlake.SimDriver, ["capacity", "granularity", "exportable"]),
    (gmlake.HostDriver, ["capacity", "granularity", "unmap_pause"]),
    (gmlake.Allocator, ["driver", "policy", "limit"]),
])
def test_extension_classes_have_signatures(cls, params):
    sig = inspect.signature(cls)
    assert list(sig.parameters) == params
    text = pydoc.render_doc(cls)
    assert f"{cls.__name__}({str(sig)[1:]}" in text or f"{cls.__name__}{sig}" in text, text[:400]
    assert "*args, **kwargs" not in text.split("Methods")[0]
    assert inspect.signature(gmlake.SimDriver).parameters["granularity"].default == 2 << 20
    assert inspect.signature(gmlake.Allocator).parameters["limit"].kind is inspect.Parameter.KEYWORD_ONLY


def public_members(cls) -> set[str]:
    return {name for klass in cls.__mro__ if klass.__module__.startswith("gmlake")
            for name in vars(klass) if not name.startswith("_")}


def stub_members(stub: Path, name: str) -> set[str]:
    tree = ast.parse(stub.read_text())
    classes = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}
    out, todo = set(), [name]
    while todo:
        node = classes.get(todo.pop())
        if node is None:
            continue
        for item in node.body:
            if isinstance(item, ast.FunctionDef) and not item.name.startswith("_"):
                out.add(item.name)
            elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                out.add(item.target.id)
        todo += [base.id for base in node.bases if isinstance(base, ast.Name)]
    return out


def stubs_by_class() -> dict[str, Path]:
    """Every class each stub declares, by the .pyi that declares it (a base's stub may be another file)."""
    out = {}
    for stub in PACKAGE.rglob("*.pyi"):
        for node in ast.parse(stub.read_text()).body:
            if isinstance(node, ast.ClassDef):
                out[node.name] = stub
    return out


@pytest.mark.parametrize("module, name", [("core._allocator", "Allocator"), ("drivers._sim_driver", "SimDriver"),
                                          ("drivers._host_driver", "HostDriver"), ("core._driver", "ModelDriver")])
def test_stubs_declare_what_the_extension_classes_have(module, name):
    import importlib

    cls = getattr(importlib.import_module(f"gmlake.{module}"), name)
    stubs = stubs_by_class()
    declared = set()
    for klass in cls.__mro__:
        if klass.__name__ in stubs:
            declared |= stub_members(stubs[klass.__name__], klass.__name__)
    assert declared == public_members(cls), (declared ^ public_members(cls))


def test_the_package_says_it_is_typed():
    assert (PACKAGE / "py.typed").is_file()
    text = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()   # the checkout's or the sdist's
    assert '"*.pyi"' in text and '"py.typed"' in text


def test_bundled_traces_load_by_name():
    t = trace.load("opt350m-full-ckpt-native")
    assert t.name == "opt350m-full-ckpt-native" and len(t) == t.meta["events"]
    assert len(trace.load("opt350m-full-ckpt-native.gmtrace")) == len(t)
    assert trace.bundled_traces() and all(p.suffix == ".gmtrace" for p in trace.bundled_traces())
    with pytest.raises(trace.TraceError):
        trace.load("no-such-trace")
