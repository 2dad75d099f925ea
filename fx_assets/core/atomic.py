"""Atomic file writes: write to a temporary name in the target directory, then ``os.replace``.

A crash at any point leaves either the previous file or nothing, never a half-written file
that a later run would trust. The previous file stays readable until the new one is renamed
over it. A killed writer's temporary file (``.NAME.tmp-PID-xxxxxxxx``) is removed by the next
build of the same file (:func:`fx_assets.core.locks.remove_orphans`). A full disk raises
``FxDataError`` naming the file being written.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
from collections.abc import Iterator
from pathlib import Path

from fx_assets.core.errors import FxDataError

_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


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
    except BaseException as exc:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        if isinstance(exc, OSError) and exc.errno in _NO_SPACE:
            raise FxDataError(f"{final}: no space left on the device while writing it ({exc})") from exc
        raise


def atomic_write_bytes(final: Path | str, data: bytes) -> Path:
    """Write ``data`` to ``final`` atomically and return the path."""
    final = Path(final)
    with atomic_path(final) as tmp:
        tmp.write_bytes(data)
    return final


def atomic_write_text(final: Path | str, text: str) -> Path:
    return atomic_write_bytes(final, text.encode())
