"""The built-in policies' rules, and Python policy hooks."""
import itertools

import pytest

import gmlake
from gmlake import Allocator, PolicyError
from gmlake.policies.examples import NoSmallStitches

MiB = 1 << 20
KiB = 1 << 10


def caching(driver, **kw):
    return Allocator(driver, gmlake.policies.get("caching", **kw))


def expandable(driver, **kw):
    return Allocator(driver, gmlake.policies.get("expandable", **kw))


def test_policy_names():
    assert gmlake.policies.names() == ["gmlake", "gmlake-paper", "caching", "expandable"]


# ---------------------------------------------------------------- caching: PyTorch's native allocator


def test_caching_segment_sizes(driver):
    alloc = caching(driver)
    a = alloc.malloc(5 * MiB)                       # 1-10 MiB: a 20 MiB segment
    assert alloc.stats()["reserved_bytes"] == 20 * MiB
    b = alloc.malloc(5 * MiB)                       # fits in its remainder
    assert b == a + 5 * MiB and alloc.stats()["segments_created"] == 1
    c = alloc.malloc(11 * MiB + 1)                  # >= 10 MiB: rounded up to 2 MiB
    assert alloc.stats()["reserved_bytes"] == 20 * MiB + 12 * MiB
    d = alloc.malloc(100 * KiB)                     # small pool: 2 MiB
    assert alloc.stats()["reserved_bytes"] == 34 * MiB
    for p in (a, b, c, d):
        alloc.free(p)
    alloc.check()


def test_caching_keeps_remainders_of_1mib_or_less(driver):
    alloc = caching(driver)
    a = alloc.malloc(19 * MiB + 512 * KiB)          # 20 MiB segment, 512 KiB would remain: not split
    assert alloc.block_size(a) == 20 * MiB
    assert alloc.stats()["allocated_bytes"] == 20 * MiB
    alloc.free(a)
    b = alloc.malloc(18 * MiB)                      # 2 MiB would remain: split
    assert alloc.block_size(b) == 18 * MiB
    alloc.check()


def test_caching_never_reuses_across_streams(driver):
    alloc = caching(driver)
    a = alloc.malloc(30 * MiB, stream=1)
    alloc.free(a)
    b = alloc.malloc(30 * MiB, stream=2)
    assert b != a and alloc.stats()["reserved_bytes"] == 60 * MiB
    alloc.free(b)
    alloc.check()


def test_caching_never_stitches(driver):
    alloc = caching(driver)
    parts = [alloc.malloc(12 * MiB) for _ in range(4)]
    for p in parts:
        alloc.free(p)
    alloc.malloc(40 * MiB)
    assert alloc.stats()["stitches"] == 0
    assert alloc.stats()["reserved_bytes"] == 88 * MiB


def test_caching_releases_free_segments_under_pressure(driver):
    alloc = caching(driver)
    alloc.set_limit(40 * MiB)
    a = alloc.malloc(30 * MiB)
    alloc.free(a)
    b = alloc.malloc(32 * MiB)                      # the free 30 MiB segment must go first
    assert alloc.stats()["reserved_bytes"] == 32 * MiB
    alloc.free(b)
    alloc.check()


def test_caching_max_split_size(driver):
    alloc = caching(driver, max_split_size=64 * MiB)
    big = alloc.malloc(100 * MiB)
    alloc.free(big)
    small = alloc.malloc(20 * MiB)                  # never carved out of an oversize block
    assert not (big <= small < big + 100 * MiB)
    over = alloc.malloc(90 * MiB)                   # an oversize request may round up into it (within 20 MiB)
    assert over == big and alloc.block_size(over) == 100 * MiB
    alloc.check()


# ---------------------------------------------------------------- expandable segments


def test_expandable_grows_one_segment_by_pages(driver):
    alloc = expandable(driver)
    a = alloc.malloc(5 * MiB)
    assert alloc.stats()["reserved_bytes"] == 20 * MiB
    b = alloc.malloc(30 * MiB)                      # 15 MiB free at the end + one more 20 MiB page
    assert b == a + 5 * MiB
    assert alloc.stats()["reserved_bytes"] == 40 * MiB
    assert alloc.stats()["segments_created"] == 1
    alloc.check()
    alloc.free(a)
    alloc.free(b)
    alloc.empty_cache()
    assert alloc.stats()["reserved_bytes"] == 0
    alloc.check()
    alloc.close()
    assert driver.leaks() == {k: 0 for k in driver.leaks()}


def test_expandable_small_pool_uses_2mib_pages(driver):
    alloc = expandable(driver)
    ptrs = [alloc.malloc(600 * KiB) for _ in range(5)]
    assert alloc.stats()["reserved_bytes"] == 4 * MiB
    assert all(q - p == 600 * KiB for p, q in itertools.pairwise(ptrs))
    for p in ptrs:
        alloc.free(p)
    alloc.check()


def test_expandable_packs_at_512_bytes(driver):
    alloc = expandable(driver)
    sizes = [3 * MiB + 1000 * i for i in range(1, 30)]
    ptrs = [alloc.malloc(s) for s in sizes]
    total = sum((s + 511) // 512 * 512 for s in sizes)
    assert alloc.stats()["reserved_bytes"] == -(-total // (20 * MiB)) * 20 * MiB
    for p in ptrs:
        alloc.free(p)
    alloc.check()


def test_expandable_segment_per_stream(driver):
    alloc = expandable(driver)
    alloc.malloc(5 * MiB, stream=1)
    alloc.malloc(5 * MiB, stream=2)
    assert alloc.stats()["segments_created"] == 2
    alloc.check()


def test_expandable_refills_released_pages_first(driver):
    alloc = expandable(driver)
    a = alloc.malloc(40 * MiB)
    b = alloc.malloc(40 * MiB)
    alloc.free(a)
    alloc.empty_cache()                             # a's two pages go back: a hole at the start
    assert alloc.stats()["reserved_bytes"] == 40 * MiB
    c = alloc.malloc(30 * MiB)                      # lowest address with room: the hole
    assert c == a
    alloc.check()
    alloc.free(b)
    alloc.free(c)


# ---------------------------------------------------------------- Python hooks


def test_python_policy_hook_decides_stitching(driver):
    alloc = Allocator(driver, NoSmallStitches(threshold=64 * MiB))
    parts = [alloc.malloc(20 * MiB) for _ in range(4)]
    for p in parts:
        alloc.free(p)
    alloc.malloc(50 * MiB)                          # below the threshold: new memory, no stitch
    assert alloc.stats()["stitches"] == 0
    alloc.malloc(70 * MiB)                          # above it: stitched from the free blocks left
    assert alloc.stats()["stitches"] == 1
    alloc.check()


def test_python_split_hook(driver):
    class NeverSplitLarge(gmlake.policies.PaperPolicy):
        def should_split(self, block_size, size, pool, default):
            return default if pool == "small" else False

    alloc = Allocator(driver, NeverSplitLarge())
    a = alloc.malloc(30 * MiB)
    alloc.free(a)
    b = alloc.malloc(10 * MiB)
    assert alloc.block_size(b) == 30 * MiB
    alloc.check()


def test_hook_that_raises_is_reported_and_undone(driver):
    class Broken(gmlake.policies.PaperPolicy):
        def should_split(self, block_size, size, pool, default):
            raise ZeroDivisionError("boom")

    alloc = Allocator(driver, Broken())
    a = alloc.malloc(30 * MiB)
    alloc.free(a)
    before = alloc.stats()["allocated_bytes"]
    with pytest.raises(PolicyError, match="boom"):
        alloc.malloc(10 * MiB)
    assert alloc.stats()["allocated_bytes"] == before
    alloc.check()


def test_bad_policy_fields_are_refused(driver):
    with pytest.raises(ValueError, match="segment_rule"):
        Allocator(driver, gmlake.policies.get("gmlake", segment_rule="nope"))
    with pytest.raises(ValueError, match="large_split_min"):
        Allocator(driver, gmlake.policies.get("caching", large_split_min=-1))


def test_python_eviction_hook_chooses_the_victim(driver):
    class EvictLargest(gmlake.policies.PaperPolicy):
        def evict_victim(self, cached, reason, state):
            self.seen.append([c.size for c in cached])
            return max(range(len(cached)), key=lambda i: cached[i].size)

    policy = EvictLargest(max_cached_sblocks=2)
    object.__setattr__(policy, "seen", [])
    alloc = Allocator(driver, policy)
    stitched = {}
    for size in (9, 11, 13):                            # each larger than any cached sBlock: a new stitch
        parts = [alloc.malloc(4 * MiB) for _ in range(4)]
        for p in parts:
            alloc.free(p)
        stitched[size] = alloc.malloc(size * MiB)
        alloc.free(stitched[size])
    assert policy.seen, "the hook was not asked"
    assert policy.seen == [[9 * MiB, 11 * MiB]]          # asked once, oldest first
    assert alloc.stats()["sblock_evictions"] == 1
    p = alloc.malloc(9 * MiB)
    assert p == stitched[9], "the 9 MiB sBlock must have survived (LRU would have evicted it, the hook did not)"
    alloc.free(p)
    alloc.check()


def test_knob_settings_parse_to_typed_values_by_one_parser():
    """--set, GMLAKE_KNOBS and a spec's [knob=value] share one parser (gmlake.policies.settings.parse_setting), and the text is
    typed by the knob's declaration: sizes take units, booleans are strict (yes/no too), names stay text."""
    from gmlake.policies.settings import coerce_knobs, parse_setting, split_settings

    texts = split_settings(["chunk_size=4_194_304", "stitch=yes", "cross_stream=True", " min_saved_chunks = 0 ",
                            "segment_rule=chunks", "round_to=-1"])
    knobs = coerce_knobs(gmlake.policies.PaperPolicy, texts)
    assert knobs == {"chunk_size": 4 << 20, "stitch": True, "cross_stream": True, "min_saved_chunks": 0,
                     "segment_rule": "chunks", "round_to": -1}
    assert policies_resolved("gmlake-paper[stitch=yes,chunk_size=4MiB]") == (True, 4 << 20)
    with pytest.raises(ValueError, match="knob stitch must be one of"):
        coerce_knobs(gmlake.policies.PaperPolicy, {"stitch": "maybe"})
    # a count or a percentage takes no unit and no fraction: neither is a size
    assert coerce_knobs(gmlake.policies.GMLakePolicy, {"libraries_half_life": " 1_6 "}) == {"libraries_half_life": 16}
    for name, text in (("libraries_half_life", "1.5"), ("libraries_half_life", "4MiB"), ("restitch_room", "half")):
        with pytest.raises(ValueError, match=rf"knob {name} must be a whole number \((count|percent)\)"):
            coerce_knobs(gmlake.policies.GMLakePolicy, {name: text})
    with pytest.raises(ValueError, match="knob=value"):
        split_settings(["chunk_size"])
    assert parse_setting("a/b.py:C.x = 1", targeted=True) == ("a/b.py:C", "x", "1")
    assert not hasattr(gmlake.policies, "parse_knobs")


def policies_resolved(spec: str) -> tuple[bool, int]:
    policy = gmlake.policies.resolve(spec).policy
    return policy.stitch, policy.chunk_size


@pytest.mark.parametrize(("spec", "meant"), [
    ("gmlake[chunk_size=8MiB]", "expandable_page_large"),
    ("gmlake[chunk_size=1TiB]", "expandable_page_large"),
    ("caching[chunk_size=8MiB]", "large_segment_size"),
    ("gmlake-paper[expandable_page_large=40MiB]", "chunk_size"),
    ("caching[stitch=true]", "stitches"),
    ("expandable[round_large=4MiB,segment_rule=chunks]", "chunk_size"),
])
def test_a_knob_the_policy_does_not_read_is_refused_with_what_was_meant(spec, meant):
    """Issue: gmlake[chunk_size=8MiB] changed nothing under the default policy, whose ranges grow by pages."""
    with pytest.raises(ValueError, match=f"does nothing under segment_rule=.*{meant}"):
        gmlake.policies.resolve(spec)


def test_knobs_the_policy_reads_are_taken_and_listed():
    assert gmlake.policies.resolve("gmlake[expandable_page_large=40MiB]").policy.expandable_page_large == 40 << 20
    assert gmlake.policies.resolve("gmlake[segment_rule=chunks,chunk_size=8MiB]").policy.chunk_size == 8 << 20
    rows = {name: (default, unit) for name, default, unit in gmlake.policies.GMLakePolicy.knob_rows()}
    assert rows["expandable_page_large"] == (20 << 20, "bytes") and rows["min_saved_chunks"] == (3, "count")
    assert "chunk_size" not in rows and "large_segment_size" in rows
    assert "chunk_size" in {r[0] for r in gmlake.policies.PaperPolicy.knob_rows()}


def test_a_policy_object_with_an_unread_knob_is_refused_by_the_allocator(driver):
    with pytest.raises(ValueError, match="chunk_size does nothing"):
        Allocator(driver, gmlake.policies.GMLakePolicy(chunk_size=8 << 20))


def test_unknown_knob_names_the_knobs_there_are():
    with pytest.raises(ValueError, match="no knob 'chunksize'.*chunk_size"):
        gmlake.policies.get("gmlake", chunksize=4 << 20)


def test_environment_knobs_and_their_precedence(monkeypatch):
    from gmlake.torch import options_from_env

    monkeypatch.setenv("GMLAKE_KNOBS", "min_saved_chunks=0, sblock_search_depth=64,chunk_size=8388608")
    monkeypatch.setenv("GMLAKE_CHUNK_SIZE", str(4 << 20))
    opts = options_from_env()
    assert opts == {"min_saved_chunks": 0, "sblock_search_depth": 64, "chunk_size": 4 << 20}


@pytest.mark.parametrize("var, value, message", [("GMLAKE_STITCH", "maybe", "GMLAKE_STITCH must be one of"),
                                                ("GMLAKE_KNOBS", "stitch=perhaps", "knob stitch must be one of"),
                                                ("GMLAKE_KNOBS", "bogus=1", "no knob 'bogus'"),
                                                ("GMLAKE_LIMIT", "lots", "GMLAKE_LIMIT must be a whole number"),
                                                ("GMLAKE_POLICY", "nope", "unknown policy 'nope'")])
def test_environment_settings_parse_strictly(monkeypatch, var, value, message):
    from gmlake.torch import options_from_env

    monkeypatch.setenv(var, value)
    with pytest.raises(ValueError, match=message):
        options_from_env()


def test_environment_sizes_take_units(monkeypatch):
    from gmlake.torch import options_from_env

    monkeypatch.setenv("GMLAKE_LIMIT", "24GiB")
    monkeypatch.setenv("GMLAKE_STITCH", "off")
    assert options_from_env() == {"limit": 24 << 30, "stitch": False}


@pytest.mark.parametrize("setting, message", [("bogus=1", "no knob 'bogus'"),
                                              ("chunk_size=big", "chunk_size must be a whole number"),
                                              ("min_saved_chunks", "knob=value")])
def test_run_refuses_bad_knobs_before_running_anything(tmp_path, capsys, setting, message):
    from gmlake.cli import main

    marker = tmp_path / "ran"
    script = tmp_path / "train.py"
    script.write_text(f"open({str(marker)!r}, 'w').close()\n")
    assert main(["run", "--set", setting, str(script)]) == 2
    assert message in capsys.readouterr().err
    assert not marker.exists()


def test_gmlake_policies_lists_each_policys_knobs_with_defaults_and_units(capsys):
    from gmlake.cli import main

    assert main(["policies"]) == 0
    out = capsys.readouterr().out
    for name in ("gmlake", "gmlake-paper", "caching", "expandable"):
        assert f"{name} (" in out
    assert "expandable_page_large" in out and "20MiB" in out and "bytes" in out
    assert main(["policies", "gmlake-paper"]) == 0
    paper = capsys.readouterr().out
    assert "chunk_size" in paper and "2MiB" in paper and "expandable_page_large" not in paper
    assert main(["policies", "no-such-policy"]) == 2


def test_enable_refuses_a_knob_the_policy_does_not_read_before_installing_anything():
    """README's `enable("gmlake", chunk_size=...)` changed nothing under the default policy; it is refused."""
    pytest.importorskip("torch")
    import gmlake.torch as gt

    with pytest.raises(ValueError, match="chunk_size does nothing under segment_rule=expandable"):
        gt.enable("gmlake", chunk_size=8 << 20)
    assert not gt._enabled
