"""Atomic file writes: write to a temporary name in the target directory, then ``os.replace``.

A crash at any point leaves either the previous file or nothing, never a half-written file
that a later run would trust.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def atomic_path(final: Path | str, *, fsync: bool = False) -> Iterator[Path]:
    """Yield a temporary path beside ``final``; on success move it into place, else remove it."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
    try:
        yield tmp
        if fsync:
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        os.replace(tmp, final)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise


def atomic_write_bytes(final: Path | str, data: bytes) -> Path:
    """Write ``data`` to ``final`` atomically and return the path."""
    final = Path(final)
    with atomic_path(final) as tmp:
        tmp.write_bytes(data)
    return final


def atomic_write_text(final: Path | str, text: str) -> Path:
    return atomic_write_bytes(final, text.encode())
