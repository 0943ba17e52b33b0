"""What the analysis tools' figures share: matplotlib, loaded on first use, and one colour per policy."""
from __future__ import annotations

from types import ModuleType

# The built-in policies keep these colours in every plot; any other label (a custom policy, or a built-in one with
# changed knobs) takes the next colour of OTHER_COLORMAPS that no built-in uses.
BUILTIN_COLORS = {"gmlake": "tab:green", "caching": "tab:red", "expandable": "tab:blue", "gmlake-paper": "tab:olive"}
OTHER_COLORMAPS = ("tab10", "Dark2", "Set1", "tab20")


def pyplot() -> ModuleType:
    """matplotlib.pyplot with a backend that needs no screen; ImportError naming the extra where it is missing."""
    try:
        import matplotlib
    except ImportError:
        raise ImportError("gmlake's plots need matplotlib: pip install 'gmlake[sim]'", name="matplotlib") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def policy_colors(labels: list[str]) -> dict[str, str]:
    """A colour per policy label: built-ins their fixed colour, the others distinct colours from qualitative
    colormaps (in order of first appearance), never one a built-in has."""
    pyplot()
    from matplotlib import colormaps
    from matplotlib.colors import to_hex

    reserved = {to_hex(c) for c in BUILTIN_COLORS.values()}
    pool: list[str] = []
    for name in OTHER_COLORMAPS:
        for rgba in colormaps[name].colors:
            color = to_hex(rgba)
            if color not in reserved and color not in pool:
                pool.append(color)
    out: dict[str, str] = {}
    others = [label for label in dict.fromkeys(labels) if label not in BUILTIN_COLORS]
    for label in dict.fromkeys(labels):
        if label in BUILTIN_COLORS:
            out[label] = to_hex(BUILTIN_COLORS[label])
    for i, label in enumerate(others):
        out[label] = pool[i % len(pool)]
    return out
