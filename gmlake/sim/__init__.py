"""Replay and analysis: run a PyTorch memory trace through any policy on a CPU.

    trace.py     PyTorch snapshots and .gmtrace files, the bundled traces
    replay.py    one trace through one policy over the simulator (its event loop: _replay.pyx), priced driver time
    compare.py   every policy on every trace: a table and a plot
    cap.py       the smallest cap, and the smallest device, a trace completes under
    tune.py      which setting suits a trace
    explain.py   where every reserved byte was at the peak
    plots.py     the colours and figures the tools share

Needs the `sim` extra (numpy, matplotlib): pip install 'gmlake[sim]'.
"""
from __future__ import annotations

import importlib.util

_MISSING = [name for name in ("numpy",) if importlib.util.find_spec(name) is None]
if _MISSING:
    raise ImportError(f"gmlake's replay and analysis tools need {', '.join(_MISSING)}: pip install 'gmlake[sim]'",
                      name=_MISSING[0])
