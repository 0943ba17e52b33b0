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

# The largest device a replay models (4 TiB): a trace that records none is replayed on one this large, and no request
# may ask for more, so no replay maps millions of chunks.
MAX_DEVICE_MEMORY = 4 << 40
