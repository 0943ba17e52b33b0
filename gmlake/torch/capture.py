"""Record a PyTorch memory snapshot of a real run: `gmlake capture -o run.pickle.gz -- python train.py ...`.

The snapshot is torch's own format (torch.cuda.memory._snapshot()), readable by torch's memory_viz and by
`gmlake replay`, with a `gmlake` entry added that records the peaks the run really reached.
"""
from __future__ import annotations

import atexit
import gzip
import os
import pickle
import runpy
import sys
import warnings
from pathlib import Path

from gmlake.torch import outside

DEFAULT_MAX_ENTRIES = 20_000_000


def torch_cuda_problem(device: bool = False) -> str | None:
    """Why this interpreter's PyTorch cannot record or serve CUDA memory, or None: PyTorch missing, or a build
    without CUDA (a CPU-only torch has no CUDA allocator to record or replace); with `device` (capture records a
    run, which needs one), also a CUDA build that finds no usable device (no NVIDIA driver, no GPU visible)."""
    try:
        # torch is optional: loaded on first use, so import gmlake stays light without it
        import torch
    except ImportError:
        return f"PyTorch is not installed in this Python ({sys.executable})"
    if getattr(torch.version, "cuda", None) is None or not hasattr(torch._C, "_cuda_customAllocator"):
        return f"this PyTorch ({torch.__version__}) has no CUDA (a CPU-only build); install a CUDA build of PyTorch"
    if device:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")         # torch warns that it found no driver; the line below says it
            usable = torch.cuda.is_available() and torch.cuda.device_count() > 0
        if not usable:
            return (f"no usable CUDA device: this PyTorch ({torch.__version__}, CUDA {torch.version.cuda}) finds "
                    f"none (no NVIDIA driver loaded, or CUDA_VISIBLE_DEVICES hides every GPU)")
    return None


def start(max_entries: int = DEFAULT_MAX_ENTRIES) -> None:
    """Start recording every allocator event (no stack traces: they make snapshots large and runs slow), and
    sampling the memory the process holds outside its allocator (Note [Sampling the libraries' memory])."""
    # torch is optional: loaded on first use, so import gmlake stays light without it
    import torch

    torch.cuda.memory._record_memory_history(enabled="all", context=None, stacks="python", max_entries=max_entries)
    outside.start(torch.cuda.memory_reserved, torch.cuda.current_device() if torch.cuda.is_initialized() else 0)


def dump(path: str | Path, name: str | None = None, **extra) -> Path:
    """Write the snapshot, with the run's real peaks, as a gzipped pickle (atomically: a temp file, renamed)."""
    # torch is optional: loaded on first use, so import gmlake stays light without it
    import torch

    path = Path(path)
    torch.cuda.synchronize()
    held_outside = outside.stop()
    snapshot = torch.cuda.memory._snapshot()
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    snapshot["gmlake"] = {
        # Without a name, a reader names the trace after its file (gmlake.sim.trace.snapshot_stem).
        **({"name": name} if name else {}),
        "max_memory_reserved": torch.cuda.max_memory_reserved(),
        "max_memory_allocated": torch.cuda.max_memory_allocated(),
        "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
        "allocator": "expandable" if "expandable_segments:true" in
        os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "").replace(" ", "").lower() else "native",
        "device_name": props.name,
        "device_total": props.total_memory,
        "torch": str(torch.__version__),
        **({"outside_allocator": held_outside} if held_outside else {}),
        **extra,
    }
    tmp = path.with_name(path.name + ".tmp")
    with gzip.open(tmp, "wb") as f:
        pickle.dump(snapshot, f, protocol=pickle.HIGHEST_PROTOCOL)
    tmp.replace(path)
    return path


def run(out: str | Path, argv: list[str], name: str | None = None) -> None:
    """Run a Python program (`script.py args`, `-m module args` or `-c code args`) in this process, recording its
    allocations, and dump the snapshot when it exits."""
    if not argv:
        raise SystemExit("gmlake capture: nothing to run")
    start()
    atexit.register(dump, out, name)
    if argv[0] == "-m":
        if len(argv) < 2:
            raise SystemExit("gmlake capture: -m needs a module name")
        sys.argv = argv[1:]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    elif argv[0] == "-c":
        if len(argv) < 2:
            raise SystemExit("gmlake capture: -c needs the code to run")
        sys.argv = ["-c", *argv[2:]]
        exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__"})  # noqa: S102 - as python -c runs it
    else:
        sys.argv = list(argv)
        sys.path.insert(0, str(Path(argv[0]).resolve().parent))
        runpy.run_path(argv[0], run_name="__main__")


if __name__ == "__main__":
    # python -m gmlake.torch.capture OUT [--name NAME] -- program args...
    problem = torch_cuda_problem(device=True)
    if problem:
        print(f"gmlake: error: gmlake capture: {problem}", file=sys.stderr)
        sys.exit(2)
    args = sys.argv[1:]
    if len(args) < 3 or "--" not in args:
        raise SystemExit("usage: python -m gmlake.torch.capture OUT [--name NAME] -- script.py args...")
    split = args.index("--")
    opts, program = args[:split], args[split + 1 :]
    run_name = None
    if len(opts) == 3 and opts[1] == "--name":
        run_name = opts[2]
    run(opts[0], program, run_name)
