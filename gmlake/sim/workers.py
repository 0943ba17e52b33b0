"""Work spread over worker processes, for `gmlake tune` and `compare --smallest-cap`, that Ctrl-C ends at once.

Note [Ctrl-C and the worker processes]: Ctrl-C is the parent's alone. The workers are started with SIGINT blocked
and then ignore it, so that none is born with Python's handler (a Ctrl-C from the terminal, which reaches the whole
process group, would have it print a traceback and break the pool); the parent's threads that the pool starts
inherit the block too, so the signal always reaches the thread that handles it. When the parent is interrupted (or
any result raises), it ends the workers itself rather than waiting for the replays they are running: waiting made
Ctrl-C take as long as the slowest replay in flight. It then waits for the pool's manager thread to end: left
running, that thread closes its wake-up pipe while the interpreter's exit hook writes to it, and Python prints an
ignored OSError after the one line.
"""
from __future__ import annotations

import multiprocessing
import os
import signal
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures import process as futures_process
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")

# How long an ended worker gets to go on SIGTERM before it is killed.
_TERMINATE_SECONDS = 1.0


def default_jobs() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:      # not on Linux
        return os.cpu_count() or 1


def _start(initializer: Callable[..., object], initargs: tuple) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    initializer(*initargs)


def _end(pool: ProcessPoolExecutor) -> None:
    """Cancel what has not started and end the workers now."""
    processes = list((getattr(pool, "_processes", None) or {}).values())   # shutdown forgets them
    manager = getattr(pool, "_executor_manager_thread", None)
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        process.terminate()
    for process in processes:
        process.join(_TERMINATE_SECONDS)
        if process.is_alive():
            process.kill()
            process.join()
    if manager is not None:     # it sees the workers gone and ends (Note [Ctrl-C and the worker processes])
        manager.join(_TERMINATE_SECONDS)
        if manager.is_alive():  # never seen; rather than race it at exit, the exit hook forgets it
            getattr(futures_process, "_threads_wakeups", {}).pop(manager, None)


def map_in_processes(func: Callable[[T], R], items: Iterable[T], jobs: int, initializer: Callable[..., object],
                     initargs: tuple = (), on_done: Callable[[R], Any] | None = None) -> list[R]:
    """[func(item) for item in items] on `jobs` worker processes, each set up by initializer(*initargs) first; the
    results in the items' order, on_done(result) called with each as it arrives. Forked where the platform can, so
    that the workers get the initargs (traces, a policy loaded from a file) without pickling. Ctrl-C or a result
    that raises ends every worker at once (Note [Ctrl-C and the worker processes]) and is raised here."""
    items = list(items)
    context = multiprocessing.get_context("fork") if "fork" in multiprocessing.get_all_start_methods() else None
    masked = hasattr(signal, "pthread_sigmask")
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT}) if masked else None
    try:
        pool = ProcessPoolExecutor(jobs, mp_context=context, initializer=_start, initargs=(initializer, initargs))
        try:
            pending = [pool.submit(func, item) for item in items]   # every worker starts here, SIGINT blocked
        except BaseException:
            _end(pool)
            raise
    finally:
        if masked:
            signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)     # a Ctrl-C held back arrives now
    try:
        for future in as_completed(pending):
            result = future.result()        # one that raises ends the rest now, not after the items before it
            if on_done is not None:
                on_done(result)
        results = [future.result() for future in pending]
    except BaseException:
        _end(pool)
        raise
    pool.shutdown(wait=True)
    return results


__all__ = ["default_jobs", "map_in_processes"]
