"""Policy specs, the one way every command, `gmlake run` and GMLAKE_POLICY name a policy: a built-in or installed
name, `module:Class` or `path/to/file.py:Class`, each optionally with its own knobs in brackets (see gmlake.policies).
Resolving one imports or runs the code it names, types its knobs by their declarations, and checks the class."""
from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import importlib.util
import os
import re
import sys
import traceback
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path

from gmlake.policies.base import Policy
from gmlake.policies.caching import CachingPolicy
from gmlake.policies.expandable import ExpandablePolicy
from gmlake.policies.gmlake import GMLakePolicy, PaperPolicy
from gmlake.policies.settings import coerce_knobs, parse_setting, split_settings

_BUILTIN: dict[str, type[Policy]] = {
    cls.name: cls for cls in (GMLakePolicy, PaperPolicy, CachingPolicy, ExpandablePolicy)
}
ENTRY_POINT_GROUP = "gmlake.policies"
SPEC_HELP = ("a built-in name, an installed plugin's name, module:Class, or path/to/file.py:Class (which runs that "
             "file's code), optionally with knobs: 'NAME[knob=value,knob=value]'")

# A spec's inline knobs: everything inside a final [...] (the base may itself hold brackets, as a path might).
_INLINE = re.compile(r"(?P<base>.*?)\[(?P<knobs>[^\[\]]*)\]\s*", re.DOTALL)
_FILE_MODULE_PREFIX = "gmlake_user_policy_"
# Files already loaded, by resolved path: loading a file twice would make two unequal classes of one name.
_loaded_files: dict[Path, object] = {}


def names() -> list[str]:
    """Names of the built-in policies."""
    return list(_BUILTIN)


def installed() -> dict[str, importlib.metadata.EntryPoint]:
    """Policies that installed packages declare in the `gmlake.policies` entry point group, by name (built-in
    names excluded: a plugin cannot replace a built-in policy)."""
    return {ep.name: ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP) if ep.name not in _BUILTIN}


@dataclass(frozen=True)
class PolicyChoice:
    """A policy as the user chose it: the spec they wrote and the Policy object it resolved to, with its knobs."""

    spec: str
    policy: Policy

    @property
    def label(self) -> str:
        """The policy's short label: its name and non-default knobs."""
        return self.policy.label()

    def record(self) -> dict[str, object]:
        """What a result records about its policy: label, spec as written, class (module.Class) and every knob."""
        cls = type(self.policy)
        module = sys.modules.get(cls.__module__)
        if cls.__module__.startswith(_FILE_MODULE_PREFIX) and getattr(module, "__file__", None):
            where = f"{module.__file__}:{cls.__qualname__}"     # a file's module name is ours, its path is not
        else:
            where = f"{cls.__module__}.{cls.__qualname__}"
        return {"policy": self.label, "policy_spec": self.spec, "policy_class": where,
                "knobs": self.policy.knob_values()}


def split_spec(spec: str) -> tuple[str, dict[str, str]]:
    """A spec's base (name, module:Class or file.py:Class) and its inline knobs as {knob: text}."""
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"a policy spec is a name, module:Class or path/to/file.py:Class, got {spec!r}")
    match = _INLINE.fullmatch(spec.strip())
    if not match:
        if "[" in spec or "]" in spec:
            raise ValueError(f"policy {spec!r}: inline knobs are written NAME[knob=value,knob=value]")
        return spec.strip(), {}
    base = match.group("base").strip()
    if not base:
        raise ValueError(f"policy {spec!r}: knobs in brackets follow a policy name, e.g. gmlake[stitch=false]")
    items = [item for item in match.group("knobs").split(",") if item.strip()]
    try:
        return base, split_settings(items)
    except ValueError as exc:
        raise ValueError(f"policy {spec!r}: {exc}") from None


def _failure(exc: BaseException) -> str:
    """A user module's exception as one line, with the file and line it was raised at (a SyntaxError's own place;
    else the last frame of the traceback outside gmlake and importlib)."""
    where = None
    if isinstance(exc, SyntaxError) and exc.filename:
        where = f"{exc.filename}:{exc.lineno}"
        text = exc.msg
    else:
        text = str(exc)
        frames = [f for f in traceback.extract_tb(exc.__traceback__)
                  if not f.filename.startswith("<frozen") and Path(f.filename).parent != Path(__file__).parent]
        if frames:
            where = f"{frames[-1].filename}:{frames[-1].lineno}"
    return f"{type(exc).__name__} at {where}: {text}" if where else f"{type(exc).__name__}: {text}"


def _load_file(path_text: str, spec: str) -> object:
    """The module a policy file defines, executed once per file, as Python runs a script: with the file's folder
    first on sys.path, so that it imports the modules beside it (a Cython seam module built there, a helper)."""
    path = Path(path_text).expanduser()
    if not path.is_file():
        raise ValueError(f"policy {spec!r}: no such file {path_text!r}")
    path = path.resolve()
    if path in _loaded_files:
        return _loaded_files[path]
    # A module name of its own per file, registered before it runs: dataclasses and typing look the module up.
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:10]
    stem = re.sub(r"\W", "_", path.stem)
    name = f"{_FILE_MODULE_PREFIX}{stem}_{digest}"
    module_spec = importlib.util.spec_from_file_location(name, path)
    if module_spec is None or module_spec.loader is None:
        raise ValueError(f"policy {spec!r}: cannot load {path_text!r} as Python")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    folder = str(path.parent)
    if folder not in sys.path:      # kept: the policy's methods may import lazily, as a script's functions may
        sys.path.insert(0, folder)
    try:
        module_spec.loader.exec_module(module)
    except Exception as exc:  # noqa: BLE001 - the user's file may raise anything
        del sys.modules[name]
        raise ValueError(f"policy {spec!r}: running {path_text} failed: {_failure(exc)}") from None
    _loaded_files[path] = module
    return module


def _import_module(module_name: str, spec: str) -> object:
    """The named module, looked for on sys.path and then in the current folder (as `python -m` would)."""
    added = os.getcwd() not in sys.path and "" not in sys.path
    if added:
        sys.path.append(os.getcwd())
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name == module_name or module_name.startswith(f"{exc.name}."):   # the module itself, not an import in it
            raise ValueError(f"policy {spec!r}: no module named {exc.name!r} (not on sys.path nor in the current "
                             f"folder)") from None
        raise ValueError(f"policy {spec!r}: importing {module_name} failed: ModuleNotFoundError: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - the user's policy code may raise anything
        raise ValueError(f"policy {spec!r}: importing {module_name} failed: {_failure(exc)}") from None
    finally:
        if added and os.getcwd() in sys.path:
            sys.path.remove(os.getcwd())


def _checked_class(found: object, spec: str) -> type[Policy]:
    if not (isinstance(found, type) and issubclass(found, Policy)):
        what = f"a {type(found).__name__}" if not isinstance(found, type) else f"class {found.__name__}"
        raise ValueError(  # noqa: TRY004 - a ValueError is what every caller reports as bad input
            f"policy {spec!r}: {what} is not a subclass of gmlake.policies.Policy")
    return found


def policy_class(base: str) -> type[Policy]:
    """The Policy subclass a spec's base names: a built-in name, an installed plugin's name, `module:Class` or
    `path/to/file.py:Class`. Raises ValueError with one line for anything else."""
    base = base.strip()
    if base in _BUILTIN:
        return _BUILTIN[base]
    if ":" not in base:
        plugins = installed()
        if base in plugins:
            try:
                found = plugins[base].load()
            except Exception as exc:  # noqa: BLE001 - the user's policy code may raise anything
                raise ValueError(f"policy {base!r}: loading entry point {plugins[base].value} failed: "
                                 f"{type(exc).__name__}: {exc}") from None
            return _checked_class(found, base)
        known = ", ".join(names()) + (f"; installed: {', '.join(sorted(plugins))}" if plugins else "")
        raise ValueError(f"unknown policy {base!r}; built-in policies: {known}; or give module:Class or "
                         f"path/to/file.py:Class")
    source, _, attribute = base.rpartition(":")
    if not source or not attribute:
        raise ValueError(f"policy {base!r}: write module:Class or path/to/file.py:Class")
    is_file = source.endswith(".py") or "/" in source or os.sep in source
    module = _load_file(source, base) if is_file else _import_module(source, base)
    found: object = module
    for part in attribute.split("."):
        if not hasattr(found, part):
            where = source if is_file else f"module {source}"
            offered = sorted(n for n, v in vars(module).items()   # those it defines, not those it imports
                             if isinstance(v, type) and issubclass(v, Policy)
                             and v.__module__ == getattr(module, "__name__", None))
            raise ValueError(f"policy {base!r}: {where} has no {attribute!r}"
                             + (f"; its policies: {', '.join(offered)}" if offered else ""))
        found = getattr(found, part)
    return _checked_class(found, base)


def _annotated_not_fields(cls: type) -> set[str]:
    """Names a Policy subclass annotates that are no dataclass field: a class written without @dataclass."""
    known = {f.name for f in fields(cls)}
    return {name for klass in cls.__mro__ if "__dataclass_fields__" not in klass.__dict__
            for name, hint in vars(klass).get("__annotations__", {}).items()
            if name not in known and "ClassVar" not in str(hint)}


def resolve(spec: str, knobs: Mapping[str, object] | None = None,
            granularity: int | None = 2 << 20) -> PolicyChoice:
    """The policy `spec` names (see the module docstring), with `knobs` and then the spec's own inline knobs
    applied (inline wins), constructed and validated for a driver of `granularity` bytes (None: not validated, the
    Allocator validates it for its driver). Knob values may be text
    (parsed by the knob's type: sizes take units) or typed. Every failure is a ValueError of one line that names
    the spec."""
    base, inline = split_spec(spec)
    cls = policy_class(base)
    settings = {**(knobs or {}), **inline}
    try:
        typed = coerce_knobs(cls, settings, who=spec.strip())
    except ValueError as exc:
        text = str(exc)
        undeclared = [name for name in settings if name in _annotated_not_fields(cls)]
        if undeclared:
            text = (f"policy {spec.strip()}: {cls.__name__} declares {', '.join(undeclared)} but is not a "
                    f"@dataclass(frozen=True), so {'it is' if len(undeclared) == 1 else 'they are'} no knob: "
                    f"decorate the class")
        raise ValueError(text if text.startswith("policy ") else f"policy {spec.strip()}: {text}") from None
    try:
        policy = cls(**typed)
    except Exception as exc:  # noqa: BLE001 - the user's policy code may raise anything
        raise ValueError(f"policy {spec!r}: constructing {cls.__name__} failed: {type(exc).__name__}: {exc}") \
            from None
    if granularity is not None:
        try:
            policy.validate(granularity)
        except ValueError as exc:
            # validate() names the policy itself ("gmlake: policy NAME: ..."); say it once, under the spec's name
            text = str(exc).removeprefix("gmlake: ").removeprefix(f"policy {policy.name}: ")
            raise ValueError(f"policy {spec.strip()}: {text}") from None
    return PolicyChoice(spec=spec.strip(), policy=policy)


def split_targeted(settings: Iterable[str]) -> tuple[dict[str, str], dict[str, dict[str, str]]]:
    """`--set` items as (knobs for every policy, {target: knobs for that policy only}). `knob=value` applies to
    every chosen policy; `TARGET.knob=value` only to the policy TARGET names: its spec as given (without inline
    knobs) or its position among the chosen policies, from 1 (gmlake.policies.settings.parse_setting)."""
    everywhere: dict[str, str] = {}
    targeted: dict[str, dict[str, str]] = {}
    for item in settings:
        target, knob, text = parse_setting(item, targeted=True)
        (targeted.setdefault(target, {}) if target else everywhere)[knob] = text
    return everywhere, targeted


def choose(specs: Iterable[str], settings: Iterable[str] = (),
           base_knobs: Mapping[str, object] | Sequence[Mapping[str, object]] | None = None,
           granularity: int | None = 2 << 20) -> list[PolicyChoice]:
    """The policies `specs` name, each with its knobs: `base_knobs` (typed or text; a sequence: one mapping per
    spec), then `settings` for every
    policy (`knob=value`), then those aimed at it (`SPEC.knob=value` or `N.knob=value`, N its position from 1),
    then the spec's own inline knobs `SPEC[knob=value]`: the most specific wins. A knob one of the policies lacks,
    or a target that names none of them, is a ValueError naming it."""
    specs = list(specs)
    everywhere, targeted = split_targeted(settings)
    bases = [split_spec(spec)[0] for spec in specs]
    for target in targeted:
        if target not in specs and target not in bases and not (target.isdigit() and 1 <= int(target) <= len(specs)):
            raise ValueError(f"--set {target}.{next(iter(targeted[target]))}: {target!r} is none of the chosen "
                             f"policies ({', '.join(specs)}); name one as given to --policy, or by its position "
                             f"1..{len(specs)}")
    chosen = []
    for position, (spec, base) in enumerate(zip(specs, bases), start=1):
        base_of = base_knobs[position - 1] if isinstance(base_knobs, Sequence) else base_knobs
        knobs: dict[str, object] = {**(base_of or {}), **everywhere}
        for target in (base, spec.strip(), str(position)):
            knobs.update(targeted.get(target, {}))
        chosen.append(resolve(spec, knobs, granularity))
    return chosen


def choice_of(policy: Policy | str | PolicyChoice) -> PolicyChoice:
    """A PolicyChoice for any way of naming a policy: a spec, a Policy object (its spec is its label) or a choice."""
    if isinstance(policy, PolicyChoice):
        return policy
    if isinstance(policy, str):
        return resolve(policy)
    if isinstance(policy, Policy):
        return PolicyChoice(spec=policy.label(), policy=policy)
    raise TypeError(f"gmlake: a policy is a spec string or a gmlake.policies.Policy, got {type(policy).__name__}")


def get(name: str, **options) -> Policy:
    """The policy a spec names (a built-in name, plugin name, module:Class or file.py:Class), with its knobs
    overridden by `options`; not yet validated (the Allocator validates it for its driver's granularity)."""
    return resolve(name, options, granularity=None).policy
