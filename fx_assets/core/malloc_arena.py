"""One glibc malloc arena for the whole process (no Dagster, no numpy).

glibc gives each new thread its own arena. The feature stages run their kernels in short-lived
thread pools (OFI chunks, bars). After a Dagster run of a quarter the process held ~110-140 MiB
more anonymous memory than before it, in regions the OFI stage's workers mapped, inside arenas
that ``malloc_info`` reports mostly free, and ``page_release.release_free_heap``
(``malloc_trim``) did not give it back. A process that runs
several partitions in turn (an ``execute_in_process`` loop, the scaling benchmark) carried it
into the next partition and peaked that much higher: 1.10x the quarter alone, 1.035x with one
arena (the benchmarks' README has the runs). With one arena the workers' freed blocks go back
to the heap that the release trims.

Threads then share one lock for ``malloc``; the stages' threads allocate a few arrays per chunk,
not per row, so they barely meet on it (``bench_features`` A/B in the benchmarks' README).
"""

from __future__ import annotations

import ctypes
import os

_M_ARENA_MAX = -8  # glibc's mallopt parameter number (malloc.h)


def use_one_arena() -> bool:
    """Limit glibc to its main arena (``mallopt(M_ARENA_MAX, 1)``) unless ``MALLOC_ARENA_MAX``
    is set in the environment (the user's choice wins). ``False`` where the C library has no
    ``mallopt`` (not glibc) or refused. Call before the process starts worker threads: a thread
    that already has an arena keeps it."""
    if os.environ.get("MALLOC_ARENA_MAX"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (AttributeError, OSError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    return bool(mallopt(_M_ARENA_MAX, 1))
