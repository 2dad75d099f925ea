"""Content identity of raw source files: the whole-file XXH3-128 hash and its stat record.

A raw file is identified by the hash of its whole content (:func:`fx_assets.core.checksum.hash_file`),
not by its size and date. Hashing costs a full read, so the hash is kept in a small record
beside the sidecars (``.{stem}.{tag}.source.json``) together with the stat it was taken at
(size, mtime_ns, ctime_ns, inode, device): a later run reuses the recorded hash while the stat
is unchanged and hashes again as soon as any of it moved. The decoder hashes the bytes it
decodes and records that hash, so a file decoded once is never read a second time for its
identity (:func:`record_hash`).

Trust model: a replacement is noticed whenever it changes the stat (any rewrite moves ctime;
``os.utime`` cannot set ctime back), or on the next full re-verification (asset check). An
in-place edit that preserved size, mtime, ctime and inode would need a raw device write.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from pathlib import Path

from fx_assets.core.atomic import atomic_write_text
from fx_assets.core.checksum import hash_file
from fx_assets.core.errors import FxDataError

__all__ = ["content_hash", "record_hash", "record_path", "recorded_hash", "stat_stamp"]

_RECORD_VERSION = 1


def stat_stamp(st: os.stat_result) -> dict[str, int]:
    """The parts of a stat that change when a file's content is replaced or rewritten."""
    return {
        "size": int(st.st_size),
        "mtime_ns": int(st.st_mtime_ns),
        "ctime_ns": int(st.st_ctime_ns),
        "ino": int(st.st_ino),
        "dev": int(st.st_dev),
    }


def _stem(source: Path) -> str:
    name = source.name
    for suffix in (".dbn.zst", ".dbn"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return source.stem


def path_tag(source: Path | str) -> str:
    """8 hex digits of the absolute path: keeps ``x.dbn`` and ``x.dbn.zst`` apart in one folder."""
    return hashlib.sha256(str(Path(source).resolve()).encode()).hexdigest()[:8]


def record_path(source: Path | str, record_dir: Path | str) -> Path:
    """Where the stat -> hash record of ``source`` lives in ``record_dir``."""
    source = Path(source)
    return Path(record_dir) / f".{_stem(source)}.{path_tag(source)}.source.json"


def recorded_hash(source: Path | str, record_dir: Path | str, st: os.stat_result | None = None) -> str | None:
    """The recorded content hash of ``source`` if the record's stat equals ``st`` (default: now)."""
    source = Path(source)
    if st is None:
        st = os.stat(source)
    try:
        doc = json.loads(record_path(source, record_dir).read_text())
    except (OSError, ValueError):
        return None
    if (
        not isinstance(doc, dict)
        or doc.get("version") != _RECORD_VERSION
        or doc.get("path") != str(source.resolve())
        or doc.get("stat") != stat_stamp(st)
        or not isinstance(doc.get("content_hash"), str)
    ):
        return None
    return str(doc["content_hash"])


def record_hash(source: Path | str, record_dir: Path | str, st: os.stat_result, digest: str) -> None:
    """Record that ``source`` with stat ``st`` has content hash ``digest`` (atomic write)."""
    source = Path(source)
    doc = {
        "version": _RECORD_VERSION,
        "path": str(source.resolve()),
        "stat": stat_stamp(st),
        "content_hash": digest,
    }
    target = record_path(source, record_dir)
    # A read-only record folder only costs a re-hash next time.
    with contextlib.suppress(PermissionError):
        atomic_write_text(target, json.dumps(doc, sort_keys=True))


def content_hash(source: Path | str, record_dir: Path | str | None = None) -> str:
    """The content hash of ``source``: recorded one while the stat is unchanged, else hashed now
    (and recorded when ``record_dir`` is given). FxDataError naming the file if it cannot be read."""
    source = Path(source)
    try:
        st0 = os.stat(source)
        if record_dir is not None:
            known = recorded_hash(source, record_dir, st0)
            if known is not None:
                return known
        digest = hash_file(source)
        st1 = os.stat(source)
    except OSError as exc:
        raise FxDataError(f"{source}: cannot read the source file to hash it: {exc}") from exc
    if stat_stamp(st1) != stat_stamp(st0):
        raise FxDataError(f"{source}: the file changed while it was being hashed")
    if record_dir is not None:
        record_hash(source, record_dir, st0, digest)
    return digest
