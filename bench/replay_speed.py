"""Replay speed: trace events per second through each built-in policy, over the bundled traces (goal: >= 1 M/s).

    python bench/replay_speed.py [--repeat 3]
"""
from __future__ import annotations

import platform

from gmlake import policies
from gmlake.cli import OneLineParser
from gmlake.replay import bundled_traces, replay
from gmlake.trace import load


def main() -> None:
    parser = OneLineParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"replay speed on {platform.processor() or platform.machine()} (M events/s, best of "
                        f"{args.repeat})")
    table.add_column("trace")
    names = policies.names()
    for name in names:
        table.add_column(name, justify="right")
    total_events, total_seconds = 0, 0.0
    for path in bundled_traces():
        trace = load(path)
        row = [trace.name]
        for name in names:
            best = min((replay(trace, name) for _ in range(args.repeat)), key=lambda r: r.seconds)
            row.append(f"{best.events / best.seconds / 1e6:.1f}")
            total_events += best.events
            total_seconds += best.seconds
        table.add_row(*row)
    console = Console(width=120)
    console.print(table)
    console.print(f"overall: {total_events / total_seconds / 1e6:.2f} M events/s")


if __name__ == "__main__":
    main()
