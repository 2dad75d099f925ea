"""Files verified in full in this process, so that one run does not verify the same file twice.

A cache-hit run verifies every stage table in full before reusing it (``verify_table``) and opens
the fxcache with every checksum and value checked; the asset checks of the same run then verify
the same files again. With the in-process executor all of a run's steps share one process, so
:func:`verify_once` remembers a completed verification together with the file's stat stamp
(size, mtime_ns, ctime_ns, inode, device, :func:`fx_assets.core.source_hash.stat_stamp`) taken
before it began, and skips a second verification of the same kind while the stamp is unchanged.
A rewrite, a rename over the file or a touch moves the stamp, and the next call verifies again.
Nothing is kept across processes: every run verifies each file it reads at least once.

:func:`table_identity` / :func:`fxcache_identity` are the content identities of a stage table
and of an fxcache file once their bytes are verified here: the digest of the checksums written
with them (what a recorded check verdict is keyed by).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from fx_assets.core.checksum import hash_buffers
from fx_assets.core.source_hash import stat_stamp

__all__ = ["clear", "fxcache_identity", "table_identity", "verified_kinds", "verify_once"]

_Stamp = tuple[int, ...]
_DONE: dict[tuple[str, str], _Stamp] = {}


def _stamp(path: Path) -> _Stamp:
    return tuple(stat_stamp(os.stat(path)).values())


def verify_once(path: Path | str, kind: str, verify: Callable[[Path], object]) -> bool:
    """Run ``verify(path)`` unless a verification of this ``kind`` of the unchanged file already
    completed in this process; True when it ran. ``verify`` raises on a bad file (nothing is
    remembered then)."""
    p = Path(path)
    key = (kind, str(p.resolve()))
    before = _stamp(p)
    if _DONE.get(key) == before:
        return False
    _DONE.pop(key, None)
    verify(p)
    if _stamp(p) == before:  # the bytes verified are the file that still carries this stamp
        _DONE[key] = before
    return True


def verified_kinds(path: Path | str) -> set[str]:
    """The kinds of verification that hold for the file as it is now (for tests and logs)."""
    p = Path(path)
    try:
        now = _stamp(p)
    except FileNotFoundError:
        return set()
    target = str(p.resolve())
    return {kind for (kind, name), st in _DONE.items() if name == target and st == now}


def clear() -> None:
    """Forget every verification (tests)."""
    _DONE.clear()


def table_identity(path: Path | str) -> str:
    """The content identity of a stage table: verified in full (once per process, see above),
    then the digest of its file name (which carries the cache key) and its per-column checksums."""
    from fx_assets.core.tables import read_table, stored_checksums, verify_table

    p = Path(path)
    verify_once(p, "table", verify_table)
    return hash_buffers([p.name.encode(), stored_checksums(read_table(p))])


def verify_fxcache_bytes(path: Path) -> None:
    """Structure, header and every region's checksum of an fxcache file (the values' finiteness
    is the ``fxcache_valid`` check's: :func:`fx_assets.core.fxcache.verify_fxcache`)."""
    from fx_assets.core.fxcache import open_fxcache

    open_fxcache(path, verify_finite=False, verify_checksums=True).close()


def fxcache_identity(path: Path | str) -> str:
    """The content identity of an fxcache file: its bytes verified against its checksums (once
    per process), then the digest of its file name and header (which holds every region's
    checksum)."""
    from fx_assets.core.fxcache import HEADER_SIZE

    p = Path(path)
    verify_once(p, "fxcache-bytes", verify_fxcache_bytes)
    with open(p, "rb") as fh:
        head = fh.read(HEADER_SIZE)
    return hash_buffers([p.name.encode(), head])
