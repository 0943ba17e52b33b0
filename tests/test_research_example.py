"""examples/research/tlsf.py, the worked research example (docs/policies.md): TLSF's size classes computed as the
paper defines them, and its placement really used by the allocator and by `gmlake replay`."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from gmlake import Allocator, SimDriver

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "research" / "tlsf.py"
MiB = 1 << 20


@pytest.fixture(scope="module")
def tlsf():
    spec = importlib.util.spec_from_file_location("tlsf_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module          # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


def test_size_classes_as_the_paper_defines_them(tlsf):
    policy = tlsf.TLSFPlacement(sl_bits=2)             # 4 classes per power of two
    assert policy.size_class(4 * MiB) == (22, 0)
    assert policy.size_class(5 * MiB - 1) == (22, 0) and policy.size_class(5 * MiB) == (22, 1)
    assert policy.size_class(7 * MiB) == (22, 3) and policy.size_class(8 * MiB) == (23, 0)
    assert policy.round_up_to_class(4 * MiB + 1) == 5 * MiB    # the next class boundary
    assert policy.round_up_to_class(5 * MiB) == 5 * MiB
    assert policy.round_up_to_class(3) == 3                     # below 2**sl_bits bytes every size is its own class


def served_from(policy) -> tuple[bool, int]:
    """Free a 4.5 MiB and a 7 MiB block, then ask for 4.2 MiB: (took the 4.5 MiB block, the block's size)."""
    alloc = Allocator(SimDriver(capacity=1 << 30), policy)
    snug, guard1 = alloc.malloc(int(4.5 * MiB)), alloc.malloc(MiB + 512)
    roomy, guard2 = alloc.malloc(7 * MiB), alloc.malloc(MiB + 512)
    alloc.free(snug)
    alloc.free(roomy)
    got = alloc.malloc(int(4.2 * MiB))
    block = alloc.block_size(got)
    for p in (got, guard1, guard2):
        alloc.free(p)
    alloc.check()
    return got == snug, block


def test_tlsf_skips_a_block_of_the_requests_own_class_that_best_fit_takes(tlsf):
    from gmlake.policies import get

    took_snug, block = served_from(get("gmlake"))
    assert took_snug and block < int(4.5 * MiB)                  # best fit: the snug 4.5 MiB block, split
    took_snug, block = served_from(tlsf.TLSFPlacement(sl_bits=2))
    assert not took_snug and block >= int(4.2 * MiB)             # 4.2 MiB rounds up to 5 MiB's class: 4.5 is out


def test_replay_runs_the_example_from_the_command_line():
    """The example through the CLI, as docs/policies.md runs it (on the small test trace)."""
    proc = subprocess.run([sys.executable, "-m", "gmlake", "replay", "tests/data/tiny-gpt2-native.pickle.gz", "--json",
                           "--policy", "gmlake", "--policy", f"{EXAMPLE.relative_to(ROOT)}:TLSFPlacement[sl_bits=2]"],
                          capture_output=True, check=False, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    ours, theirs = (json.loads(line) for line in proc.stdout.splitlines())
    assert ours["policy"] == "gmlake"
    assert theirs["policy"] == "tlsf(sl_bits=2)" and theirs["knobs"]["sl_bits"] == 2
    assert theirs["policy_class"].endswith("TLSFPlacement") and not theirs["failed"]
    assert theirs["peak_reserved"] >= theirs["peak_allocated"] == ours["peak_allocated"]


def test_the_example_stays_short():
    code = [line for line in EXAMPLE.read_text().splitlines() if line.strip() and not line.strip().startswith("#")]
    assert len(code) <= 100
