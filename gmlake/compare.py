"""Replay traces under several policies side by side: a table, and a plot of memory over time."""
from __future__ import annotations

from pathlib import Path

from gmlake.replay import ReplayResult, replay
from gmlake.trace import Trace

GiB = float(1 << 30)


def run(traces: list[Trace], policies: list, progress: bool = True,
        device_memory: int | None = None) -> list[ReplayResult]:
    """Every trace under every policy (names or Policy objects), with a progress bar on the terminal."""
    from rich.progress import Progress

    results = []
    with Progress(disable=not progress, transient=True) as bar:
        task = bar.add_task("replaying", total=len(traces) * len(policies))
        for trace in traces:
            for policy in policies:
                bar.update(task, description=f"{trace.name} / {getattr(policy, 'name', policy)}")
                results.append(replay(trace, policy, device_memory=device_memory))
                bar.advance(task)
    return results


def table(results: list[ReplayResult], traces: list[Trace]):
    """A rich Table of the results, with each trace's real peak where the trace records it. A failed replay (some
    requests out of memory) shows its out-of-memory count in red, no utilization, and a caption says so."""
    from rich.table import Table
    from rich.text import Text   # names come from untrusted traces: plain text, never rich markup

    real = {t.name: t.meta for t in traces}
    failed = [r for r in results if r.failed]
    caption = None
    if failed:
        caption = (f"[red]FAILED: {len(failed)} of {len(results)} replays ran out of the modelled device's memory "
                   f"(requests OOM); their peaks cover only the requests served[/red]")
    t = Table(title="replay on the sim driver (peaks in GiB; driver time at H200 prices; time lost: driver time x "
                    "the stall factor measured there)", caption=caption)
    for col in ("trace", "captured under", "real reserved", "policy", "OOMs", "allocated", "reserved",
                "utilization", "frag@peak", "stitches", "driver calls", "driver s", "time lost s", "Mevents/s"):
        t.add_column(col, justify="left" if col in ("trace", "policy", "captured under") else "right")
    for r in results:
        meta = real.get(r.trace, {})
        s = r.summary()
        t.add_row(
            Text(r.trace),
            Text(str(meta.get("allocator", "-"))),
            f"{meta['max_memory_reserved'] / GiB:.3f}" if meta.get("max_memory_reserved") else "-",
            Text(r.policy),
            f"[red]{r.ooms}[/red]" if r.failed else "0",
            f"{r.peak_allocated / GiB:.3f}",
            f"{r.peak_reserved / GiB:.3f}",
            "[red]failed[/red]" if r.failed else f"{r.utilization:.4f}",
            "-" if r.failed else f"{r.fragmentation:.4f}",
            str(s["stitches"]),
            str(s["driver_calls"]),
            f"{r.driver_seconds:.3f}",
            f"{r.step_time_lost:.3f}",
            f"{r.events / r.seconds / 1e6:.1f}" if r.seconds else "-",
        )
    return t


def plot(results: list[ReplayResult], traces: list[Trace], out: Path, format: str | None = None) -> Path:
    """One panel per trace: reserved (solid) and allocated (dotted) memory over the trace, per policy, with the
    captured run's own reserved memory where the trace records it. `format`: the image format (default: from the
    file name)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [t.name for t in traces]
    cols = min(2, len(names))
    rows = (len(names) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(7 * cols, 3.6 * rows), squeeze=False)
    colors = {"gmlake": "tab:green", "caching": "tab:red", "expandable": "tab:blue"}
    for ax, trace in zip(axes.flat, traces):
        requests_at = None
        for r in results:
            if r.trace != trace.name:
                continue
            tl = r.timeline
            color = colors.get(r.policy)
            ax.plot(tl["event"], tl["reserved"] / GiB, color=color, label=f"{r.policy} reserved")
            ax.plot(tl["event"], tl["allocated"] / GiB, color=color, linestyle=":", linewidth=1)
            requests_at = tl["event"]
        curve = trace.real_reserved_curve()
        if curve is not None and requests_at is not None:
            # The real curve is indexed by all events; the replay's by request events. Map through the mask.
            import numpy as np

            req_index = np.flatnonzero(trace.events["action"] <= 1)
            ax.plot(np.arange(len(req_index)), curve[req_index] / GiB, color="black", linewidth=0.8,
                    linestyle="--", alpha=0.7, label=f"captured run ({trace.meta.get('allocator', '?')})")
        name = trace.name.replace("$", r"\$")   # an untrusted name, not matplotlib mathtext
        ax.set_title(f"{name}: reserved (solid), allocated (dotted)", fontsize=10)
        ax.set_xlabel("request")
        ax.set_ylabel("GiB")
        ax.legend(fontsize=7, loc="upper left")
    for ax in list(axes.flat)[len(names):]:
        ax.axis("off")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110, format=format)
    plt.close(fig)
    return out
