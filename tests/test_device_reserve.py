"""The device reserve (Note [Leaving the libraries room], gmlake/core/_vmm.pxi): growth that would leave the device fewer
than `device_reserve` free bytes goes through every pressure stage first and takes the reserve only when they made
no room; never under a binding cap. On the models (capacity less live chunks) and through the CUDA driver's
cuMemGetInfo (the stand-in libcuda)."""
from __future__ import annotations

import pytest
from conftest import one_line_exit_2
from test_cuda_build import fake_libcuda, run_gmlake  # noqa: F401  (a fixture)

import gmlake
from gmlake import Allocator, HostDriver, SimDriver

MiB = 1 << 20


def make(driver_name: str, reserve: int, capacity: int = 100 * MiB, limit: int = 0) -> Allocator:
    driver = HostDriver(capacity=capacity) if driver_name == "host" else SimDriver(capacity=capacity)
    alloc = Allocator(driver, gmlake.policies.get("gmlake", device_reserve=reserve), limit=limit)
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
