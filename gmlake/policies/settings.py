"""Typed parsing of command-line settings: byte sizes with units, strict booleans, and policy knobs.

Every parser raises ValueError with a message that names the setting, so the command line can print it as its one
line of error.
"""
from __future__ import annotations

import math
import os
import re
import typing
from collections.abc import Iterable, Mapping
from dataclasses import fields
from fractions import Fraction
from typing import TYPE_CHECKING

from gmlake.policies.knobs import format_knob, knob_units  # noqa: F401 (format_knob: the CLI's)

if TYPE_CHECKING:
    from gmlake.policies import Policy

# Binary units (KiB, K) and decimal ones (KB); matched case-insensitively.
_UNITS = {"": 1, "b": 1}
for _power, _letter in enumerate("kmgtpe", start=1):
    _UNITS[_letter] = _UNITS[_letter + "ib"] = 1 << (10 * _power)
    _UNITS[_letter + "b"] = 1000 ** _power
_SIZE = re.compile(r"\s*([-+]?\d[\d_]*(?:\.\d+)?)\s*([a-z]*)\s*", re.IGNORECASE)

_WHOLE = re.compile(r"\s*[-+]?\d[\d_]*\s*")

TRUE_WORDS = ("true", "1", "yes", "on")
FALSE_WORDS = ("false", "0", "no", "off")


def parse_size(text: str, *, what: str = "size", minimum: int = 0, maximum: int = (1 << 63) - 1,
               round_down: bool = False) -> int:
    """A number of bytes, plain (`81920`) or with a unit: `80GiB`, `80G` (binary), `80GB` (decimal), `1.5GiB`.

    Raises ValueError naming `what` unless the result is in [minimum, maximum] and a whole number of bytes; with
    `round_down` (a device's size, where 5.58GiB means "about that much"), a fraction of a byte is dropped instead.
    Knobs keep the strict rule: a chunk size off by a fraction is a typo, not an approximation.
    """
    match = _SIZE.fullmatch(text) if len(text) <= 64 else None
    if not match or match.group(2).lower() not in _UNITS:
        raise ValueError(f"{what} must be a whole number, optionally with a unit (e.g. 80GiB, 512MiB), "
                         f"got {text!r}")
    value = Fraction(match.group(1).replace("_", "")) * _UNITS[match.group(2).lower()]
    if round_down:
        value = Fraction(math.floor(value))
    if value.denominator != 1:
        raise ValueError(f"{what} {text!r} is not a whole number of bytes")
    if value < minimum:
        raise ValueError(f"{what} must be at least {format_size(minimum)}, got {text!r}")
    if value > maximum:
        raise ValueError(f"{what} must be at most {format_size(maximum)}, got {text!r}")
    return int(value)


def format_size(n: int) -> str:
    """Bytes in the largest binary unit, with at most one decimal: '4 TiB', '1.5 GiB', '512 B'."""
    for unit, scale in (("EiB", 1 << 60), ("PiB", 1 << 50), ("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20),
                        ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f}".removesuffix(".0") + f" {unit}"
    return f"{n} B"


def parse_bool(text: str, *, what: str = "value") -> bool:
    """true/1/yes/on or false/0/no/off, in any case; anything else raises ValueError naming `what`."""
    low = text.strip().lower()
    if low in TRUE_WORDS:
        return True
    if low in FALSE_WORDS:
        return False
    raise ValueError(f"{what} must be one of {'/'.join(TRUE_WORDS)} or {'/'.join(FALSE_WORDS)}, got {text!r}")


def parse_setting(item: str, *, targeted: bool = False) -> tuple[str, str, str]:
    """One `knob=value` setting, the one parser of them (--set, GMLAKE_KNOBS, a spec's [knob=value]), as (target,
    knob, text); the text is typed later, by the knob's declaration (coerce_knobs). With `targeted`, the setting
    may be `TARGET.knob=value`: knob names hold no dot, so the last dot before `=` separates TARGET (a policy spec,
    which may hold dots and colons) from the knob; target is "" otherwise."""
    left, sep, text = item.partition("=")
    target, dot, name = left.strip().rpartition(".") if targeted else ("", "", left.strip())
    if not sep or not name.strip() or (dot and not target.strip()):
        raise ValueError(f"a knob setting is knob=value{' or POLICY.knob=value' if targeted else ''}, got {item!r}")
    return target.strip(), name.strip(), text.strip()


def split_settings(items: Iterable[str]) -> dict[str, str]:
    """'knob=value' strings as {knob: text}; a later setting of a knob wins."""
    out: dict[str, str] = {}
    for item in items:
        _, name, text = parse_setting(item)
        out[name] = text
    return out


KNOBS_VARIABLE = "GMLAKE_KNOBS"


def env_knobs(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The knobs GMLAKE_KNOBS sets (`knob=value,knob=value`) as {knob: text}, for coerce_knobs to type by the policy:
    the one reader of the variable, for `GMLAKE=1`, `gmlake run` and the replay commands alike. A malformed item is
    a ValueError that names the variable."""
    raw = (os.environ if environ is None else environ).get(KNOBS_VARIABLE, "")
    try:
        return split_settings(item for item in raw.split(",") if item.strip())
    except ValueError as exc:
        raise ValueError(f"{KNOBS_VARIABLE}={raw}: {exc}") from None


def knob_types(policy: type[Policy]) -> dict[str, type]:
    """Each knob of a policy class (its dataclass fields) with its type: int, bool, str or float."""
    hints = typing.get_type_hints(policy)
    return {f.name: hints.get(f.name, str) for f in fields(policy)}


def coerce_knobs(policy: type[Policy], settings: Mapping[str, object], who: str | None = None) -> dict:
    """`settings` as typed knobs of `policy`: text is parsed by the knob's type and unit (sizes may carry units,
    counts and percentages take none; booleans are strict), values already typed are checked. Raises ValueError for
    an unknown knob or an ill-typed value; an unknown knob's message names the policy as `who` (default: the
    policy's name)."""
    types = knob_types(policy)
    units = knob_units(policy)
    out = {}
    for name, value in settings.items():
        if name not in types:
            raise ValueError(f"policy {who or policy.name} has no knob {name!r}; its knobs: "
                             f"{', '.join(sorted(types))}")
        want = types[name]
        what = f"knob {name}"
        if want is bool:
            if isinstance(value, str):
                value = parse_bool(value, what=what)
            elif isinstance(value, int) and value in (0, 1):
                value = bool(value)
            else:
                raise ValueError(f"{what} must be true or false, got {value!r}")
        elif want is int:
            if isinstance(value, str) and units.get(name) in ("count", "percent"):
                if not _WHOLE.fullmatch(value):           # a count takes no unit and no fraction
                    raise ValueError(f"{what} must be a whole number ({units[name]}), got {value!r}")
                value = int(value.replace("_", ""))
            elif isinstance(value, str):        # bytes (an int declared with no unit is a count: knob_units)
                value = parse_size(value, what=what, minimum=-(1 << 63))
            elif not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"{what} must be an integer, got {value!r}")
        elif want is float:
            try:
                value = float(value)
            except (TypeError, ValueError):
                raise ValueError(f"{what} must be a number, got {value!r}") from None
        elif want is str and not isinstance(value, str):
            raise ValueError(f"{what} must be a string, got {value!r}")
        out[name] = value
    return out
