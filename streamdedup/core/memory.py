"""The process's memory: the C library's calls, where the process has glibc (keep freed memory, or give it back),
and Python's cycle collector paused while a batch makes its many short-lived containers."""

from __future__ import annotations

import gc
import time
from contextlib import contextmanager
from typing import Callable

__all__ = ["libc_function", "keep_freed_memory", "return_freed_memory", "collector_paused", "QuietCollector"]


def libc_function(name: str):
    """A function of the C library the process already has (None if it has no such function)."""
    import ctypes

    return getattr(ctypes.CDLL(None), name, None)


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt parameters (glibc's malloc.h)
PREPARING_HEAP_BYTES = 256 << 20  # freed memory a preparing process keeps for its next batch


def keep_freed_memory() -> None:
    """In a preparing process: keep freed memory for reuse instead of returning it to the system.

    Every numpy step of a batch allocates arrays of megabytes; glibc gives
    such blocks back to the system when freed, so each batch faulted its
    temporaries in again, page by page (measured: 4,400 page faults per
    batch of 2,000 documents; 530 once freed memory is kept).
    The process's memory is bounded by the batch size, so keeping it costs
    nothing that grows. Elsewhere (not glibc): nothing.

    The sharded deployment's signing and vshards processes too: they prepare
    an epoch's records, or make, fetch and read its home messages, megabytes
    each (reading 3 MB messages from a broker: a median of 3.55 ns a byte of
    CPU with freed memory kept, 5.1 without; docs/pages/performance.md).
    """
    mallopt = libc_function("mallopt")
    if mallopt is not None:
        mallopt(_M_MMAP_THRESHOLD, PREPARING_HEAP_BYTES)
        mallopt(_M_TRIM_THRESHOLD, PREPARING_HEAP_BYTES * 2)


def return_freed_memory() -> None:
    """Give memory the process freed back to the system (glibc's ``malloc_trim``; elsewhere nothing).

    glibc keeps freed memory for reuse, so a long-lived process that frees a
    large structure now and then would keep its high-water mark for good.
    """
    trim = libc_function("malloc_trim")
    if trim is not None:
        trim(0)


@contextmanager
def collector_paused():
    """Python's cycle collector off while a batch is decided and committed, on again after.

    A batch makes tens of thousands of short-lived containers (records,
    decisions, rows of table writes), which set the collector off dozens of
    times per batch, and each full pass walks every object the process holds:
    12-15% of the offline loop's time, measured. None of them form cycles;
    refcounting frees them. Pausing is process-wide, for one batch at a time.
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


class QuietCollector:
    """Python's cycle collector for a loop that keeps it paused throughout (``collector_paused`` around the
    loop): run by the loop at its quiet points instead (``now_and_then``).

    Paused only inside each turn, the collector ran at the first allocation after the turn, on every container
    the turn made and kept (an epoch in flight's rows, dicts and lists), and again in the next generation every
    tenth time: in a vshards host, some 80 passes a run of the sharded bench, 1.1 to 1.4 µs a document of the
    host's CPU. Here one pass follows each turn that finished something (epochs committed: their containers are
    freed then, and few others are held), or ten seconds without one (so an idle process collects too); each
    tenth pass takes the next generation as well, each hundredth all three, as the collector's own thresholds
    would (700, 10, 10)."""

    def __init__(self, every_s: float = 10.0, clock: Callable[[], float] = time.monotonic):
        self.every_s, self.clock = every_s, clock
        self.passes = 0
        self._last = clock()

    def now_and_then(self, finished: bool) -> int:
        """A pass if ``finished`` or ``every_s`` went by since the last; the generation collected (-1: none)."""
        if not finished and self.clock() - self._last < self.every_s:
            return -1
        self.passes += 1
        generation = 2 if self.passes % 100 == 0 else 1 if self.passes % 10 == 0 else 0
        gc.collect(generation)
        self._last = self.clock()
        return generation
