"""gmlake's benchmarks, one tool: `python -m bench COMMAND ...` from the repository root (`python -m bench` lists
the commands). Its results go to bench/results, and `python -m bench report docs` regenerates docs/benchmarks.md's
tables from them."""
from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent      # the repository: bench/ runs from a checkout, not an install
RESULTS = ROOT / "bench" / "results"


def child_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """`env` (default: this process's) with the repository first on PYTHONPATH, so that a child process started
    anywhere runs the workloads as modules of this checkout's bench (`python -m bench.workloads.dynamic`)."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    return env
