"""What a policy declares: its knobs, each declared once with its default, unit, range and the growths that read it;
their checks; and the values the core derives from them (`Knobs.core_knobs`, the one place each derived rule lives).
The hooks a researcher overrides are in base.py."""
from __future__ import annotations

import typing
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from gmlake.policies.growths import GROWTHS, SEGMENT_RULES, SIZING, STITCHING

MiB = 1 << 20


def format_knob(value: object, unit: str = "") -> str:
    """A knob's value as the command line takes it: sizes in a binary unit where whole (8MiB), flags true/false."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if unit == "bytes" and isinstance(value, int) and value:
        for name, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
            if value % scale == 0:
                return f"{value // scale}{name}"
    return str(value)


def knob(default: Any, *, unit: str = "", minimum: int | None = None, granular: bool = False,
         growths: tuple[str, ...] = SEGMENT_RULES) -> Any:
    """A policy knob, declared once: its default, its unit ("bytes", "count" or "" for a flag or a name), the least
    value it takes (1: positive, 0: >= 0), whether it must be a multiple of the driver's granularity, and the
    growths (segment_rule values) whose allocators read it. Validation, the knob listing (`gmlake policies`) and
    the refusal of a knob the chosen growth does not read all come from this declaration; the core copies each knob
    by name into its C struct (Knobs, gmlake/core/_allocator.pxd), which tests/test_growth_table.py holds to these
    declarations, names and types. Which growths stitch and what sizes each come from the table of growths
    (gmlake/policies/growths.py)."""
    return field(default=default, metadata={"unit": unit, "minimum": minimum, "granular": granular,
                                            "growths": growths})


def knob_specs() -> dict[str, dict]:
    """Every knob the core reads, by name, with its declaration (see `knob`)."""
    return {f.name: dict(f.metadata) for f in fields(Knobs)}


def knob_units(cls: type) -> dict[str, str]:
    """The unit of each knob (dataclass field) of a policy class: a core knob's as `knob` declares it (a subclass
    that changes its default drops the field's metadata), a class's own as its `knob(..., unit=...)` says; an int
    declared with no unit is a count (a size says so: `knob(64 << 20, unit="bytes")`); "" for the rest (flags,
    names)."""
    specs = knob_specs()
    hints = typing.get_type_hints(cls)
    units = {}
    for f in fields(cls):
        unit = specs[f.name]["unit"] if f.name in specs else f.metadata.get("unit", "")
        if not unit and hints.get(f.name) is int:
            unit = "count"
        units[f.name] = unit
    return units


@dataclass(frozen=True)
class Knobs:
    """What a policy declares: the knobs the core reads, each declared once (`knob`), with their checks and the values
    the core derives from them (`core_knobs`). Sizes are in bytes.

    Placement:
      segment_rule: how new memory is laid out when no free block fits: the built-in growth strategy, chosen once
        when the Allocator is made (a policy's `cython_growth()` may supply its own instead).
        "chunks": the shortfall of a request in whole `chunk_size` handles, stitched with free blocks (gmlake).
        "pytorch": PyTorch's native rule, one handle per segment: 2 MiB for the small pool, `large_segment_size`
          for requests under `min_large_alloc`, else the request rounded up to `round_large`.
        "expandable": PyTorch's expandable segments: one VA range per stream and pool that grows by mapping pages of
          `expandable_page_small` / `expandable_page_large` bytes; `capped_page_large` (0: the same) for a
          large-pool range made while a cap below the device's memory is set; a coarser range made before the cap
          grows no more while it holds (Note [Finer pages under a cap]).
      edge_page: under "expandable", at the edge of memory (a request that relief is retrying, growth having
        failed), stitch wherever that maps fewer new bytes than growing would (`min_saved_chunks` and
        `restitch_limit` do not apply there), and map a stitch's shortfall in pages of this many bytes, in a range
        of such pages, where whole pages of its range would not fit under the limit (0: the edge stitches by the
        same rules as elsewhere; the default policy: 2 MiB). Never moves or unmaps live memory. Note [Stitching at
        the edge] (gmlake/core/_growth_expandable.pxi).
      tail_page: under "expandable", growth maps the last page a large block only partly covers in pages of this
        many bytes, only as many as the block needs, so the rest of that page stays unmapped instead of being a free
        run inside a page the block's live bytes hold (0: whole pages). A stitch maps such a page's slots, one
        handle each. Note [Fine pages at a block's tail]
        (gmlake/core/_growth_expandable.pxi).
      cut_at_reuse: with `tail_page`, a block a free run serves that would end inside a whole page lying in that run
        has the page remapped in `tail_page` slots first (it synchronizes the device, and maps ten times the
        handles), but only while the run lays out its memory: while the requests since reserved memory last reached
        a new high are at most this many percent of those before (0: never; no built-in policy sets it). Never
        unmaps or moves live memory. Note [Fine pages at reuse] (gmlake/core/_growth_expandable.pxi).
      plan: with `tail_page`, a planner (RunPlanner) decides which tails growth cuts: only those of blocks of at
        least one whole page whose tail needs at most `plan_tail_share` percent of a page; it also counts the run's
        large requests that stitch or grow as plan hits (a size seen there before) or misses, when the plan settles
        and re-plans, and the driver calls made after it settled (Allocator.stats()["plan"]). A policy's
        `cython_planner()` may supply its own planner instead. Note [A plan learned from the run]
        (gmlake/core/_planner.pxi).
      plan_tail_share: with `plan`, the most of a page, in percent, that a cut tail may need (the default policy: 30).
      plan_settle: with `plan`, the plan settles after this many requests in a row stitch or grow with sizes seen
        before, and re-plans after a request larger than any before, or this many unseen sizes once settled.
      reback_slot: under "expandable", as the last pressure stage, re-back each partly used chunk in handles of
        this many bytes, one per slot that holds live bytes (copied through the host, pointers unchanged), giving
        its free slots back to the driver (0: never, every built-in policy). Hazard: while a chunk is re-backed its
        live bytes are unmapped, and a kernel another thread launches on them then faults (the CUDA context is
        lost); only for a process whose work one thread launches. Note [Taking slots back at the edge].
      device_reserve: where no cap binds, new memory that would leave the device fewer free bytes than this is
        taken only after every pressure stage failed to make room, so the CUDA libraries' own later allocations
        (kernels loaded for a new shape, workspaces) still find memory (0: growth takes the device's last byte;
        the default policy keeps 8 MiB). Note [Leaving the libraries room].
      libraries_half_life: the reserve also follows what the libraries took: each time growth asks the device what
        is free it measures how much memory left the process's reach outside the allocator since it last asked,
        keeps the largest such rise as the reserve (device_reserve is its floor), and halves that measured part
        after this many asks without a rise as large (0: device_reserve alone; the default policy: 16). Note
        [Leaving the libraries room].
      stitch: whether to stitch free blocks at all (under "chunks" and "expandable"; "pytorch" never stitches).
      min_stitch_size: requests below this size never stitch; they get new chunks instead.
      min_saved_chunks: a stitch that also needs new chunks must save at least this many of them (1: stitch only
        to save memory now). 0 also stitches a free chunk tail in front of new chunks, which saves nothing at once
        but leaves one tail instead of two: on runs that grow by many tensors of a few chunks (optimizer states),
        tails add up to several percent of reserved memory otherwise. Costs a stitch per growth.
      cross_stream: whether a block freed on one stream may serve another once the first stream's work is done
        (PyTorch keeps every block on its stream).
      cross_stream_wait: with cross_stream, a request no free block of its own stream fits takes the best-fitting
        free block of another stream at once, making its stream wait on the GPU (cuStreamWaitEvent) for the other
        stream's work so far, instead of waiting until an event says that work is done. Memory as if the GPU never
        trailed the CPU, at the price of ordering the two streams. Note [Waiting for another stream's free block].
      cap_counts_request: under a cap (a limit), a request that needs new memory needs room under the cap for all
        of itself, sized as PyTorch's get_allocation_size does, not only for the pages it maps; else memory pressure
        is relieved first (free pages unmapped). PyTorch's alloc_block checks so, also for expandable segments.
        Note [Releasing before the cap binds].
      round_to: requests are rounded up to this many bytes (PyTorch: 512).
      small_size / small_segment_size: requests up to small_size use a small pool of small_segment_size segments,
        never stitched, so small tensors do not fragment the chunks that large ones stitch.
      chunk_size: one physical handle of the large pool under "chunks". Smaller handles stitch more finely; each
        handle a stitch maps costs a cuMemSetAccess (priced per handle), so larger handles stitch cheaper.
    Splitting:
      large_split_min: a large block is split only if more than this would remain (PyTorch native: 1 MiB).
      max_split_size / max_non_split_rounding: PyTorch's oversize-block rules (0: no limit).
    Stitched blocks:
      max_cached_sblocks: sBlocks kept mapped after their allocation is freed, least recently used evicted first.
      sblock_search_depth: how many cached sBlocks a request examines before it gives up on reuse (0: every one
        whose capacity could serve it; the cost stays bounded by `max_cached_sblocks`: Note [Searching the sBlock
        cache], gmlake/core/_sblocks.pxi).
      sblock_first: a cached sBlock that fits more tightly than the best free block serves the request (the
        paper's order). Off, cached sBlocks serve only requests no free block fits: each check costs a lookup per
        piece, so this keeps the search off the common path.
      restitch_limit: where this many cached sBlocks of a request's size (capacity up to 2 MiB more) have pieces that
        other blocks now hold, the request grows instead of stitching again (0: no limit). Note [Stitching a size
        again] (gmlake/core/_sblocks.pxi).
      restitch_room: restitch_limit applies only while the room under the limit (the cap less reserved, or the
        device's free memory) is at least this many percent of the reserved bytes (0: always; the default policy:
        50). Near a limit a size stitches again instead of growing pages that stay partly used. Note [Stitching a
        size again].
      restitch_share: restitch_limit applies only to requests smaller than this many percent of the reserved bytes
        (0: to every request; the default policy: 20): a request that large stitches again instead of growing by a
        fifth of memory at once. Note [Stitching a size again].
    """

    round_to: int = knob(512, unit="bytes", minimum=1)
    small_size: int = knob(1 * MiB, unit="bytes", minimum=1)
    small_segment_size: int = knob(2 * MiB, unit="bytes", minimum=1, granular=True)
    chunk_size: int = knob(2 * MiB, unit="bytes", minimum=1, granular=True, growths=("chunks",))
    segment_rule: str = knob("chunks")
    stitch: bool = knob(True, growths=STITCHING)
    min_stitch_size: int = knob(0, unit="bytes", minimum=0, growths=STITCHING)
    min_saved_chunks: int = knob(1, unit="count", minimum=0, growths=STITCHING)
    cross_stream: bool = knob(True)
    cross_stream_wait: bool = knob(False)
    cap_counts_request: bool = knob(False, growths=("expandable",))
    large_split_min: int = knob(0, unit="bytes", minimum=0)
    max_split_size: int = knob(0, unit="bytes", minimum=0)
    max_non_split_rounding: int = knob(20 * MiB, unit="bytes", minimum=0)
    large_segment_size: int = knob(20 * MiB, unit="bytes", minimum=1, granular=True, growths=("pytorch", "expandable"))
    min_large_alloc: int = knob(10 * MiB, unit="bytes", minimum=1, growths=("pytorch", "expandable"))
    round_large: int = knob(2 * MiB, unit="bytes", minimum=1, granular=True, growths=("pytorch", "expandable"))
    expandable_page_small: int = knob(2 * MiB, unit="bytes", minimum=1, granular=True, growths=("expandable",))
    expandable_page_large: int = knob(20 * MiB, unit="bytes", minimum=1, granular=True, growths=("expandable",))
    capped_page_large: int = knob(0, unit="bytes", minimum=0, granular=True, growths=("expandable",))
    edge_page: int = knob(0, unit="bytes", minimum=0, granular=True, growths=("expandable",))
    expandable_reserve: int = knob(0, unit="bytes", minimum=0, growths=("expandable",))
    tail_page: int = knob(0, unit="bytes", minimum=0, granular=True, growths=("expandable",))
    cut_at_reuse: int = knob(0, unit="percent", minimum=0, growths=("expandable",))
    plan: bool = knob(False, growths=("expandable",))
    plan_tail_share: int = knob(30, unit="percent", minimum=0, growths=("expandable",))
    plan_settle: int = knob(16, unit="count", minimum=1, growths=("expandable",))
    reback_slot: int = knob(0, unit="bytes", minimum=0, granular=True, growths=("expandable",))
    device_reserve: int = knob(0, unit="bytes", minimum=0)
    libraries_half_life: int = knob(0, unit="count", minimum=0)
    max_cached_sblocks: int = knob(4096, unit="count", minimum=0, growths=STITCHING)
    sblock_search_depth: int = knob(0, unit="count", minimum=0, growths=STITCHING)
    sblock_first: bool = knob(True, growths=STITCHING)
    restitch_limit: int = knob(0, unit="count", minimum=0, growths=STITCHING)
    restitch_room: int = knob(0, unit="percent", minimum=0, growths=STITCHING)
    restitch_share: int = knob(0, unit="percent", minimum=0, growths=STITCHING)

    def growth_class(self) -> type:
        """The core's Growth class of the built-in growth `segment_rule` names (the table of growths,
        gmlake/policies/growths.py), which the Allocator makes unless `cython_growth()` supplies one."""
        return GROWTHS[self.segment_rule].cls

    @classmethod
    def brings_own_growth(cls) -> bool:
        """Whether the policy lays out new memory itself (Policy.cython_growth): then it may read any knob."""
        return False

    def core_knobs(self, device_capacity: int) -> dict[str, object]:
        """The knobs as the core reads them (Knobs, gmlake/core/_allocator.pxd), asked once when an Allocator is
        made: each declared knob by name, and the values derived from several knobs or from the device, each rule
        here and nowhere else. `device_capacity` is the driver's memory in bytes (0: no bound)."""
        knobs = {name: getattr(self, name) for name in knob_specs() if name != "segment_rule"}
        knobs["cross_stream_wait"] = self.cross_stream and self.cross_stream_wait
        knobs["capped_page_large"] = self.capped_page_large or self.expandable_page_large
        # A page mapped in parts is cut in one unit, whether growth cut it (tail_page) or re-backing (reback_slot).
        knobs["slot"] = self.reback_slot or self.tail_page
        # An expandable range reserves address space (not memory) for the whole device and an eighth more, so no
        # range runs out before memory does; a model with no bound reserves 1 TiB.
        knobs["expandable_reserve"] = self.expandable_reserve or (
            device_capacity + device_capacity // 8 if device_capacity else 1 << 40)
        return knobs

    # ------------------------------------------------------------------ checks

    def validate(self, granularity: int) -> None:
        """Raise ValueError if the knobs do not suit a driver of this allocation granularity, or one was set that
        the policy's growth does not read (check_knobs)."""
        self.check_knobs()
        for name, spec in knob_specs().items():
            if spec["granular"] and getattr(self, name) % granularity:
                raise ValueError(
                    f"gmlake: policy {self.name}: {name} {format_knob(getattr(self, name), 'bytes')} is not a "
                    f"multiple of the driver's granularity {format_knob(granularity, 'bytes')}")

    def check_knobs(self) -> None:
        """The checks that need no driver: each knob's type and range as declared (`knob`), the rules that tie
        knobs together, and that every knob set away from its class's default is one the chosen growth reads
        (`chunk_size` under an expandable growth changes nothing, so it is refused, naming what sizes new memory
        there). A policy with its own growth (`cython_growth`) may read any knob."""
        for name, spec in knob_specs().items():
            value = getattr(self, name)
            if spec["minimum"] is None:
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < spec["minimum"]:
                what = "a positive int" if spec["minimum"] == 1 else f"an int >= {spec['minimum']}"
                raise ValueError(f"gmlake: policy {self.name}: {name} must be {what}, got {value!r}")
        if self.segment_rule not in SEGMENT_RULES:
            raise ValueError(
                f"gmlake: policy {self.name}: segment_rule must be one of {', '.join(SEGMENT_RULES)}, "
                f"got {self.segment_rule!r}")
        if self.round_to & (self.round_to - 1):
            raise ValueError(f"gmlake: policy {self.name}: round_to must be a power of two, got {self.round_to}")
        if self.small_segment_size < self.small_size:
            raise ValueError(f"gmlake: policy {self.name}: small_segment_size must be at least small_size")
        pages = [p for p in (self.expandable_page_large, self.capped_page_large) if p]
        for name in ("reback_slot", "tail_page"):
            part = getattr(self, name)
            if part and any(p % part for p in pages):
                sizes = ", ".join(f"{page_name} {format_knob(getattr(self, page_name), 'bytes')}"
                                  for page_name in ("expandable_page_large", "capped_page_large")
                                  if getattr(self, page_name))
                raise ValueError(f"gmlake: policy {self.name}: {name} {format_knob(part, 'bytes')} must divide the "
                                 f"large pages it cuts ({sizes})")
        if self.plan and not self.tail_page:
            raise ValueError(f"gmlake: policy {self.name}: plan decides which tails growth cuts into tail_page slots, "
                             f"so it needs tail_page set too (e.g. tail_page=2MiB)")
        if self.cut_at_reuse and not self.tail_page:
            raise ValueError(f"gmlake: policy {self.name}: cut_at_reuse cuts pages into tail_page slots, so it needs "
                             f"tail_page set too (e.g. tail_page=2MiB)")
        if self.reback_slot and self.tail_page and self.reback_slot != self.tail_page:
            raise ValueError(f"gmlake: policy {self.name}: reback_slot {format_knob(self.reback_slot, 'bytes')} and "
                             f"tail_page {format_knob(self.tail_page, 'bytes')} cut pages in one unit, so they must be "
                             "equal where both are set")
        unread = self.unread_knobs()
        if unread:
            name = unread[0]
            growth = self.segment_rule
            if knob_specs()[name]["growths"] == STITCHING:       # a stitching knob (the table of growths says which)
                meant = f"a policy whose segment_rule is {' or '.join(STITCHING)} stitches"
            else:
                meant = f"what sizes new memory there: {', '.join(SIZING[growth])}"
            raise ValueError(f"gmlake: policy {self.name}: knob {name} does nothing under segment_rule={growth} "
                             f"(only under {', '.join(knob_specs()[name]['growths'])}); {meant}")

    def unread_knobs(self) -> list[str]:
        """The knobs set away from this class's defaults that its growth does not read (none where the policy
        brings its own growth)."""
        if self.brings_own_growth():
            return []
        defaults = {f.name: f.default for f in fields(type(self))}
        return [name for name, spec in knob_specs().items()
                if self.segment_rule not in spec["growths"] and getattr(self, name) != defaults[name]]

    @classmethod
    def knob_rows(cls) -> list[tuple[str, object, str]]:
        """(knob, default, unit) of each knob this class's growth reads, then of the class's own knobs: what
        `gmlake policies` lists."""
        rule = next(f.default for f in fields(cls) if f.name == "segment_rule")
        specs = knob_specs()
        units = knob_units(cls)
        rows = []
        for f in fields(cls):
            spec = specs.get(f.name)
            if spec is not None and rule not in spec["growths"] and not cls.brings_own_growth():
                continue
            rows.append((f.name, f.default, units[f.name]))
        return rows

    def knob_values(self) -> dict[str, object]:
        """Every knob of this policy (its dataclass fields) with its value: the full setting a result records."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def label(self) -> str:
        """A short name for tables and plots: the class's own `name` (else its class name) and, in parentheses,
        the knobs that differ from the class's defaults, e.g. `MaxPieces(max_pieces=2)`, sizes with a binary unit
        (`chunk_size=8MiB`). Two policies of one class with different knobs get different labels."""
        units = knob_units(type(self))

        cls = type(self)
        base = cls.__dict__.get("name") or cls.__name__    # an inherited `name` would hide the subclass
        changed = [f"{f.name}={format_knob(getattr(self, f.name), units[f.name])}" for f in fields(self)
                   if f.default is MISSING or getattr(self, f.name) != f.default
                   or type(getattr(self, f.name)) is not type(f.default)]
        return f"{base}({', '.join(changed)})" if changed else base


__all__ = ["GROWTHS", "SEGMENT_RULES", "SIZING", "STITCHING", "Knobs", "MiB", "knob", "knob_specs", "knob_units"]
