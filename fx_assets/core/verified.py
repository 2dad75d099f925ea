"""Files verified in full, so that a cache hit does not re-read whole files it already verified.

A cache-hit run reuses every stage table only after it matched the checksums written with it
(``verify_table``) and an fxcache file only after every byte matched its checksums; the asset
checks of the same run read the same files again. :func:`verify_once` remembers a completed
verification together with the file's stat stamp (size, mtime_ns, ctime_ns, inode, device,
:func:`fx_assets.core.source_hash.stat_stamp`) taken before it began:

- in this process (the in-process executor runs all of a run's steps in one process), and
- beside the file, in ``<file>.verified.json`` (the stamp per kind of verification and the
  package source fingerprint), so that a later run in another process skips a full
  verification of the same kind while the stamp is unchanged.

Why a stamp may stand for a verification: the verified files are only ever written whole under
a temporary name and renamed into place (a new inode), and any write to a file moves its ctime,
which ``os.utime`` cannot set back; a copy is a new inode. So a rewrite, a rename over the file,
an in-place edit by a tool, a partial copy or a touch all move the stamp, and the next call
verifies again (and a damaged file fails). This is the trust the raw files' content identity
already rests on (:mod:`fx_assets.core.source_hash`): what a stamp cannot see is a change that
keeps size, mtime, ctime and inode (a raw block-device write, or media decay under a filesystem
that does not checksum its blocks). Any change to the package source verifies every file again
once. A record that is missing, torn, foreign or cannot be written (a read-only data root) only
costs a full verification.

:func:`verify_against_once` is the same for a verification that reads a second file: a sidecar
checked against the raw file it was decoded from (the ``sidecar_matches_source`` check re-hashes
both). It is remembered with the stat stamps of both files and the resolved path of the second,
so a change to either (or a link pointed at another raw file) verifies again; the raw file's
content identity already rests on its stamp (:mod:`fx_assets.core.source_hash`).

:func:`table_identity` / :func:`fxcache_identity` are the content identities of a stage table
and of an fxcache file once their bytes are verified here: the digest of the checksums written
with them (what a recorded check verdict is keyed by).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from fx_assets.core.atomic import atomic_write_text
from fx_assets.core.checksum import hash_buffers
from fx_assets.core.source_hash import stat_stamp

if TYPE_CHECKING:
    from fx_assets.core.fxcache import FxCacheHeader

__all__ = [
    "clear",
    "fxcache_identity",
    "record_path",
    "table_identity",
    "verified_kinds",
    "verify_against_once",
    "verify_once",
    "verify_written_fxcache",
]

_Stamp = tuple[int, ...]
_DONE: dict[tuple[str, str], _Stamp] = {}
_RECORD_VERSION = 1


def _stamp(path: Path) -> _Stamp:
    return tuple(stat_stamp(os.stat(path)).values())


@functools.cache
def _code() -> str:
    """The package source fingerprint (one read of the sources per process, shared with the
    stage versions)."""
    from fx_assets.core.codeversion import package_fingerprint

    return package_fingerprint()


def record_path(path: Path | str) -> Path:
    """Where the verifications of ``path`` that passed are recorded: ``<path>.verified.json``."""
    p = Path(path)
    return p.with_name(p.name + ".verified.json")


def _read_record(p: Path) -> dict[str, list[int]]:
    """{kind: stamp} of the record beside ``p``, for this package source; {} if none holds."""
    try:
        doc = json.loads(record_path(p).read_text())
    except (OSError, ValueError):
        return {}
    if (
        not isinstance(doc, dict)
        or doc.get("version") != _RECORD_VERSION
        or doc.get("name") != p.name
        or doc.get("code") != _code()
        or not isinstance(doc.get("kinds"), dict)
    ):
        return {}
    return {str(k): v for k, v in doc["kinds"].items() if isinstance(v, list)}


def _write_record(p: Path, kind: str | tuple[str, ...], stamp: _Stamp) -> None:
    kinds = {k: v for k, v in _read_record(p).items() if tuple(v) == stamp}  # drop stale stamps
    for k in (kind,) if isinstance(kind, str) else kind:
        kinds[k] = list(stamp)
    doc = {"version": _RECORD_VERSION, "name": p.name, "code": _code(), "kinds": kinds}
    with contextlib.suppress(OSError):  # not recorded: the next process verifies again
        atomic_write_text(record_path(p), json.dumps(doc, sort_keys=True))


def verify_once(
    path: Path | str, kind: str, verify: Callable[[Path], object], *, persist: bool = True
) -> bool:
    """Run ``verify(path)`` unless a verification of this ``kind`` of the unchanged file already
    completed (in this process, or, with ``persist``, in any process with the same package
    source: the record beside the file); True when it ran. ``verify`` raises on a bad file
    (nothing is remembered then)."""
    p = Path(path)
    key = (kind, str(p.resolve()))
    before = _stamp(p)
    if _DONE.get(key) == before:
        return False
    _DONE.pop(key, None)
    if persist and tuple(_read_record(p).get(kind, ())) == before:
        _DONE[key] = before
        return False
    verify(p)
    if _stamp(p) == before:  # the bytes verified are the file that still carries this stamp
        _DONE[key] = before
        if persist:
            _write_record(p, kind, before)
    return True


def verify_against_once(
    path: Path | str,
    source: Path | str,
    kind: str,
    verify: Callable[[Path], object],
    *,
    force: bool = False,
) -> bool:
    """:func:`verify_once` of a verification of ``path`` that also reads ``source`` in full (a
    sidecar against its raw file): skipped while a passed verification of this ``kind`` is
    remembered with the stat stamps of both files as they are now, the same resolved ``source``
    and the same package source. ``force`` verifies whatever is recorded (and records a pass).
    True when it ran; ``verify`` raises on a bad file (nothing is remembered then)."""
    p, src = Path(path), Path(source)
    # The source's resolved path is part of the kind: a sidecar checked against another raw file
    # (a link re-pointed, a data root moved) is another verification.
    kind = f"{kind}:{src.resolve()}"
    key = (kind, str(p.resolve()))
    before = _stamp(p) + _stamp(src)
    if not force:
        if _DONE.get(key) == before:
            return False
        if tuple(_read_record(p).get(kind, ())) == before:
            _DONE[key] = before
            return False
    _DONE.pop(key, None)
    verify(p)
    if _stamp(p) + _stamp(src) == before:  # what was verified still carries these stamps
        _DONE[key] = before
        _write_record(p, kind, before)
    return True


def verified_kinds(path: Path | str) -> set[str]:
    """The kinds of verification that hold for the file as it is now in this process (for tests
    and logs)."""
    p = Path(path)
    try:
        now = _stamp(p)
    except FileNotFoundError:
        return set()
    target = str(p.resolve())
    return {kind for (kind, name), st in _DONE.items() if name == target and st == now}


def clear() -> None:
    """Forget every verification of this process (tests; the records beside files stay)."""
    _DONE.clear()


def table_identity(path: Path | str) -> str:
    """The content identity of a stage table: verified in full (once per stamp, see above),
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


def verify_written_fxcache(path: Path | str, written: FxCacheHeader) -> None:
    """The full verification of an fxcache file just written from memory, by reading it back:
    the file's header must be ``written`` (the one :class:`fx_assets.core.fxcache.FxCacheWriter`
    wrote) and its structure and every region must match that header's checksums
    (:func:`verify_fxcache_bytes`). Recorded as both kinds, ``fxcache-bytes`` and ``fxcache``
    (what :func:`fx_assets.core.fxcache.verify_fxcache` adds: ordered timestamps, finite values,
    OFI present and not all zero), because the writer checked exactly those on the stored
    bytes it hashed into these checksums: bytes that hash the same are those bytes, so the
    values need no second scan. ``FxCacheError`` when the file is not what was written."""
    from fx_assets.core.errors import FxCacheError
    from fx_assets.core.fxcache import HEADER_SIZE

    p = Path(path)
    before = _stamp(p)
    with open(p, "rb") as fh:
        head = fh.read(HEADER_SIZE)
    if head != written.pack():
        raise FxCacheError(f"{p}: the header read back is not the one written; rebuild it")
    verify_fxcache_bytes(p)
    if _stamp(p) == before:  # the bytes verified are the file that still carries this stamp
        key = str(p.resolve())
        kinds = ("fxcache-bytes", "fxcache")
        for kind in kinds:
            _DONE[(kind, key)] = before
        _write_record(p, kinds, before)


def fxcache_identity(path: Path | str) -> str:
    """The content identity of an fxcache file: its bytes verified against its checksums (once
    per stamp, see above), then the digest of its file name and header (which holds every region's
    checksum)."""
    from fx_assets.core.fxcache import HEADER_SIZE

    p = Path(path)
    verify_once(p, "fxcache-bytes", verify_fxcache_bytes)
    with open(p, "rb") as fh:
        head = fh.read(HEADER_SIZE)
    return hash_buffers([p.name.encode(), head])
