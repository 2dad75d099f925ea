"""Giving memory a process is done with back to the OS (no Dagster).

:class:`PageReleaser` keeps a scan's resident set bounded by its chunk: the pages of
memory-mapped sidecar columns a forward scan is done with stay in the page cache but leave the
process (``MADV_DONTNEED`` on file-backed mappings only). :func:`release_free_heap` hands back
the free memory of the C heap and of Arrow's pool that earlier work in the process left.
"""

from __future__ import annotations

import ctypes
import mmap
from collections.abc import Sequence

import numpy as np
import pyarrow as pa

_MADV_DONTNEED = 4
_LIBC = ctypes.CDLL(None, use_errno=True)
_MALLOC_TRIM = getattr(_LIBC, "malloc_trim", None)  # glibc only


def _file_backed_ranges() -> list[tuple[int, int]]:
    """Address ranges of this process's file-backed mappings (from /proc/self/maps)."""
    out = []
    try:
        with open("/proc/self/maps") as fh:
            for line in fh:
                fields = line.split()
                if len(fields) >= 6 and fields[5].startswith("/"):
                    lo, hi = (int(x, 16) for x in fields[0].split("-"))
                    out.append((lo, hi))
    except OSError:
        return []
    return out


class PageReleaser:
    """Drops the pages of memory-mapped sidecar columns that a forward scan has finished with.

    The pages stay in the page cache (a later read faults them back in), but they leave this
    process's resident set, so scanning a 17 GB book sidecar does not grow the RSS to 17 GB.
    Only arrays that lie wholly inside a file-backed mapping are touched: ``MADV_DONTNEED`` on
    anonymous memory would discard data.
    """

    def __init__(self, columns: Sequence[np.ndarray]) -> None:
        ranges = _file_backed_ranges()
        self.columns = []
        for a in columns:
            if a.size == 0 or not a.flags.c_contiguous:
                continue
            lo = a.ctypes.data
            hi = lo + a.nbytes
            if any(r0 <= lo and hi <= r1 for r0, r1 in ranges):
                self.columns.append(a)
        self.done = 0

    def release_before(self, row: int) -> None:
        """Release rows ``[previous row, row)`` of every column (whole pages inside them only)."""
        if row <= self.done:
            return
        page = mmap.PAGESIZE
        for a in self.columns:
            base, isz = a.ctypes.data, a.itemsize
            start = -(-(base + self.done * isz) // page) * page
            stop = ((base + min(row, a.shape[0]) * isz) // page) * page
            if stop > start:
                _LIBC.madvise(ctypes.c_void_p(start), ctypes.c_size_t(stop - start), _MADV_DONTNEED)
        self.done = row


def release_free_heap() -> bool:
    """Return the free memory of the C heap (glibc ``malloc_trim(0)``) and of Arrow's default
    pool to the OS; ``False`` where the C library has no ``malloc_trim``.

    Why: glibc raises its mmap threshold to the size of each large block freed (up to 32 MiB),
    so once a quarter's arrays are freed, the next quarter's arrays of that size come from the
    heap, and freed heap memory below live blocks stays resident. A process that runs several
    partitions in turn (an ``execute_in_process`` loop, the scaling benchmark) then starts each
    one holding ~250 MiB the previous no longer uses, and peaks that much higher. Call it before
    a run's work (``assets.common.step_partition``), not between its stages: each stage would
    fault the pages back in (a fixed low threshold instead costs every large allocation those
    faults; the benchmarks' README has the figures). Costs milliseconds.
    """
    pa.default_memory_pool().release_unused()
    if _MALLOC_TRIM is None:
        return False
    _MALLOC_TRIM(ctypes.c_size_t(0))
    return True
