"""The device memory a run holds outside its allocator, sampled while a capture records: CUDA's libraries' kernels,
handles and workspaces, which the libraries take as the run goes on.

Note [Sampling the libraries' memory]: no allocator sees these bytes (the driver serves them to cuBLAS, cuDNN, the
module loader and NCCL directly), yet at the device's edge they decide who fits, and they grow during a run: a
kernel loads the first time a new shape picks it. A capture therefore samples, on a thread of its own, what the
device's used memory (cuMemGetInfo) holds beyond the allocator's reserved bytes, every `interval` seconds, and keeps
the changes: [time_us, bytes] in the snapshot's `gmlake.outside_allocator`, on the clock of the trace's own events
(time_us), so that replay holds the same bytes at the same point of the run (Note [The libraries' memory in
replay], gmlake/core/_driver.pyx). A sample is kept only where the allocator's reserved bytes read the same before
and after the device's free memory (an allocator growing in between would count as outside), and a change only once
two samples in a row agree to within TOLERANCE (one sample can still catch a segment between its mapping and its
count). The bytes are the whole process's outside its allocator, another allocator's in the same process
included; what a replay models is their growth from the first sample, taken once CUDA has started.

Note [The sampler stops before the interpreter does]: the sampler is a daemon thread, and Python ends a daemon
thread that wants the GIL back after finalization began by unwinding it (pthread_exit). Caught inside torch's
mem_get_info, which gives the GIL up around the CUDA call, that unwinding crosses a noexcept destructor and the
process aborts ("terminate called without an active exception") after the program had finished. So an atexit hook
stops the thread while the interpreter still runs; atexit hooks run before finalization, and the samples stay
readable for hooks that run after it (a capture's dump).
"""
from __future__ import annotations

import atexit
import threading
import time
from collections.abc import Callable

TOLERANCE = 1 << 20           # changes smaller than this are noise (the driver's own bookkeeping), not kept
DEFAULT_INTERVAL = 0.005      # seconds between samples: a load is placed within a few ms of the trace's events


class OutsideSampler:
    """Samples device `device`'s memory held outside the allocator whose reserved bytes `reserved()` returns, on a
    daemon thread, until stop(). `samples` holds the kept changes, [time_us, bytes]."""

    def __init__(self, reserved: Callable[[], int], device: int = 0, interval: float = DEFAULT_INTERVAL):
        if not interval > 0:
            raise ValueError(f"interval must be > 0 seconds, got {interval}")
        self.reserved, self.device, self.interval = reserved, device, interval
        self.samples: list[list[int]] = []
        self._candidate: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gmlake-outside-sampler", daemon=True)

    def start(self) -> OutsideSampler:
        self._thread.start()
        return self

    def stop(self) -> list[list[int]]:
        """Stop sampling (after one last sample) and return the kept changes."""
        if self._thread.is_alive():
            self._stop.set()
            self._thread.join()
        return self.samples

    def offer(self, when_us: int, held: int) -> None:
        """Keep `held` at `when_us` where it changed by TOLERANCE or more from the last kept value and the sample
        before agreed with it (Note [Sampling the libraries' memory])."""
        last = self.samples[-1][1] if self.samples else None
        if last is not None and abs(held - last) < TOLERANCE:
            self._candidate = None
            return
        if self.samples and (self._candidate is None or abs(held - self._candidate) >= TOLERANCE):
            self._candidate = held              # wait for a second sample that agrees
            return
        self._candidate = None
        self.samples.append([when_us, held])

    def sample(self) -> None:
        """One sample, kept by offer() where it is trustworthy."""
        # torch is optional: loaded on first use, so import gmlake stays light without it
        import torch

        if not torch.cuda.is_initialized():
            return
        before = self.reserved()
        free, total = torch.cuda.mem_get_info(self.device)
        if self.reserved() != before:
            return
        self.offer(time.time_ns() // 1000, max(0, total - free - before))

    def _run(self) -> None:
        while True:
            stopping = self._stop.wait(self.interval)
            try:
                self.sample()
            except Exception:  # noqa: BLE001 - a sampler must never break the run it watches; it stops instead
                return
            if stopping:
                return


_active: OutsideSampler | None = None


def start(reserved: Callable[[], int], device: int = 0, interval: float = DEFAULT_INTERVAL) -> OutsideSampler:
    """Start (or restart) this process's sampler."""
    global _active
    if _active is not None:
        _active.stop()
    _active = OutsideSampler(reserved, device, interval).start()
    return _active


def samples() -> list[list[int]]:
    """The changes kept so far by this process's sampler ([] where none runs); sampling goes on."""
    return [list(s) for s in _active.samples] if _active is not None else []


@atexit.register
def _halt_at_exit() -> None:
    """Stop the sampling thread, keeping its samples (Note [The sampler stops before the interpreter does])."""
    if _active is not None:
        _active.stop()


def stop() -> list[list[int]]:
    """Stop this process's sampler and return what it kept ([] where none ran)."""
    global _active
    if _active is None:
        return []
    kept, _active = _active.stop(), None
    return kept
