"""Releasing the pages of memory-mapped sidecar columns a forward scan is done with (no Dagster).

:class:`PageReleaser` keeps a scan's resident set bounded by its chunk: the pages stay in the
page cache but leave the process (``MADV_DONTNEED`` on file-backed mappings only).
"""

from __future__ import annotations

import ctypes
import mmap
from collections.abc import Sequence

import numpy as np

_MADV_DONTNEED = 4
_LIBC = ctypes.CDLL(None, use_errno=True)


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
