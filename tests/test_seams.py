"""Every decision is a policy seam (issue 13): each override is asked on the Python and the replay paths, changes the
outcome, keeps the invariants; a bad answer fails only its request, naming the hook; a thread that holds the GIL
never deadlocks against a hook."""
from __future__ import annotations

import collections
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from conftest import fragment

import gmlake
from gmlake import Allocator, OutOfMemoryError, PolicyError
from gmlake.policies.base import AllocatorState, CachedSBlock, FreeBlock
from gmlake.policies.examples import (
    EvictOnlyWhatFrees,
    LargeSegments,
    SmallestPiecesFirst,
    SyncBeforeReleasing,
    WorstFit,
)
from gmlake.sim.replay import replay
from gmlake.sim.trace import load

MiB = 1 << 20
TINY = "tests/data/tiny-gpt2-native.pickle.gz"
ROOT = Path(__file__).resolve().parent.parent


def claimed(alloc: Allocator) -> set:
    """(segment, offset, bytes) of every block in use through a stitched block."""
    return {(s["serial"], b[0], b[1]) for s in alloc.segments_info() for b in s["blocks"] if b[2] == "claimed"}


@dataclass(frozen=True)
class Counting(gmlake.policies.PaperPolicy):
    """Asks every seam and answers as the built-in would, counting the calls and checking what each hook sees."""

    calls: collections.Counter = field(default_factory=collections.Counter, compare=False)

    def choose_block(self, size, stream, pool, candidates, default, state):
        self.calls["choose_block"] += 1
        assert isinstance(state, AllocatorState) and state.stream == stream
        assert all(c.size >= size for c in candidates)
        assert default is None or 0 <= default < len(candidates)
        return default

    def choose_stitch(self, size, stream, blocks, default, state):
        self.calls["choose_stitch"] += 1
        assert all(isinstance(b, FreeBlock) for b in blocks)
        assert [b.size for b in blocks] == sorted((b.size for b in blocks), reverse=True)
        return default

    def segment_layout(self, size, stream, pool, default, state):
        self.calls["segment_layout"] += 1
        assert default[0] >= size and default[0] % default[1] == 0
        return default

    def evict_victim(self, cached, reason, state):
        self.calls[f"evict_victim:{reason}"] += 1
        assert all(isinstance(c, CachedSBlock) and c.handles > 0 for c in cached)
        return 0

    def relieve_pressure(self, size, stream, pool, attempt, default, state):
        self.calls["relieve_pressure"] += 1
        assert state.limit is None or state.reserved <= state.limit
        return default


# ---------------------------------------------------------------- placement


def test_worst_fit_placement_picks_other_blocks(driver):
    best = Allocator(driver, gmlake.policies.PaperPolicy())
    worst = Allocator(type(driver)(), WorstFit())
    for alloc in (best, worst):
        fragment(alloc, [8, 6, 4])
    a, b = best.malloc(3 * MiB), worst.malloc(3 * MiB)
    layout = {s["serial"]: s["va"] for s in best.segments_info()}
    assert a - layout[5] == 0, "best fit takes the 4 MiB block (segment 5)"
    assert b - {s["serial"]: s["va"] for s in worst.segments_info()}[1] == 0, "worst fit takes the 8 MiB block"
    best.check()
    worst.check()


def test_placement_may_refuse_every_block(driver):
    @dataclass(frozen=True)
    class AlwaysNew(gmlake.policies.PaperPolicy):
        def choose_block(self, size, stream, pool, candidates, default, state):
            return None

    alloc = Allocator(driver, AlwaysNew(stitch=False))
    p = alloc.malloc(4 * MiB)
    alloc.free(p)
    q = alloc.malloc(4 * MiB)
    assert q != p and alloc.stats()["reserved_bytes"] == 8 * MiB
    alloc.check()


def test_placement_sees_cached_sblocks_and_can_take_one(driver):
    @dataclass(frozen=True)
    class PreferSBlocks(gmlake.policies.PaperPolicy):
        seen: list = field(default_factory=list, compare=False)

        def choose_block(self, size, stream, pool, candidates, default, state):
            kinds = [type(c).__name__ for c in candidates]
            self.seen.append(kinds)
            return kinds.index("CachedSBlock") if "CachedSBlock" in kinds else default

    policy = PreferSBlocks(sblock_first=False)
    alloc = Allocator(driver, policy)
    fragment(alloc, [4, 4, 4])
    alloc.free(alloc.malloc(12 * MiB))                  # stitched, then cached
    alloc.malloc(3 * MiB)                               # a free 4 MiB block fits; the policy takes the sBlock
    assert alloc.stats()["sblock_reuses"] == 1
    assert any("CachedSBlock" in kinds and "FreeBlock" in kinds for kinds in policy.seen)
    alloc.check()


# ---------------------------------------------------------------- stitching


def test_smallest_pieces_first_stitches_other_pieces(driver):
    results = []
    for policy in (gmlake.policies.PaperPolicy(), SmallestPiecesFirst()):
        alloc = Allocator(type(driver)(), policy)
        fragment(alloc, [8, 6, 4])
        before, stitches = claimed(alloc), alloc.stats()["stitches"]
        alloc.malloc(10 * MiB)
        assert alloc.stats()["stitches"] == stitches + 1
        results.append(claimed(alloc) - before)
        alloc.check()
    largest_first, smallest_first = results
    assert largest_first != smallest_first
    assert (1, 0, 8 * MiB) in largest_first and not any(seg == 1 for seg, _, _ in smallest_first)


def test_choose_stitch_forces_a_stitch_the_knobs_reject(driver):
    @dataclass(frozen=True)
    class StitchAnyway(gmlake.policies.PaperPolicy):
        def choose_stitch(self, size, stream, blocks, default, state):
            assert default == []                        # stitch=False: the built-in grows
            return list(range(len(blocks)))

    for policy, stitches in ((gmlake.policies.PaperPolicy(stitch=False), 0), (StitchAnyway(stitch=False), 1)):
        alloc = Allocator(type(driver)(), policy)
        fragment(alloc, [4, 4, 4])
        reserved = alloc.stats()["reserved_bytes"]
        alloc.malloc(12 * MiB)
        assert alloc.stats()["stitches"] == stitches
        assert alloc.stats()["reserved_bytes"] == reserved + (0 if stitches else 12 * MiB)
        alloc.check()


def test_choose_stitch_empty_grows_instead(driver):
    @dataclass(frozen=True)
    class NeverStitch(gmlake.policies.GMLakePolicy):
        def choose_stitch(self, size, stream, blocks, default, state):
            return []

    alloc = Allocator(driver, NeverStitch(min_saved_chunks=0))
    guards = [alloc.malloc(30 * MiB) for _ in range(4)]
    for p in guards[::2]:
        alloc.free(p)
    alloc.malloc(50 * MiB)
    assert alloc.stats()["stitches"] == 0
    alloc.check()


# ---------------------------------------------------------------- growth


def test_segment_layout_grows_in_large_segments(driver):
    plain, large = Allocator(driver, gmlake.policies.PaperPolicy()), Allocator(type(driver)(), LargeSegments())
    for alloc in (plain, large):
        alloc.malloc(4 * MiB)
    assert plain.stats()["reserved_bytes"] == 4 * MiB
    assert large.stats()["reserved_bytes"] == 64 * MiB
    assert [s["chunk_size"] for s in large.segments_info()] == [2 * MiB]
    large.malloc(8 * MiB)                               # served from the segment's free rest: no growth
    assert large.stats()["segments_created"] == 1
    large.check()


def test_segment_layout_changes_handle_size_under_the_pytorch_rule(driver):
    @dataclass(frozen=True)
    class HalfHandles(gmlake.policies.CachingPolicy):
        def segment_layout(self, size, stream, pool, default, state):
            return default[0], max(default[1] // 2, 2 * MiB)

    alloc = Allocator(driver, HalfHandles())
    alloc.malloc(40 * MiB)
    (seg,) = alloc.segments_info()
    assert seg["size"] == 40 * MiB and seg["chunk_size"] == 20 * MiB and seg["mapped_chunks"] == 2
    alloc.check()


def test_segment_layout_sets_an_expandable_ranges_pages(driver):
    @dataclass(frozen=True)
    class LargerPages(gmlake.policies.GMLakePolicy):
        def segment_layout(self, size, stream, pool, default, state):
            reserve, page = default
            return (reserve, page) if pool == "small" else (reserve // (2 * page) * 2 * page, 2 * page)

    plain, larger = Allocator(driver, gmlake.policies.GMLakePolicy()), Allocator(type(driver)(), LargerPages())
    for alloc in (plain, larger):
        alloc.malloc(4 * MiB)
    assert plain.stats()["reserved_bytes"] == 20 * MiB and larger.stats()["reserved_bytes"] == 40 * MiB
    (seg,) = larger.segments_info()
    assert seg["chunk_size"] == 40 * MiB
    larger.free(larger.malloc(60 * MiB))                 # grows the range by one more of its pages
    assert larger.stats()["reserved_bytes"] == 80 * MiB
    larger.check()


# ---------------------------------------------------------------- eviction


def cached_sblock_under_pressure(alloc: Allocator) -> None:
    """Stitch and free a 12 MiB sBlock over free blocks of stream 0 (6 MiB of guards stay live), then ask for 18 MiB
    on stream 1 under a 24 MiB cap: only evicting the sBlock and releasing its chunks makes room."""
    fragment(alloc, [4, 4, 4])
    alloc.free(alloc.malloc(12 * MiB))
    assert alloc.stats()["cached_sblocks"] == 1
    alloc.set_limit(24 * MiB)


def test_eviction_under_pressure_asks_the_policy(driver):
    policy = Counting(cross_stream=False)
    alloc = Allocator(driver, policy)
    cached_sblock_under_pressure(alloc)
    alloc.malloc(18 * MiB, 1)
    assert policy.calls["evict_victim:pressure"] == 1 and alloc.stats()["sblock_evictions"] == 1
    alloc.check()


def test_a_declined_eviction_under_pressure_is_honoured(driver):
    @dataclass(frozen=True)
    class KeepSBlocks(gmlake.policies.PaperPolicy):
        reasons: list = field(default_factory=list, compare=False)

        def evict_victim(self, cached, reason, state):
            self.reasons.append(reason)                 # and returns None: declines

    policy = KeepSBlocks(cross_stream=False)
    alloc = Allocator(driver, policy)
    cached_sblock_under_pressure(alloc)
    with pytest.raises(OutOfMemoryError):
        alloc.malloc(18 * MiB, 1)
    assert policy.reasons and set(policy.reasons) == {"pressure"}
    stats = alloc.stats()
    assert stats["cached_sblocks"] == 1 and stats["sblock_evictions"] == 0
    alloc.check()
    alloc.empty_cache()                                 # empty_cache evicts all, without asking
    assert alloc.stats()["cached_sblocks"] == 0 and set(policy.reasons) == {"pressure"}


def test_eviction_example_keeps_sblocks_whose_pieces_are_in_use(driver):
    alloc = Allocator(driver, EvictOnlyWhatFrees(cross_stream=False))
    cached_sblock_under_pressure(alloc)
    alloc.malloc(18 * MiB, 1)                           # the sBlock's pieces are free: evicted, memory found
    assert alloc.stats()["sblock_evictions"] == 1
    alloc.check()


def test_a_declined_eviction_over_the_bound_lets_the_cache_grow(driver):
    @dataclass(frozen=True)
    class NeverEvict(gmlake.policies.PaperPolicy):
        def evict_victim(self, cached, reason, state):   # returns None: declines
            assert reason == "bound" and [c.free for c in cached] == [True]

    alloc = Allocator(driver, NeverEvict(max_cached_sblocks=1))
    for size in (9, 11):                                # each stitches a new sBlock
        parts = [alloc.malloc(4 * MiB) for _ in range(4)]
        for p in parts:
            alloc.free(p)
        alloc.free(alloc.malloc(size * MiB))
    assert alloc.stats()["cached_sblocks"] == 2 and alloc.stats()["sblock_evictions"] == 0
    alloc.check()


# ---------------------------------------------------------------- release under pressure


def small_pool_holds_the_memory(alloc: Allocator) -> None:
    """4 MiB of free small-pool segments and 12 MiB live under a 16 MiB cap: a 4 MiB request needs the small pool's."""
    small = [alloc.malloc(512 * 1024) for _ in range(8)]
    for p in small:
        alloc.free(p)
    alloc.malloc(12 * MiB)
    alloc.set_limit(16 * MiB)


def test_relieve_pressure_orders_the_actions(driver):
    @dataclass(frozen=True)
    class Recording(SyncBeforeReleasing):
        asked: list = field(default_factory=list, compare=False)

        def relieve_pressure(self, size, stream, pool, attempt, default, state):
            self.asked.append((attempt, default, state.reserved))
            return super().relieve_pressure(size, stream, pool, attempt, default, state)

    policy = Recording()
    alloc = Allocator(driver, policy)
    small_pool_holds_the_memory(alloc)
    alloc.malloc(4 * MiB)
    assert policy.asked == [(0, "release_other_pool", 16 * MiB), (1, "release_all", 16 * MiB)]
    alloc.check()


def test_relieve_pressure_giving_up_fails_a_request_the_built_in_serves(driver):
    @dataclass(frozen=True)
    class GiveUp(gmlake.policies.PaperPolicy):
        def relieve_pressure(self, size, stream, pool, attempt, default, state):
            return None

    builtin = Allocator(driver, gmlake.policies.PaperPolicy())
    small_pool_holds_the_memory(builtin)
    builtin.malloc(4 * MiB)
    alloc = Allocator(type(driver)(), GiveUp())
    small_pool_holds_the_memory(alloc)
    with pytest.raises(OutOfMemoryError):
        alloc.malloc(4 * MiB)
    assert alloc.stats()["reserved_bytes"] == 16 * MiB
    alloc.check()


# ---------------------------------------------------------------- the replay path


def test_every_seam_is_asked_on_the_replay_path():
    trace = load(TINY)
    policy = Counting(max_cached_sblocks=2)
    result = replay(trace, policy)
    assert not result.failed
    for hook in ("choose_block", "choose_stitch", "segment_layout", "evict_victim:bound"):
        assert policy.calls[hook] > 0, hook
    # Under a device too small for the trace, the pressure seams are asked too.
    squeezed = Counting(max_cached_sblocks=2)
    small = replay(trace, squeezed, device_memory=result.peak_allocated)
    assert squeezed.calls["relieve_pressure"] > 0 and squeezed.calls["evict_victim:pressure"] > 0
    assert small.stats["sblock_evictions"] > 0


def test_answering_as_the_built_in_changes_nothing():
    trace = load(TINY)
    builtin = replay(trace, gmlake.policies.PaperPolicy(max_cached_sblocks=2))
    asked = replay(trace, Counting(max_cached_sblocks=2))
    for key in ("reserved_bytes", "peak_reserved_bytes", "stitches", "sblock_evictions", "sblock_reuses",
                "segments_created"):
        assert builtin.stats[key] == asked.stats[key], key


def test_a_seam_changes_the_replay():
    trace = load(TINY)
    assert replay(trace, WorstFit()).peak_reserved != replay(trace, gmlake.policies.PaperPolicy()).peak_reserved


# ---------------------------------------------------------------- bad answers


@dataclass(frozen=True)
class BadOnce(gmlake.policies.PaperPolicy):
    """Answers `answer` at the first call of `hook`, then as the built-in would."""

    hook: str = "choose_block"
    answer: object = None
    calls: collections.Counter = field(default_factory=collections.Counter, compare=False)

    def _answer(self, default):
        self.calls[self.hook] += 1
        return self.answer if self.calls[self.hook] == 1 else default

    def choose_block(self, size, stream, pool, candidates, default, state):
        return self._answer(default) if self.hook == "choose_block" else default

    def choose_stitch(self, size, stream, blocks, default, state):
        return self._answer(default) if self.hook == "choose_stitch" else default

    def segment_layout(self, size, stream, pool, default, state):
        return self._answer(default) if self.hook == "segment_layout" else default

    def evict_victim(self, cached, reason, state):
        return self._answer(0) if self.hook == "evict_victim" else 0

    def relieve_pressure(self, size, stream, pool, attempt, default, state):
        return self._answer(default) if self.hook == "relieve_pressure" else default


def ask_choose_block(alloc):
    alloc.malloc(4 * MiB)


def ask_choose_stitch(alloc):
    fragment(alloc, [4, 4, 4])
    alloc.malloc(12 * MiB)


def ask_evict_victim(alloc):
    for size in (9, 11):
        parts = [alloc.malloc(4 * MiB) for _ in range(4)]
        for p in parts:
            alloc.free(p)
        alloc.free(alloc.malloc(size * MiB))


def ask_relieve_pressure(alloc):
    small_pool_holds_the_memory(alloc)
    alloc.malloc(4 * MiB)


@pytest.mark.parametrize("hook, answer, setup", [
    ("choose_block", 10**6, ask_choose_block),
    ("choose_block", "first", ask_choose_block),
    ("choose_block", True, ask_choose_block),
    ("choose_stitch", [0, 0], ask_choose_stitch),
    ("choose_stitch", 3, ask_choose_stitch),
    ("choose_stitch", [99], ask_choose_stitch),
    ("segment_layout", (3 * MiB, 3 * MiB), ask_choose_block),
    ("segment_layout", (MiB, MiB), ask_choose_block),
    ("segment_layout", 4 * MiB, ask_choose_block),
    ("evict_victim", 7, ask_evict_victim),
    ("evict_victim", "oldest", ask_evict_victim),
    ("relieve_pressure", "panic", ask_relieve_pressure),
])
def test_a_bad_answer_fails_its_request_naming_the_hook(driver, hook, answer, setup):
    alloc = Allocator(driver, BadOnce(hook=hook, answer=answer, max_cached_sblocks=1))
    with pytest.raises(PolicyError, match=f"{hook} returned"):
        setup(alloc)
    alloc.check()
    before = alloc.stats()
    p = alloc.malloc(1 * MiB)                           # the allocator stays usable
    alloc.free(p)
    assert alloc.stats()["allocated_bytes"] == before["allocated_bytes"]
    alloc.check()


# ---------------------------------------------------------------- the lock and the GIL


DEADLOCK_SCRIPT = textwrap.dedent("""
    import threading, time
    from dataclasses import dataclass
    import gmlake
    from gmlake import Allocator, SimDriver

    in_hook = threading.Event()

    @dataclass(frozen=True)
    class SlowSplit(gmlake.policies.PaperPolicy):
        def should_split(self, block_size, size, pool, default):
            in_hook.set()
            time.sleep(0.5)        # lets the GIL go mid-hook, the allocator's lock held
            return default

    alloc = Allocator(SimDriver(), SlowSplit())
    alloc.free(alloc.malloc(8 << 20))                     # a free block: the next request splits it
    worker = threading.Thread(target=lambda: alloc.free(alloc.malloc(4 << 20)))
    worker.start()
    in_hook.wait()
    # As torch allocates from Python: the GIL held while waiting for the allocator's lock.
    alloc.free(alloc._malloc_holding_gil(4 << 20))
    worker.join()
    alloc.check()
    print("no deadlock")
""")


def test_a_thread_holding_the_gil_does_not_deadlock_against_a_hook():
    """Before the fix the second call waited for the lock holding the GIL, and the hook waited for the GIL: hung."""
    try:
        proc = subprocess.run([sys.executable, "-c", DEADLOCK_SCRIPT], cwd=ROOT, capture_output=True, check=False,
                              text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("deadlock: a thread holding the GIL waited for the allocator's lock while a hook waited for "
                    "the GIL")
    assert proc.returncode == 0 and "no deadlock" in proc.stdout, proc.stderr


# ---------------------------------------------------------------- the Cython path


def test_a_cython_seam_decides_as_its_python_twin(driver):
    from gmlake.policies.examples import WorstFitInCython

    addresses = []
    for policy in (WorstFit(), WorstFitInCython()):
        alloc = Allocator(type(driver)(), policy)
        fragment(alloc, [8, 6, 4])
        addresses.append(alloc.malloc(3 * MiB) - alloc.segments_info()[0]["va"])
        alloc.check()
    assert addresses == [0, 0]
    assert Allocator(driver, WorstFitInCython()).seams.overridden == 1      # SEAM_PLACE


def test_a_cython_seam_replays_as_its_python_twin():
    from gmlake.policies.examples import WorstFitInCython

    trace = load(TINY)
    python, cython = replay(trace, WorstFit()), replay(trace, WorstFitInCython())
    assert python.stats == cython.stats and python.peak_reserved == cython.peak_reserved
    assert cython.seconds < python.seconds


def test_cython_seams_are_checked():
    from gmlake.policies._seams_example import WorstFitSeams

    @dataclass(frozen=True)
    class Both(WorstFit):
        def cython_seams(self):
            return WorstFitSeams()

    @dataclass(frozen=True)
    class NotSeams(gmlake.policies.PaperPolicy):
        def cython_seams(self):
            return object()

    with pytest.raises(ValueError, match="choose_block both in Python and in its Cython seams"):
        Allocator(gmlake.SimDriver(), Both())
    with pytest.raises(TypeError, match="cython_seams"):
        Allocator(gmlake.SimDriver(), NotSeams())


EXTERNAL_SEAMS = textwrap.dedent("""
    # cython: language_level=3
    from libc.stdint cimport int64_t
    from gmlake.core._allocator cimport Allocator, Failure, Seams, Block, SEAM_SPLIT, SIZE_SMALL

    cdef class NeverSplitLarge(Seams):
        cdef readonly size_t calls

        def __cinit__(self):
            self.overridden = SEAM_SPLIT

        cdef bint split(self, Allocator a, Failure* why, Block* b, size_t size, bint default) noexcept nogil:
            self.calls += 1
            return default if b.seg.size_class == SIZE_SMALL else False
""")

EXTERNAL_BUILD = textwrap.dedent("""
    import sys
    from Cython.Build import cythonize
    from setuptools import Extension, setup
    package = sys.argv[1]        # where gmlake is installed: its .pxd files and _structs.h ship with it
    setup(script_args=["build_ext", "--inplace", "-q"], ext_modules=cythonize(
        [Extension("my_seams", ["my_seams.pyx"], language="c++", extra_compile_args=["-std=c++17", "-O1"],
                   include_dirs=[package])],
        include_path=[str(__import__("pathlib").Path(package).parent)], quiet=True))
""")


def test_a_seam_subclassed_in_an_outside_pyx_is_called_nogil(tmp_path):
    """The researcher's path: a .pyx outside gmlake, built against the .pxd files installed with it."""
    (tmp_path / "my_seams.pyx").write_text(EXTERNAL_SEAMS)
    (tmp_path / "build.py").write_text(EXTERNAL_BUILD)
    package = Path(gmlake.__file__).parent
    proc = subprocess.run([sys.executable, "build.py", str(package)], cwd=tmp_path, capture_output=True, check=False,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    sys.path.insert(0, str(tmp_path))
    try:
        import my_seams
    finally:
        sys.path.remove(str(tmp_path))
    seams = my_seams.NeverSplitLarge()

    @dataclass(frozen=True)
    class Policy(gmlake.policies.PaperPolicy):
        def cython_seams(self):
            return seams

    alloc = Allocator(gmlake.SimDriver(), Policy())
    alloc.free(alloc.malloc(30 * MiB))
    b = alloc.malloc(10 * MiB)
    assert alloc.block_size(b) == 30 * MiB and seams.calls > 0
    alloc.check()


def test_a_raising_hook_is_named_in_the_error(driver):
    @dataclass(frozen=True)
    class Raises(gmlake.policies.PaperPolicy):
        def segment_layout(self, size, stream, pool, default, state):
            raise LookupError("no layout for you")

    alloc = Allocator(driver, Raises())
    with pytest.raises(PolicyError, match=r"^gmlake: policy Raises raised LookupError in segment_layout \(alloc of "
                                          r"4194304 bytes on stream 0\): no layout for you$"):
        alloc.malloc(4 * MiB)
    assert alloc.stats()["allocated_bytes"] == 0
    alloc.check()


def test_state_free_blocks_are_walked_only_when_read_inside_the_hook(driver):
    """AllocatorState.free_blocks: read inside the hook, a plain copy that stays usable; first read after the hook
    returned, it raises instead of walking an allocator that has moved on."""
    seen = []

    class Keeper(gmlake.policies.GMLakePolicy):
        name = "keeper"

        def segment_layout(self, size, stream, pool, default, state):
            if not seen:
                tuple(state.free_blocks)                # read inside the first call only
            seen.append(state)
            return default

    a = Allocator(driver, Keeper())
    a.free(a.malloc(3 * MiB, 0))
    a.malloc(1024, 0)                                   # the small pool's first segment: a second layout call
    read, unread = seen[0], seen[1]
    assert read.free_blocks == ()                       # nothing was free when the first segment was laid out
    with pytest.raises(RuntimeError, match="after its hook returned"):
        list(unread.free_blocks)


def test_state_free_blocks_inside_the_hook_are_the_streams_free_blocks(driver):
    got = []

    class Reader(gmlake.policies.GMLakePolicy):
        name = "reader"

        def should_split(self, block_size, size, pool, default):
            return default

        def choose_block(self, size, stream, pool, candidates, default, state):
            got.append([(b.addr, b.size, b.stream) for b in state.free_blocks])
            return default

    a = Allocator(driver, Reader())
    p, q = a.malloc(8 * MiB, 1), a.malloc(8 * MiB, 1)
    a.free(p)
    got.clear()
    a.malloc(4 * MiB, 1)
    assert got and (p, 8 * MiB, 1) in [tuple(x) for x in got[0]], got
    a.free(q)
