"""The device reserve (Note [Leaving the libraries room], gmlake/core/_vmm.pxi): growth that would leave the device less
free than the reserve goes through every pressure stage first and takes the reserve only when they made no room;
never under a binding cap. The reserve is the libraries' largest measured rise (halving after `libraries_half_life`
quiet asks), never less than `device_reserve`. On the models (capacity less live chunks and what is held outside
the allocator) and through the CUDA driver's cuMemGetInfo (the stand-in libcuda)."""
from __future__ import annotations

import pytest
from conftest import one_line_exit_2
from test_cuda_build import fake_libcuda, run_gmlake  # noqa: F401  (a fixture)

import gmlake
from gmlake import Allocator, HostDriver, SimDriver

MiB = 1 << 20


def make(driver_name: str, reserve: int, capacity: int = 100 * MiB, limit: int | None = None, **knobs) -> Allocator:
    driver = HostDriver(capacity=capacity) if driver_name == "host" else SimDriver(capacity=capacity)
    alloc = Allocator(driver, gmlake.policies.get("gmlake", device_reserve=reserve, **knobs), limit=limit)
    alloc.debug_checks = True
    return alloc


def cached_small_pool(alloc: Allocator) -> None:
    """20 MiB of the small pool's pages, all free (cached)."""
    blocks = [alloc.malloc(MiB) for _ in range(20)]
    for p in blocks:
        alloc.free(p)
    assert alloc.stats()["reserved_bytes"] == 20 * MiB


@pytest.mark.parametrize("driver_name", ["sim", "host"])
def test_growth_into_the_reserve_relieves_first_and_takes_it_last(driver_name):
    """A 100 MiB device, a 30 MiB reserve: 60 MiB more would leave 20 MiB free, so the small pool's cached pages go
    back first and the request grows with the reserve intact; 30 MiB more then has no relief left (nothing free,
    no partly used page) and takes the reserve. Without the reserve the first request grows at once, cache kept."""
    plain, kept = make(driver_name, 0), make(driver_name, 30 * MiB)
    for alloc in (plain, kept):
        cached_small_pool(alloc)
        alloc.malloc(60 * MiB)
    assert plain.stats()["reserved_bytes"] == 80 * MiB and plain.stats()["calls"]["synchronize"] == 0
    assert kept.stats()["reserved_bytes"] == 60 * MiB and kept.stats()["calls"]["synchronize"] == 1
    assert kept.driver.live_chunk_bytes == 60 * MiB          # 40 MiB free on the device: the reserve and more
    for alloc in (plain, kept):
        alloc.malloc(30 * MiB)
        assert alloc.stats()["reserved_bytes"] == 100 * MiB and alloc.driver.live_chunk_bytes == 100 * MiB
    # the reserve's request tried release_other_pool and release_all (each after a synchronize) first; re-backing
    # is off by default
    assert kept.stats()["calls"]["synchronize"] == 1 + 2


def test_the_pressure_hook_sees_the_reserve_as_pressure_and_giving_up_takes_it():
    """A policy's relieve_pressure is asked as for any out-of-memory; answering None still serves the request from
    the reserve, since the device has room."""
    asked = []

    class GiveUp(gmlake.policies.get("gmlake").__class__):
        def relieve_pressure(self, size, stream, pool, attempt, default, state):
            asked.append((size, attempt, default))        # and gives up: no answer is None

    alloc = Allocator(SimDriver(capacity=100 * MiB), GiveUp(device_reserve=30 * MiB))
    cached_small_pool(alloc)
    alloc.malloc(60 * MiB)
    assert asked == [(60 * MiB, 0, "release_other_pool")]
    assert alloc.stats()["reserved_bytes"] == 80 * MiB        # nothing released: grown into the reserve


def test_a_binding_cap_is_the_limit_and_the_reserve_is_not_asked():
    """Under a cap below the device's memory the cap is what binds: growth near the device's end is not held back."""
    alloc = make("sim", 30 * MiB, limit=90 * MiB)
    cached_small_pool(alloc)
    alloc.malloc(60 * MiB)
    assert alloc.stats()["reserved_bytes"] == 80 * MiB and alloc.stats()["calls"]["synchronize"] == 0


def test_an_unbounded_model_has_no_reserve_to_keep():
    """A model driver without a capacity reports no bound: the reserve never holds growth back."""
    alloc = make("sim", 30 * MiB, capacity=0)
    cached_small_pool(alloc)
    alloc.malloc(60 * MiB)
    assert alloc.stats()["reserved_bytes"] == 80 * MiB and alloc.stats()["calls"]["synchronize"] == 0
    assert alloc.stats()["libraries_largest_rise_bytes"] == 0 and alloc.stats()["libraries_reserve_bytes"] == 30 * MiB


@pytest.mark.parametrize("driver_name", ["sim", "host"])
def test_the_second_rise_finds_the_room_the_first_one_measured(driver_name):
    """A 200 MiB device, 20 MiB of the small pool cached. A library takes 40 MiB; the next growth measures that rise
    and keeps 40 MiB for the libraries. 90 MiB more (five 20 MiB pages) would leave 20 MiB free, so under the
    measured reserve the cached small pool goes back first (40 MiB stay free) and the library's second 40 MiB
    fits. Under the fixed 8 MiB floor alone (libraries_half_life=0) the request grows with the cache kept, and the
    second rise finds 20 MiB: the library's own call fails there, outside any allocator."""
    measured, fixed = (make(driver_name, 8 * MiB, capacity=200 * MiB, libraries_half_life=h) for h in (16, 0))
    for alloc in (measured, fixed):
        cached_small_pool(alloc)
        assert alloc.driver.set_outside_bytes(40 * MiB)         # a cuBLAS handle and its workspace, say
        alloc.malloc(20 * MiB)                                   # growth asks the device, and sees the rise
        s = alloc.stats()
        assert s["libraries_largest_rise_bytes"] == 40 * MiB and s["libraries_rises"] == 1, s
        alloc.malloc(90 * MiB)
    assert measured.stats()["libraries_reserve_bytes"] == 40 * MiB
    assert fixed.stats()["libraries_reserve_bytes"] == 8 * MiB
    assert measured.stats()["reserved_bytes"] == 120 * MiB       # the small pool given back ...
    assert fixed.stats()["reserved_bytes"] == 140 * MiB          # ... or kept
    assert measured.stats()["libraries_rises"] == 1              # giving memory back is no one's rise
    assert measured.driver.set_outside_bytes(80 * MiB)           # the libraries' second 40 MiB
    assert not fixed.driver.set_outside_bytes(80 * MiB)


def test_the_measured_reserve_halves_after_quiet_asks_down_to_the_floor():
    """After a 64 MiB rise the reserve is 64 MiB; every `libraries_half_life` asks of the device without a rise as
    large halve it (32, 16), and device_reserve (8 MiB) is its floor. A larger rise sets it again at once."""
    alloc = make("sim", 8 * MiB, capacity=8 << 30, libraries_half_life=4)

    def asks() -> int:
        return alloc.stats()["device_asks"]

    def grow_until(n: int) -> None:                  # each large request a new page: growth asks the device
        while asks() < n:
            alloc.malloc(21 * MiB)

    grow_until(1)
    alloc.driver.set_outside_bytes(64 * MiB)
    grow_until(asks() + 1)
    risen = asks()
    seen = []
    for quiet in range(17):
        grow_until(risen + quiet)
        seen.append(alloc.stats()["libraries_reserve_bytes"] // MiB)
    assert seen == [64, 64, 64, 64, 32, 32, 32, 32, 16, 16, 16, 16, 8, 8, 8, 8, 8], seen
    alloc.driver.set_outside_bytes(64 * MiB + 100 * MiB)
    grow_until(asks() + 1)
    assert alloc.stats()["libraries_reserve_bytes"] == 100 * MiB
    assert alloc.stats()["libraries_largest_rise_bytes"] == 100 * MiB


def test_a_bad_reserve_is_one_line():
    line = one_line_exit_2(["-m", "gmlake", "replay", "gpt2l-lora-ckpt-native", "--policy",
                            "gmlake[device_reserve=-1]"])
    assert "device_reserve" in line


def test_the_cuda_driver_asks_the_device_what_is_free(fake_libcuda):  # noqa: F811
    """Through cuMemGetInfo (the stand-in's 80 GiB device): a reserve of all but 100 MiB holds back growth that
    would pass it, so the small pool's cached pages go back first, as on the models."""
    got = run_gmlake("""
        drv = gmlake.cuda_driver(0)
        alloc = Allocator(drv, gmlake.policies.get("gmlake", device_reserve=(80 << 30) - (100 << 20)))
        small = [alloc.malloc(1 << 20) for _ in range(20)]
        for p in small:
            alloc.free(p)
        big = alloc.malloc(90 << 20)
        s = alloc.stats()
        alloc.free(big)
        alloc.empty_cache()
        alloc.close()
        print(json.dumps({"reserved": s["reserved_bytes"], "syncs": s["calls"]["synchronize"],
                          "asked": fake_log().count("cuMemGetInfo"), "leaks": drv.leaks()}))
    """, GMLAKE_LIBCUDA=fake_libcuda)
    assert got["reserved"] == 100 * MiB and got["syncs"] == 1
    assert got["asked"] >= 3 and set(got["leaks"].values()) == {0}
