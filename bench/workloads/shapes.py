"""The shape schedules of the dynamic workloads, without torch (bench speed-ab's tests run them on any machine)."""
from __future__ import annotations

import random
from collections.abc import Callable


def draw_schedule(draw: Callable[[random.Random], dict], steps: int, seed: int, pool: int = 0) -> list[dict]:
    """`steps` shapes drawn by `draw` from a generator seeded with `seed` alone. `pool` 0: each drawn afresh.
    `pool` > 0: Note [Warm steps from a pool of shapes] (bench/speed_ab.py): that many distinct shapes drawn first
    (fewer where the shape space holds fewer) and run in that order, then the rest drawn from them, never the same
    shape twice in a row."""
    rng = random.Random(seed)
    if pool <= 0:
        return [draw(rng) for _ in range(steps)]
    shapes: list[dict] = []
    for _ in range(100 * pool):
        shape = draw(rng)
        if shape not in shapes:
            shapes.append(shape)
            if len(shapes) == pool:
                break
    schedule = shapes[:steps]
    while len(schedule) < steps:
        schedule.append(rng.choice([s for s in shapes if s != schedule[-1]] or shapes))
    return schedule
